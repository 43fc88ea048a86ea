"""End-to-end tests of image prompts through the programs: `qwen35 logits --chat` (the stable interface
others drive) against transformers' goldens (tests/data/golden-vl, scripts/make_vl_models.py),
`qwen35 run --image` and `qwen35 chat --image`, and the errors for bad image input."""

import base64
import json
import os
import pathlib
import shutil
import struct
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = os.environ.get("Q35_BIN", str(ROOT / "build" / "qwen35"))
MODELS = ROOT / "tests" / "data" / "models"
GOLDEN = ROOT / "tests" / "data" / "golden-vl"
IMAGES = ROOT / "tests" / "data" / "images"
CASES = ["vl-a.one", "vl-a.two", "vl-b.one", "vl-b.two"]


def q35(*args, timeout=120, stdin=None):
    return subprocess.run([BIN, *args], capture_output=True, timeout=timeout, input=stdin)


def golden(case):
    return json.loads((GOLDEN / (case + ".golden.json")).read_text())


def floats(data, n):
    return struct.unpack("<%df" % n, data)


def assert_logits_match(data, g, case):
    V, n = g["vocab_size"], g["n_rows"]
    assert len(data) == 4 * V * n
    ours = floats(data, V * n)
    ref = floats((GOLDEN / (case + ".prompt.f32")).read_bytes(), V * n)
    for row in range(n):
        a, b = ours[row * V:(row + 1) * V], ref[row * V:(row + 1) * V]
        d = max(abs(x - y) for x, y in zip(a, b)) / max(abs(y) for y in b)
        assert d <= 1e-4, f"{case}: position {row}: relative diff {d:.3g}"


def test_logits_chat_renders_expands_and_matches_transformers_at_every_position(tmp_path):
    for case in CASES:
        g = golden(case)
        out = tmp_path / (case + ".f32")
        p = q35("logits", "-m", str(MODELS / g["model"]), "--chat", str(GOLDEN / (case + ".json")), "-o", str(out),
                "--print-ids")
        assert p.returncode == 0, p.stderr.decode()
        assert [int(x) for x in p.stdout.decode().strip().split(",")] == g["expanded_ids"]
        assert_logits_match(out.read_bytes(), g, case)


def test_logits_chat_takes_images_as_data_urls_and_absolute_paths(tmp_path):
    g = golden("vl-a.two")
    req = json.loads((GOLDEN / "vl-a.two.json").read_text())
    parts = [p for p in req["messages"][1]["content"] if p["type"] == "image_url"]
    first = (GOLDEN / parts[0]["image_url"]["url"]).resolve()
    parts[0]["image_url"]["url"] = "data:image/jpeg;base64," + base64.b64encode(first.read_bytes()).decode()
    parts[1]["image_url"]["url"] = str((GOLDEN / parts[1]["image_url"]["url"]).resolve())
    (tmp_path / "req.json").write_text(json.dumps(req))
    out = tmp_path / "out.f32"
    p = q35("logits", "-m", str(MODELS / "vl-a"), "--chat", str(tmp_path / "req.json"), "-o", str(out))
    assert p.returncode == 0, p.stderr.decode()
    assert_logits_match(out.read_bytes(), g, "vl-a.two")


def test_run_with_images_continues_as_transformers_generate_with_and_without_speculation():
    for case in CASES:
        g = golden(case)
        ids = ",".join(map(str, g["prompt_ids"]))
        images = [a for f in g["image_files"] for a in ("--image", str(IMAGES / f))]
        for extra in (["--no-spec"], ["--spec-k", "3"]) if g["model"] == "vl-a" else ([],):
            p = q35("run", "-m", str(MODELS / g["model"]), "--prompt-ids", ids, *images, "-n", str(len(g["greedy_ids"])),
                    *extra)
            assert p.returncode == 0, p.stderr.decode()
            assert [int(x) for x in p.stdout.decode().strip().split(",")] == g["greedy_ids"], (case, extra)


def test_chat_with_an_image_replies_as_run_does_on_the_rendered_prompt():
    g = golden("vl-a.one")
    image = str(IMAGES / g["image_files"][0])
    question = "What is in this picture?"
    p = q35("chat", "-m", str(MODELS / "vl-a"), "--image", image, "-n", "12", "--no-spec",
            stdin=(question + "\nand again\n").encode())
    assert p.returncode == 0, p.stderr.decode()
    replies = p.stdout.split(b"\n")
    r = q35("run", "-m", str(MODELS / "vl-a"), "--prompt", g["rendered"], "--image", image, "-n", "12", "--no-spec")
    assert r.returncode == 0, r.stderr.decode()
    assert replies[0] and replies[0] == r.stdout.split(b"\n")[0]
    assert len(replies) >= 3  # the second turn (its prompt extends the first) answered too


def text_only_model(tmp_path):
    """tiny-a without its vision_config, with vl-a's tokenizer and template (the same vocabulary size)."""
    d = tmp_path / "text-only"
    shutil.copytree(MODELS / "tiny-a", d)
    cfg = json.loads((d / "config.json").read_text())
    del cfg["vision_config"]
    (d / "config.json").write_text(json.dumps(cfg))
    for f in ("tokenizer.json", "chat_template.jinja"):
        shutil.copy(MODELS / "vl-a" / f, d / f)
    return d


def test_bad_image_input_fails_with_a_message_naming_it(tmp_path):
    req = json.loads((GOLDEN / "vl-a.one.json").read_text())
    part = req["messages"][0]["content"][0]

    def logits_with(url, model=MODELS / "vl-a"):
        part["image_url"]["url"] = url
        path = tmp_path / "req.json"
        path.write_text(json.dumps(req))
        p = q35("logits", "-m", str(model), "--chat", str(path), "-o", str(tmp_path / "o.f32"))
        assert p.returncode == 1
        return p.stderr.decode()

    assert "no vision tower" in logits_with(str(IMAGES / "rgb_37x53.jpg"), text_only_model(tmp_path))
    assert "not valid base64" in logits_with("data:image/png;base64,@@@@")
    assert "must be base64" in logits_with("data:image/png,abc")
    assert "cannot read image" in logits_with("no-such-file.png")
    assert "not fetched here" in logits_with("https://example.com/a.png")
    (tmp_path / "junk.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    assert "image 1" in logits_with(str(tmp_path / "junk.png"))
    assert "image 1" in logits_with(str(IMAGES / "bomb_60000x60000.png"))
    # ids without an image_pad for the image given
    p = q35("run", "-m", str(MODELS / "vl-a"), "--prompt-ids", "1,2,3", "--image", str(IMAGES / "rgb_37x53.jpg"))
    assert p.returncode == 1 and "0 <|image_pad|> tokens but 1 images" in p.stderr.decode()
    assert not (tmp_path / "o.f32").exists()
