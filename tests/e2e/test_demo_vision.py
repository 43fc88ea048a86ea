"""The embedded demo model answers images with its trained vision tower (models/README.md "Vision"):
`qwen35 run --image` says what transformers said on the held-out test images of
tests/data/images/demo-vision (answers.json, written by scripts/train_demo_vision.py with the weights),
`qwen35 chat --image` and the server through the official openai client name each image's colour and shape,
and a question without an image still gets a text reply, not an image answer."""

import base64
import json
import os
import re
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from serve_util import BIN, ROOT, Server  # noqa: E402

DEMO = ROOT / "models" / "qwen35-demo"
IMAGES = ROOT / "tests" / "data" / "images" / "demo-vision"
ANSWERS = json.loads((IMAGES / "answers.json").read_text())
IMAGE_ANSWER = re.compile(r"^A (red|green|blue|yellow|purple|orange) (circle|square|triangle|star)\.$")
# the held-out images whose transformers reply is the true answer (the model is wrong on some held-out images;
# the test images are the first ones drawn, not chosen)
RIGHT = sorted(n for n, a in ANSWERS["answers"].items() if ANSWERS["transformers"][n] == a)


def run(*args, stdin=None):
    import subprocess
    p = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=120, input=stdin)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_the_test_images_are_mostly_answered_right():
    assert len(ANSWERS["answers"]) >= 4 and len(RIGHT) >= 3, ANSWERS


@pytest.mark.parametrize("name", sorted(ANSWERS["transformers"]))
def test_run_image_says_what_transformers_said(name):
    out = run("run", "-m", str(DEMO), "--image", str(IMAGES / name), "--prompt", ANSWERS["prompt"], "-n", "16",
              "-t", "1")
    assert out.strip() == ANSWERS["transformers"][name]


def test_chat_image_names_the_colour_and_shape():
    for name in RIGHT:
        out = run("chat", "-m", str(DEMO), "--image", str(IMAGES / name), "--temp", "0", "-n", "16", "-t", "1",
                  stdin=ANSWERS["question"] + "\n/quit\n")
        assert ANSWERS["answers"][name] in out, (name, out)


def test_chat_without_an_image_replies_with_text():
    out = run("chat", "-m", str(DEMO), "--temp", "0", "-n", "24", "-t", "1", stdin="What is a dictionary?\n/quit\n")
    assert out.strip() and not IMAGE_ANSWER.search(out.strip()), out
    assert not re.search(r"\bA (red|green|blue|yellow|purple|orange) (circle|square|triangle|star)\b", out), out


def test_the_server_answers_images_through_the_openai_client():
    openai = pytest.importorskip("openai")
    with Server("../../../models/qwen35-demo") as s:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        model = c.models.list().data[0].id
        for name in RIGHT:
            url = "data:image/png;base64," + base64.b64encode((IMAGES / name).read_bytes()).decode()
            r = c.chat.completions.create(model=model, temperature=0, max_tokens=16, messages=[
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                             {"type": "text", "text": ANSWERS["question"]}]}])
            assert r.choices[0].message.content == ANSWERS["answers"][name]
            assert r.choices[0].finish_reason == "stop"
            # usage counts the image's tokens: 12 or more image pads and the two markers around them
            text_only = c.chat.completions.create(model=model, temperature=0, max_tokens=1, messages=[
                {"role": "user", "content": [{"type": "text", "text": ANSWERS["question"]}]}])
            assert r.usage.prompt_tokens - text_only.usage.prompt_tokens >= 14
        r = c.chat.completions.create(model=model, temperature=0, max_tokens=24,
                                      messages=[{"role": "user", "content": "What is a dictionary?"}])
        assert r.choices[0].message.content and not IMAGE_ANSWER.match(r.choices[0].message.content)
