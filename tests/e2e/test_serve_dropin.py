"""End-to-end tests of `qwen35 serve` as a drop-in for vLLM and llama-server
clients: the chat template identified by its hash and its defaults, lenient
request bodies, and the extra routes. The model is the tiny random one with
a byte-level tokenizer and Qwen3.5-9B's chat template
(serve_util.make_text_model), so the tests check the protocol, not what is
said."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from serve_util import MODELS, Server, make_text_model  # noqa: E402

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.skipif(not (MODELS / "tiny-a" / "config.json").exists(), reason="tiny test models missing")

NAME = "Qwen/Qwen3.5-9B"
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_text_model(tmp_path_factory.mktemp("dropin"))


@pytest.fixture(scope="module")
def srv(model):
    with Server(model, "--parallel", "2") as s:
        yield s


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def rendered(srv, **body):
    status, r = srv.post("/tokenize", dict(messages=USER, return_token_strs=True, **body))
    assert status == 200, r
    return "".join(r["token_strs"])


def test_the_9b_template_is_identified_and_thinks_by_default(srv):
    assert any("chat template: Qwen3.5-9B's" in line and "chat_template.jinja" in line for line in srv.log)
    assert rendered(srv).endswith("<|im_start|>assistant\n<think>\n")
    assert rendered(srv, chat_template_kwargs={"enable_thinking": None}).endswith("assistant\n<think>\n")
    assert rendered(srv, chat_template_kwargs={"enable_thinking": False}).endswith("assistant\n<think>\n\n</think>\n\n")


def test_an_unknown_template_is_refused_naming_file_and_hash(tmp_path):
    import hashlib
    model = make_text_model(tmp_path / "m")
    t = model / "chat_template.jinja"
    t.write_bytes(t.read_bytes() + b"\n")
    digest = hashlib.sha256(t.read_bytes()).hexdigest()
    with pytest.raises(RuntimeError) as e:
        with Server(model):
            pass
    assert str(t) in str(e.value) and digest in str(e.value) and "--chat-template-fallback" in str(e.value)
    with Server(model, "--chat-template-fallback", "qwen3.5-0.8b") as s:
        assert rendered(s).endswith("assistant\n<think>\n\n</think>\n\n")  # the 0.8B thinks only when asked
        assert rendered(s, chat_template_kwargs={"enable_thinking": True}).endswith("assistant\n<think>\n")
    with pytest.raises(RuntimeError) as e:
        with Server(model, "--chat-template-fallback", "llama"):
            pass
    assert "qwen3.5-9b" in str(e.value)


def test_default_chat_template_kwargs_and_the_request_overriding_them(model):
    with Server(model, "--default-chat-template-kwargs", '{"enable_thinking": false}') as s:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        off = c.chat.completions.create(model=NAME, messages=USER, max_tokens=8, temperature=0)
        assert getattr(off.choices[0].message, "reasoning_content", None) is None
        on = c.chat.completions.create(model=NAME, messages=USER, max_tokens=8, temperature=0,
                                       extra_body={"chat_template_kwargs": {"enable_thinking": True}})
        assert on.choices[0].message.reasoning_content
        assert rendered(s).endswith("</think>\n\n")
    for bad in ("[1]", '{"enable_thinking": 1}', '{"x": true}', "{"):
        with pytest.raises(RuntimeError) as e:
            with Server(model, "--default-chat-template-kwargs", bad):
                pass
        assert "--default-chat-template-kwargs" in str(e.value)


def test_reasoning_is_filled_by_default(client):
    r = client.chat.completions.create(model=NAME, messages=USER, max_tokens=12, temperature=0)
    assert r.choices[0].message.reasoning_content
