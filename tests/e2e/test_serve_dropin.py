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
from serve_util import MODELS, Server, make_text_model, sse_events  # noqa: E402

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.skipif(not (MODELS / "tiny-a" / "config.json").exists(), reason="tiny test models missing")

NAME = "Qwen/Qwen3.5-9B"
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_text_model(tmp_path_factory.mktemp("dropin"))


@pytest.fixture(scope="module")
def srv(model):
    with Server(model, "--parallel", "2", "--log-level", "debug", "--allowed-origins", "http://ok.example, http://b.example") as s:
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


def test_unknown_fields_are_ignored_and_null_is_not_given(srv, client):
    r = client.chat.completions.create(model=NAME, messages=USER, max_tokens=4, temperature=0, store=True,
                                       metadata={"k": "v"}, reasoning_effort="low", service_tier="auto", user="u",
                                       parallel_tool_calls=True, extra_body={"logit_bias": None, "some_vendor_field": 1})
    assert r.choices[0].finish_reason in ("length", "stop")
    assert srv.wait_log(lambda l: "ignored request fields" in l and "some_vendor_field" in l and "reasoning_effort" in l)
    status, body = srv.post("/v1/completions", {"model": NAME, "prompt": "x", "max_tokens": 2, "suffix": None, "best_of": 1,
                                                "logit_bias": None, "user": None, "seed": None, "stop": None, "echo": None})
    assert status == 200, body
    status, body = srv.post("/v1/completions", {"prompt": "x", "suffix": "tail"})
    assert status == 400 and body["error"]["param"] == "suffix"


def test_max_completion_tokens_wins_over_max_tokens(client):
    r = client.chat.completions.create(model=NAME, messages=USER, max_tokens=20, max_completion_tokens=3, temperature=0,
                                       extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length"


def test_developer_role_is_system(srv):
    dev = srv.post("/tokenize", {"messages": [{"role": "developer", "content": "Be brief."}] + USER})[1]["tokens"]
    sysm = srv.post("/tokenize", {"messages": [{"role": "system", "content": "Be brief."}] + USER})[1]["tokens"]
    assert dev == sysm


def test_assistant_prefill_continues_the_final_message(srv, client):
    msgs = USER + [{"role": "assistant", "content": "The answer is"}]
    closed = srv.post("/tokenize", {"messages": msgs, "add_generation_prompt": False, "return_token_strs": True})[1]
    text = "".join(closed["token_strs"])
    assert text.endswith("The answer is<|im_end|>\n")
    for extra in ({"continue_final_message": True}, {"add_generation_prompt": False}):
        r = client.chat.completions.create(model=NAME, messages=msgs, max_tokens=4, temperature=0, extra_body=extra)
        assert r.usage.prompt_tokens == closed["count"] - 2  # without "<|im_end|>" and "\n"
        assert getattr(r.choices[0].message, "reasoning_content", None) is None  # the answer goes on as content
    # without either flag the assistant turn is closed and a new one begins (vLLM's default)
    r = client.chat.completions.create(model=NAME, messages=msgs, max_tokens=4, temperature=0)
    assert r.usage.prompt_tokens > closed["count"]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=NAME, messages=USER, max_tokens=4, extra_body={"continue_final_message": True})
    assert "continue_final_message" in str(e.value)


def test_logit_bias_in_both_endpoints(srv, client):
    off = {"chat_template_kwargs": {"enable_thinking": False}, "ignore_eos": True}
    r = client.chat.completions.create(model=NAME, messages=USER, max_tokens=6, temperature=1, seed=3,
                                       logit_bias={"65": 100}, extra_body=off)
    assert r.choices[0].message.content == "AAAAAA"
    c = client.completions.create(model=NAME, prompt="x", max_tokens=5, temperature=1, seed=3, logit_bias={"66": 100},
                                  extra_body={"ignore_eos": True})
    assert c.choices[0].text == "BBBBB"
    body = {"prompt": "x", "max_tokens": 1, "temperature": 0, "return_token_ids": True, "ignore_eos": True}
    first = srv.post("/v1/completions", body)[1]["choices"][0]["token_ids"][0]
    banned = srv.post("/v1/completions", dict(body, logit_bias={str(first): -100}))[1]["choices"][0]["token_ids"][0]
    assert banned != first
    for bad in ({"x": 1}, {"65": 101}, {"999999": 1}):
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model=NAME, prompt="x", max_tokens=1, logit_bias=bad)
        assert "logit_bias" in str(e.value)


def test_min_tokens_also_holds_back_stop_strings(client):
    kw = dict(model=NAME, prompt="x", max_tokens=6, temperature=0, logit_bias={"65": 100}, stop=["A"])
    assert client.completions.create(**kw).choices[0].text == ""
    r = client.completions.create(**kw, extra_body={"min_tokens": 4}).choices[0]
    assert r.text == "AAA" and r.finish_reason == "stop"  # stop strings count from the 4th token on


def test_models_retrieve(client):
    assert client.models.retrieve(NAME).id == NAME
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("other-model")


