"""End-to-end tests of image input answered by `qwen35 serve` through the
official openai client, on the tiny vision-language checkpoints
(tests/data/models/vl-a, vl-b: transformers' own classes with a vision
tower, scripts/make_vl_models.py): the images go as base64 data: URLs, the
scheduler encodes them with the tower and evaluates the prompt with the
multimodal rotary positions, and the greedy continuation must be the one
transformers computed for the same rendered prompt
(tests/data/golden-vl/*.golden.json). Then what the scheduler adds: two
images in one message, n > 1, streaming, prefix reuse of a follow-up turn
past its image (cached_tokens, and the same tokens as a cold server), and
no reuse past an image that differs."""

import base64
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from serve_util import MODELS, ROOT, Server  # noqa: E402

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.skipif(not (MODELS / "vl-a" / "model.safetensors").exists(), reason="tiny VL models missing")

GOLDEN = ROOT / "tests" / "data" / "golden-vl"
IMAGES = ROOT / "tests" / "data" / "images"
MIME = {".jpg": "image/jpeg", ".png": "image/png", ".webp": "image/webp", ".gif": "image/gif"}


def data_url(path):
    return f"data:{MIME[path.suffix]};base64," + base64.b64encode(path.read_bytes()).decode()


def image_part(name):
    return {"type": "image_url", "image_url": {"url": data_url(IMAGES / name)}}


def golden(name):
    """A golden and its request's messages, the images as data: URLs."""
    g = json.loads((GOLDEN / f"{name}.golden.json").read_text())
    req = json.loads((GOLDEN / g["request"]).read_text())
    for m in req["messages"]:
        for p in m["content"] if isinstance(m["content"], list) else []:
            if p.get("type") == "image_url":
                p["image_url"]["url"] = data_url((GOLDEN / p["image_url"]["url"]).resolve())
    return g, req["messages"]


def client_of(s):
    return openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def chat(c, messages, max_tokens=12, **kw):
    """A greedy chat completion with its token ids (vLLM's return_token_ids)."""
    extra = {"return_token_ids": True, "ignore_eos": True, **kw.pop("extra_body", {})}
    kw.setdefault("temperature", 0)
    return c.chat.completions.create(model="Qwen/Qwen3.5-9B", messages=messages, max_tokens=max_tokens,
                                     extra_body=extra, **kw)


def ids(choice):
    return choice.model_extra["token_ids"]


def cached(r):
    return r.usage.prompt_tokens_details.cached_tokens


@pytest.fixture(scope="module")
def srv():
    with Server("vl-a") as s:  # speculation on (k=1), 4 slots, the prefix cache on
        yield s


@pytest.fixture(scope="module")
def client(srv):
    return client_of(srv)


@pytest.mark.parametrize("name", ["vl-a.one", "vl-a.two"])
def test_the_greedy_answer_is_transformers_continuation(srv, client, name):
    g, messages = golden(name)
    # the rendered prompt is the golden's, images widened to their merged patches
    status, tk = srv.post("/tokenize", {"messages": messages})
    assert status == 200 and tk["tokens"] == g["expanded_ids"], tk
    r = chat(client, messages, max_tokens=len(g["greedy_ids"]), extra_body={"cache_salt": name})
    assert ids(r.choices[0]) == g["greedy_ids"]
    # usage counts the image tokens
    assert r.usage.prompt_tokens == len(g["expanded_ids"]) == g["n_rows"]
    assert r.usage.completion_tokens == len(g["greedy_ids"])


@pytest.mark.parametrize("model,args", [("vl-b", ()), ("vl-a", ("--spec-k", "0")), ("vl-a", ("--spec-k", "3")),
                                        ("vl-a", ("--prefill-chunk", "5"))])
def test_other_tower_shapes_and_speculation_depths_give_transformers_continuation(model, args):
    """vl-b: other tower shapes (depth, heads, patch, merge, position table), no MTP head; vl-a without
    drafts, with three a step, and with prompt chunks shorter than an image (a chunk stops before an image
    or takes it whole)."""
    with Server(model, *args) as s:
        c = client_of(s)
        for name in (f"{model}.one", f"{model}.two"):
            g, messages = golden(name)
            r = chat(c, messages, max_tokens=len(g["greedy_ids"]))
            assert ids(r.choices[0]) == g["greedy_ids"], name
            assert r.usage.prompt_tokens == g["n_rows"]


def test_n_choices_and_streaming_give_the_same_answer(client):
    g, messages = golden("vl-a.one")
    n = len(g["greedy_ids"])
    r = chat(client, messages, max_tokens=n, n=3, extra_body={"cache_salt": "n3"})
    assert [ids(ch) for ch in r.choices] == [g["greedy_ids"]] * 3
    assert r.usage.prompt_tokens == g["n_rows"] and r.usage.completion_tokens == 3 * n
    text = r.choices[0].message.content
    stream = chat(client, messages, max_tokens=n, stream=True, stream_options={"include_usage": True},
                  extra_body={"cache_salt": "stream"})
    chunks = list(stream)
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == text
    assert chunks[-1].usage.prompt_tokens == g["n_rows"] and chunks[-1].usage.completion_tokens == n
    # sampled choices of a seeded request: each its own, the same again with the seed
    a = chat(client, messages, n=2, temperature=1.0, seed=7, extra_body={"cache_salt": "seeded"})
    b = chat(client, messages, n=2, temperature=1.0, seed=7, extra_body={"cache_salt": "seeded"})
    assert [ids(ch) for ch in a.choices] == [ids(ch) for ch in b.choices]
    assert cached(b) > 0


