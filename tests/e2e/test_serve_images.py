"""End-to-end tests of image input in `qwen35 serve`, request side, through
the official openai client: images as data: URLs, http(s) URLs from a local
server on loopback (allowed and refused domains, redirects, failures,
time-outs, sizes), file:// URLs inside and outside --allowed-local-media-path,
--limit-mm-per-prompt, and every refusal with its 400 naming the part.

A valid image request is answered (its images fetched, decoded, processed,
then encoded by the tiny model's vision tower; what the answers hold is
checked against transformers in test_serve_vision.py); /tokenize and usage
show what the prompt holds: each image's placeholder widened to its merged
patch count. The model is the tiny random one with a byte-level
tokenizer (serve_util.make_text_model) and a preprocessor_config.json that
keeps the images small (256 to 4096 pixels, patch 4, merge 2: 64 pixels a
token)."""

import base64
import http.server
import json
import math
import os
import shutil
import socket
import sys
import threading
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from serve_util import MODELS, ROOT, Server, make_text_model  # noqa: E402

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.skipif(not (MODELS / "tiny-a" / "config.json").exists(), reason="tiny test models missing")

IMAGES = ROOT / "tests" / "data" / "images"
JPEG = (IMAGES / "rgb_37x53.jpg").read_bytes()
PNG = (IMAGES / "rgba_64x40.png").read_bytes()
PREPROCESSOR = {"size": {"shortest_edge": 256, "longest_edge": 4096}, "patch_size": 4, "temporal_patch_size": 2,
                "merge_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
BIG = 33 << 20  # over the 32 MiB an image may have


def smart_resize(h, w, factor=8, min_pixels=256, max_pixels=4096):
    """transformers' smart_resize, for the expected token counts."""
    hb, wb = round(h / factor) * factor, round(w / factor) * factor
    if hb * wb > max_pixels:
        beta = math.sqrt(h * w / max_pixels)
        hb, wb = max(factor, math.floor(h / beta / factor) * factor), max(factor, math.floor(w / beta / factor) * factor)
    elif hb * wb < min_pixels:
        beta = math.sqrt(min_pixels / (h * w))
        hb, wb = math.ceil(h * beta / factor) * factor, math.ceil(w * beta / factor) * factor
    return hb, wb


def image_tokens(h, w):
    hb, wb = smart_resize(h, w)
    return hb * wb // 64


def data_url(raw, mime="image/jpeg"):
    return f"data:{mime};base64," + base64.b64encode(raw).decode()


def image_part(url):
    return {"type": "image_url", "image_url": {"url": url}}


def user(*parts):
    return [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, *parts]}]


class Images(http.server.BaseHTTPRequestHandler):
    """The loopback image server: /img.jpg, redirects, failures."""

    def log_message(self, *args):
        pass

    def do_GET(self):
        port = self.server.server_address[1]
        if self.path == "/img.jpg":
            return self._send(200, JPEG)
        if self.path == "/redirect-ok":
            return self._redirect(f"http://127.0.0.1:{port}/img.jpg")
        if self.path == "/redirect-out":
            return self._redirect(f"http://localhost:{port}/img.jpg")
        if self.path == "/redirect-file":
            return self._redirect("file:///etc/passwd")
        if self.path == "/redirect-loop":
            return self._redirect("/redirect-loop")
        if self.path == "/notimage":
            return self._send(200, b"<html>not an image</html>")
        if self.path == "/slow":
            time.sleep(3)
            return self._send(200, JPEG)
        if self.path == "/big":
            self.send_response(200)
            self.send_header("Content-Length", str(BIG))
            self.end_headers()
            chunk = b"\0" * (1 << 20)
            try:
                for _ in range(BIG >> 20):
                    self.wfile.write(chunk)
            except OSError:
                pass
            return None
        return self._send(404, b"no")

    def _send(self, code, body):
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except OSError:
            pass

    def _redirect(self, where):
        self.send_response(302)
        self.send_header("Location", where)
        self.send_header("Content-Length", "0")
        self.end_headers()