def test_cors_preflight_and_allowed_origins(srv):
    status, h, _ = srv.request("OPTIONS", "/v1/chat/completions", headers={
        "Origin": "http://ok.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert status == 204 and h["Access-Control-Allow-Origin"] == "http://ok.example"
    assert "POST" in h["Access-Control-Allow-Methods"] and "authorization" in h["Access-Control-Allow-Headers"]
    status, h, body = srv.request("OPTIONS", "/v1/chat/completions", headers={"Origin": "http://evil.example"})
    assert status == 403 and "Access-Control-Allow-Origin" not in h and json.loads(body)["error"]
    status, h, _ = srv.request("GET", "/v1/models", headers={"Origin": "http://b.example"})
    assert status == 200 and h["Access-Control-Allow-Origin"] == "http://b.example"
    status, h, _ = srv.request("GET", "/v1/models", headers={"Origin": "http://evil.example"})
    assert status == 200 and "Access-Control-Allow-Origin" not in h


def test_no_cors_by_default(model):
    with Server(model) as s:
        status, h, _ = s.request("OPTIONS", "/v1/models", headers={"Origin": "http://ok.example"})
        assert status == 403 and "Access-Control-Allow-Origin" not in h


def test_llama_server_routes(srv):
    status, r = srv.post("/completion", {"prompt": "x", "n_predict": 4, "temperature": 0, "ignore_eos": True, "seed": -1})
    assert status == 200, r
    assert r["tokens_predicted"] == 4 and r["stop"] is True and r["stop_type"] == "limit" and isinstance(r["content"], str)
    status, r = srv.post("/completion", {"prompt": "x", "n_predict": 3, "logit_bias": [[67, 100]], "stop": ["CC"]})
    assert r["content"] == "" and r["stop_type"] == "word" and r["stopping_word"] == "CC"
    status, h, raw = srv.request("POST", "/completion", {"prompt": "x", "n_predict": 5, "stream": True, "ignore_eos": True,
                                                         "logit_bias": [[68, 100]]})
    events = [json.loads(e) for e in sse_events(raw)]  # no [DONE]: llama-server sends none
    assert "".join(e["content"] for e in events) == "DDDDD"
    assert events[-1]["stop"] is True and all(e["stop"] is False for e in events[:-1])
    status, _, props = srv.request("GET", "/props")
    props = json.loads(props)
    assert props["total_slots"] == 2 and props["default_generation_settings"]["n_ctx"] == 4096
    status, _, slots = srv.request("GET", "/slots")
    slots = json.loads(slots)
    assert [s["id"] for s in slots] == [0, 1] and all("prompt" not in s for s in slots)
    status, t = srv.post("/tokenize", {"content": "hi", "with_pieces": True})
    assert t == {"tokens": [{"id": 104, "piece": "h"}, {"id": 105, "piece": "i"}]}
    assert srv.post("/tokenize", {"content": "hi"})[1] == {"tokens": [104, 105]}
    assert srv.post("/detokenize", {"tokens": [104, 105]})[1]["content"] == "hi"
    status, p = srv.post("/apply-template", {"messages": USER})
    assert status == 200 and p["prompt"].endswith("<|im_start|>assistant\n<think>\n")


def test_every_error_is_json_in_openai_shape(srv):
    for method, path, body in (("GET", "/nope", None), ("GET", "/v1/chat/completions", None),
                               ("POST", "/v1/chat/completions", "{bad"), ("POST", "/v1/completions", {"prompt": "x", "n": 99}),
                               ("GET", "/v1/models/nope", None)):
        status, h, raw = srv.request(method, path, body)
        assert status >= 400 and h["Content-Type"] == "application/json"
        e = json.loads(raw)["error"]
        assert set(e) == {"message", "type", "param", "code"} and e["code"] == status


def test_retry_after_and_metrics_while_running(model):
    import threading
    import time
    with Server(model, "--parallel", "1", "--max-queue", "1") as s:
        before = s.metrics().get("vllm:generation_tokens_total", 0)
        done = []
        body = {"prompt": "x", "max_tokens": 4000, "ignore_eos": True, "stream": True}

        def start_and_wait_for(cond):
            t = threading.Thread(target=lambda: done.append(s.request("POST", "/v1/completions", body, timeout=120)))
            t.start()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not done:
                if cond(s.metrics()):
                    return t
            raise AssertionError(f"no such moment before the request ended: {done[:1]}")

        # one snapshot: the request still runs and its tokens are counted already
        a = start_and_wait_for(lambda m: m.get("vllm:num_requests_running", 0) == 1
                               and m.get("vllm:generation_tokens_total", 0) > before)
        b = start_and_wait_for(lambda m: m.get("vllm:num_requests_waiting", 0) == 1)
        status, h, raw = s.request("POST", "/v1/completions", {"prompt": "x", "max_tokens": 2})
        assert status == 429 and h["Retry-After"] == "1" and json.loads(raw)["error"]["code"] == 429
        a.join()
        b.join()
        assert [r[0] for r in done] == [200, 200]