def follow_up(first, answer, text="And the colours?"):
    return first + [{"role": "assistant", "content": answer}, {"role": "user", "content": text}]


def test_a_follow_up_turn_reuses_the_state_past_its_image_and_answers_as_a_cold_server(client):
    g, first = golden("vl-a.one")
    r1 = chat(client, first, extra_body={"cache_salt": "follow"})
    second = follow_up(first, r1.choices[0].message.content)
    r2 = chat(client, second, extra_body={"cache_salt": "follow"})
    image_end = g["expanded_ids"].index(297)  # <|vision_end|>
    assert cached(r2) > image_end, cached(r2)
    # an image first sent in a follow-up turn: the text turn before it is reused
    text_first = [{"role": "user", "content": "Hello there."}]
    t1 = chat(client, text_first, extra_body={"cache_salt": "late"})
    late = text_first + [{"role": "assistant", "content": t1.choices[0].message.content},
                         {"role": "user", "content": [image_part("rgb_37x53.jpg"), {"type": "text", "text": "And this?"}]}]
    t2 = chat(client, late, extra_body={"cache_salt": "late"})
    assert cached(t2) > 0
    with Server("vl-a") as cold:
        c = client_of(cold)
        r2c, t2c = chat(c, second), chat(c, late)
        assert cached(r2c) == 0 and cached(t2c) == 0
        assert ids(r2c.choices[0]) == ids(r2.choices[0])
        assert ids(t2c.choices[0]) == ids(t2.choices[0])
        assert r2c.usage.prompt_tokens == r2.usage.prompt_tokens


def test_the_same_text_with_another_image_reuses_nothing_past_the_image(srv, client):
    # the same size, so the same prompt ids; other pixels (one mirrored, one turned by its EXIF orientation)
    def ask(name):
        return [{"role": "user", "content": [{"type": "text", "text": "Look:"}, image_part(name),
                                             {"type": "text", "text": "What is it?"}]}]
    tokens = [srv.post("/tokenize", {"messages": ask(n)})[1]["tokens"] for n in ("exif2_40x24.jpg", "exif3_40x24.jpg")]
    assert tokens[0] == tokens[1]
    image_at = tokens[0].index(299)  # the first <|image_pad|>
    a = chat(client, ask("exif2_40x24.jpg"), extra_body={"cache_salt": "other"})
    b = chat(client, ask("exif3_40x24.jpg"), extra_body={"cache_salt": "other"})
    assert cached(b) <= image_at, (cached(b), image_at)
    # the first image again: its whole prompt but the last token (the prompt snapshot, or the warm slot)
    again = chat(client, ask("exif2_40x24.jpg"), extra_body={"cache_salt": "other"})
    assert cached(again) == a.usage.prompt_tokens - 1
    assert ids(again.choices[0]) == ids(a.choices[0])
    with Server("vl-a") as cold:
        c = client_of(cold)
        assert ids(chat(c, ask("exif3_40x24.jpg")).choices[0]) == ids(b.choices[0])
        assert ids(chat(c, ask("exif2_40x24.jpg")).choices[0]) == ids(a.choices[0])


def copy_model(src, dst):
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).symlink_to(f)
    return dst


def test_a_checkpoint_whose_pieces_disagree_is_refused_with_the_reason(tmp_path):
    src = MODELS / "vl-a"
    # config.json's image_token_id is not the tokenizer's <|image_pad|>: image input is off
    d = copy_model(src, tmp_path / "ids")
    cfg = json.loads((src / "config.json").read_text())
    cfg["image_token_id"] = 7
    (d / "config.json").unlink()
    (d / "config.json").write_text(json.dumps(cfg))
    _, messages = golden("vl-a.one")
    with Server(d) as s:
        assert any("image input is off: config.json's image_token_id (7) is not the tokenizer's <|image_pad|> (299)" in l
                   for l in s.log), s.log
        with pytest.raises(openai.BadRequestError) as e:
            chat(client_of(s), messages)
        assert "takes no image input" in str(e.value)
    # a processor whose patches are not the tower's: the request fails with the tower's reason, the server goes on
    d = copy_model(src, tmp_path / "patch")
    pre = json.loads((src / "preprocessor_config.json").read_text())
    pre["patch_size"] = 8
    (d / "preprocessor_config.json").unlink()
    (d / "preprocessor_config.json").write_text(json.dumps(pre))
    with Server(d) as s:
        c = client_of(s)
        with pytest.raises(openai.InternalServerError) as e:
            chat(c, messages)
        assert "the images could not be encoded" in str(e.value), str(e.value)
        r = chat(c, [{"role": "user", "content": "hi"}], max_tokens=2)
        assert r.usage.completion_tokens == 2