@pytest.fixture(scope="module")
def origin():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Images)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = make_text_model(tmp_path_factory.mktemp("vision"))
    (d / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
    # the tower places images at the tokenizer's <|image_pad|> (the checkpoint's id is the real vocabulary's)
    added = json.loads((d / "tokenizer.json").read_text())["added_tokens"]
    cfg = json.loads((d / "config.json").read_text())
    cfg["image_token_id"] = next(t["id"] for t in added if t["content"] == "<|image_pad|>")
    (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    """The allowed directory (an image, a symlink out of it) and a file outside it."""
    base = tmp_path_factory.mktemp("media")
    allowed = base / "allowed"
    allowed.mkdir()
    (allowed / "in.jpg").write_bytes(JPEG)
    (base / "out.jpg").write_bytes(JPEG)
    (allowed / "escape.jpg").symlink_to(base / "out.jpg")
    return allowed


@pytest.fixture(scope="module")
def srv(model, media):
    env_proxy = {k: os.environ.pop(k) for k in list(os.environ) if k.lower() in ("http_proxy", "https_proxy", "all_proxy")}
    with Server(model, "--allowed-media-domains", "127.0.0.1", "--allowed-local-media-path", str(media),
                "--limit-mm-per-prompt", '{"image": 2, "video": 0}', "--media-fetch-timeout", "1") as s:
        yield s
    os.environ.update(env_proxy)


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def refused(client, messages, status=400, **kw):
    """The error of a chat request that must fail: (status, message, param)."""
    with pytest.raises(openai.APIStatusError) as e:
        client.chat.completions.create(model="Qwen/Qwen3.5-9B", messages=messages, max_tokens=4, **kw)
    err = e.value.body if isinstance(e.value.body, dict) else {}
    assert e.value.status_code == status, (e.value.status_code, err)
    return err.get("message", ""), err.get("param")


def answered(client, messages, **kw):
    """A valid image request: answered; its usage (the last chunk's, streamed)."""
    if kw.get("stream"):
        kw["stream_options"] = {"include_usage": True}
    r = client.chat.completions.create(model="Qwen/Qwen3.5-9B", messages=messages, max_tokens=4, **kw)
    if not kw.get("stream"):
        assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens >= 1, r
        return r.usage
    chunks = list(r)
    assert any(c.choices and c.choices[0].finish_reason in ("stop", "length") for c in chunks), chunks
    return chunks[-1].usage


def count(srv, messages):
    status, r = srv.post("/tokenize", {"messages": messages})
    assert status == 200, r
    return r["count"]


def test_a_data_url_image_is_processed_and_counted_as_its_merged_patches(srv, client):
    text_only = count(srv, [{"role": "user", "content": [{"type": "text", "text": "What is this?"}]}])
    one = user(image_part(data_url(JPEG)))
    n = image_tokens(53, 37)
    # the template's <|vision_start|><|image_pad|><|vision_end|>, the pad widened to n
    assert count(srv, one) == text_only + 2 + n
    assert answered(client, one).prompt_tokens == text_only + 2 + n
    # the bare-string form and detail, and two images in one message
    two = user({"type": "image_url", "image_url": data_url(PNG, "image/png")},
               {"type": "image_url", "image_url": {"url": data_url(JPEG), "detail": "high"}})
    assert count(srv, two) == text_only + 4 + image_tokens(40, 64) + n
    assert answered(client, two).prompt_tokens == text_only + 4 + image_tokens(40, 64) + n
    assert answered(client, one, stream=True).prompt_tokens == text_only + 2 + n


def test_line_wrapped_and_unpadded_base64_is_taken(srv):
    b64 = base64.encodebytes(JPEG).decode().rstrip("=\n")  # MIME lines, no padding
    assert count(srv, user(image_part("data:image/jpeg;base64," + b64))) == count(srv, user(image_part(data_url(JPEG))))


def test_bad_images_are_refused_naming_the_part(client):
    cases = [
        (data_url(JPEG)[:40] + "!" + data_url(JPEG)[41:], "bad base64 in the data: URL: invalid base64 character '!'"),
        ("data:image/png," + "iVBORw0KGgo=", "only base64 data: URLs are supported"),
        ("data:text/plain;base64,aGVsbG8=", "is not an image type"),
        (data_url(b"BM" + b"\0" * 60, "image/bmp"), "unsupported format"),
        (data_url(JPEG[: len(JPEG) // 2]), "JPEG"),
        (data_url((IMAGES / "bomb_60000x60000.png").read_bytes(), "image/png"), "over"),
        ("ftp://127.0.0.1/a.jpg", "must be an http(s), data or file URL"),
    ]
    for url, want in cases:
        msg, param = refused(client, user(image_part(url)))
        assert param == "messages[0].content[1].image_url", (url[:40], param)
        assert msg.startswith("messages[0].content[1].image_url: ") and want in msg, (url[:40], msg)


def test_malformed_parts_too_many_images_and_video_are_refused(client):
    msg, param = refused(client, user({"type": "image_url"}))
    assert param == "messages[0].content[1].image_url" and "is required" in msg
    msg, _ = refused(client, user({"type": "image_url", "image_url": {"url": 7}}))
    assert "must be a non-empty string" in msg
    three = user(*[image_part(data_url(JPEG))] * 3)
    msg, param = refused(client, three)
    assert param == "messages[0].content[3].image_url"
    assert "at most 2 image(s) may be provided in one prompt" in msg, msg
    msg, _ = refused(client, user({"type": "video_url", "video_url": {"url": "http://127.0.0.1/v.mp4"}}))
    assert "video input is not supported" in msg, msg
    # the template renders this as an image: it must not pass as text
    msg, _ = refused(client, user({"type": "text", "text": "x", "image_url": data_url(JPEG)}))
    assert "cannot carry an image" in msg, msg
    # images in a system message (the template's own refusal)
    msg, _ = refused(client, [{"role": "system", "content": [image_part(data_url(JPEG))]},
                              {"role": "user", "content": "hi"}])
    assert "System message cannot contain images" in msg, msg


def test_an_image_url_on_an_allowed_domain_is_fetched(srv, client, origin):
    fetched = user(image_part(origin + "/img.jpg"))
    assert count(srv, fetched) == count(srv, user(image_part(data_url(JPEG))))
    answered(client, fetched)
    # a redirect that stays on an allowed domain is followed
    assert count(srv, user(image_part(origin + "/redirect-ok"))) == count(srv, fetched)


def test_urls_off_the_allowed_domains_and_failed_fetches_are_refused(client, origin):
    port = origin.rsplit(":", 1)[1]
    cases = [
        (f"http://localhost:{port}/img.jpg", "must be from one of the allowed domains (--allowed-media-domains 127.0.0.1); its domain is localhost"),
        (origin + "/redirect-out", "a redirect must be from one of the allowed domains"),
        (origin + "/redirect-file", "only http and https are followed"),
        (origin + "/redirect-loop", "more than 3 redirects"),
        (origin + "/missing", "HTTP 404"),
        (origin + "/notimage", "unsupported format"),
        (origin + "/big", "over the limit of"),
        ("http://127.0.0.1:1/img.jpg", "fetching the image failed"),
    ]
    for url, want in cases:
        msg, param = refused(client, user(image_part(url)))
        assert param == "messages[0].content[1].image_url", url
        assert want in msg, (url, msg)


def test_a_fetch_that_outlasts_the_timeout_is_refused(client, origin):
    t = time.monotonic()
    msg, _ = refused(client, user(image_part(origin + "/slow")))
    assert "timed out after 1 s" in msg, msg
    assert time.monotonic() - t < 2.5


def test_file_urls_only_inside_the_allowed_path(srv, client, media):
    inside = user(image_part("file://" + str(media / "in.jpg")))
    assert count(srv, inside) == count(srv, user(image_part(data_url(JPEG))))
    answered(client, inside)
    for path in (media.parent / "out.jpg", media / "escape.jpg", media / ".." / "out.jpg"):
        msg, _ = refused(client, user(image_part("file://" + str(path))))
        assert "must be a subpath of --allowed-local-media-path" in msg, (path, msg)
    msg, _ = refused(client, user(image_part("file://" + str(media / "none.jpg"))))
    assert "No such file" in msg


def test_without_the_flags_urls_and_files_are_refused(model, media, origin):
    with Server(model) as s:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        msg, _ = refused(c, user(image_part(origin + "/img.jpg")))
        assert "http(s) image URLs are not allowed on this server (start it with --allowed-media-domains)" in msg
        msg, _ = refused(c, user(image_part("file://" + str(media / "in.jpg"))))
        assert "cannot load local files without --allowed-local-media-path" in msg
        # the default limit (16) takes three images
        answered(c, user(*[image_part(data_url(JPEG))] * 3))


def test_vllm_style_domain_list_and_bad_limits_at_start_up(model, origin):
    # the hosts as separate arguments, as vLLM's command line writes them
    with Server(model, "--allowed-media-domains", "example.com", "127.0.0.1", "--limit-mm-per-prompt", '{"image": 1}') as s:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        answered(c, user(image_part(origin + "/img.jpg")))
        msg, _ = refused(c, user(image_part(origin + "/img.jpg"), image_part(data_url(JPEG))))
        assert "at most 1 image(s)" in msg
    for bad in ('{"image": -1}', '[1]', '{"picture": 1}', '{"image": "2"}'):
        with pytest.raises(RuntimeError) as e:
            with Server(model, "--limit-mm-per-prompt", bad):
                pass
        assert "--limit-mm-per-prompt" in str(e.value), bad
    with pytest.raises(RuntimeError) as e:
        with Server(model, "--allowed-local-media-path", "/nonexistent/dir"):
            pass
    assert "--allowed-local-media-path /nonexistent/dir does not exist" in str(e.value)


def strip_tower(src, dst):
    """A copy of model directory src whose model.safetensors lacks the model.visual.* tensors (config.json
    keeps its vision_config), written with the safetensors layout: a u64 header length, the JSON header,
    the tensors' bytes."""
    shutil.copytree(src, dst)
    raw = (src / "model.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header, data = json.loads(raw[8:8 + n]), raw[8 + n:]
    out, blobs, off = {}, [], 0
    for name, t in header.items():
        if name == "__metadata__":
            out[name] = t
            continue
        if name.startswith("model.visual."):
            continue
        b = data[t["data_offsets"][0]:t["data_offsets"][1]]
        out[name] = {**t, "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(out).encode()
    h += b" " * (-len(h) % 8)
    (dst / "model.safetensors").write_bytes(len(h).to_bytes(8, "little") + h + b"".join(blobs))
    assert any(k.startswith("model.visual.") for k in header) and not any(k.startswith("model.visual.") for k in out)
    return dst


def test_a_vision_config_without_tower_weights_refuses_images_with_400(tmp_path):
    """config.json says vision, the weights hold no tower: image input is off at start (said in the log), an
    image part is a 400 naming it, never a 500 from the encoder; text still works."""
    d = strip_tower(MODELS / "vl-a", tmp_path / "no-tower")
    with Server(d) as s:
        assert s.wait_log(lambda line: "image input is off" in line and "holds no vision tower" in line)
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        msg, param = refused(c, user(image_part(data_url(JPEG))))
        assert msg == "messages[0].content[1].image_url: this model has no vision tower, so it takes no image input"
        # greedy and past EOS: an unseeded sample may end at once, which is not what this test is about
        r = c.chat.completions.create(model="Qwen/Qwen3.5-9B", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                                      temperature=0, extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 2


def test_a_model_without_a_vision_tower_refuses_images(tmp_path):
    d = make_text_model(tmp_path / "text")
    cfg = json.loads((d / "config.json").read_text())
    cfg.pop("vision_config")
    (d / "config.json").write_text(json.dumps(cfg))
    with Server(d) as s:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        msg, param = refused(c, user(image_part(data_url(JPEG))))
        assert msg == "messages[0].content[1].image_url: this model has no vision tower, so it takes no image input"
        assert param == "messages[0].content[1].image_url"
        # text still works (greedy and past EOS: an unseeded sample may end at once)
        r = c.chat.completions.create(model="Qwen/Qwen3.5-9B", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                                      temperature=0, extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 2
