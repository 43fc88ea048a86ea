"""End-to-end tests of `qwen35 serve` on text: a tiny random checkpoint with
a byte-level tokenizer (serve_util.make_text_model), driven by the openai
client. The model's output is random bytes, so the tests check the protocol
(chat objects, reasoning and content fields, streaming deltas against the
whole message, stop strings in real text, tokenize round trips, tools,
multi-turn prefix reuse) rather than what is said."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from serve_util import MODELS, Server, make_text_model, sse_events  # noqa: E402

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.skipif(not (MODELS / "tiny-a" / "config.json").exists(), reason="tiny test models missing")

NAME = "Qwen/Qwen3.5-9B"
SYSTEM = "You are a careful assistant. " * 12
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}]


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    model = make_text_model(tmp_path_factory.mktemp("textmodel"))
    with Server(model, "--parallel", "2") as s:
        yield s


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def messages(user="What is the weather in Paris?"):
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def test_tokenize_detokenize_round_trip(srv):
    status, r = srv.post("/tokenize", {"prompt": "Héllo <|im_end|>", "return_token_strs": True})
    assert status == 200
    assert r["tokens"][-1] == 258 and r["count"] == len(r["tokens"]) and r["max_model_len"] == 4096
    assert r["token_strs"][-1] == "<|im_end|>"
    status, d = srv.post("/detokenize", {"tokens": r["tokens"]})
    assert status == 200 and d["prompt"] == "Héllo <|im_end|>"
    status, chat = srv.post("/tokenize", {"messages": messages()})
    assert status == 200 and chat["tokens"][0] == 257  # <|im_start|>
    status, _ = srv.post("/detokenize", {"tokens": [1, 99999]})
    assert status == 400


def test_chat_thinks_by_default_and_off_when_asked(client):
    off = client.chat.completions.create(model=NAME, messages=messages(), max_tokens=16, temperature=0,
                                         extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    m = off.choices[0].message
    assert off.object == "chat.completion" and off.id.startswith("chatcmpl-")
    assert m.role == "assistant" and isinstance(m.content, str)
    assert getattr(m, "reasoning_content", None) is None
    assert off.usage.completion_tokens <= 16
    # Qwen3.5-9B's template thinks unless enable_thinking is false: absent, true and null all open <think>
    for kwargs in (None, {"enable_thinking": True}, {"enable_thinking": None}):
        on = client.chat.completions.create(model=NAME, messages=messages(), max_tokens=16, temperature=0,
                                            extra_body={"chat_template_kwargs": kwargs} if kwargs else None)
        mo = on.choices[0].message
        # the prompt opens <think>: what comes out is reasoning until </think>
        assert isinstance(mo.reasoning_content, str) and mo.reasoning_content
        assert mo.reasoning == mo.reasoning_content
        assert on.usage.prompt_tokens < off.usage.prompt_tokens  # "<think>\n" vs "<think>\n\n</think>\n\n"


@pytest.mark.parametrize("thinking", [False, True])
def test_chat_stream_deltas_add_up_to_the_message(client, thinking):
    kw = dict(model=NAME, messages=messages(), max_tokens=24, temperature=0.9, seed=11,
              extra_body={"chat_template_kwargs": {"enable_thinking": thinking}})
    whole = client.chat.completions.create(**kw).choices[0]
    content, reasoning, finish, roles, usage = "", "", None, [], None
    for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
        if not chunk.choices:
            usage = chunk.usage
            continue
        d = chunk.choices[0].delta
        roles.append(d.role)
        content += d.content or ""
        reasoning += getattr(d, "reasoning_content", None) or ""
        finish = chunk.choices[0].finish_reason or finish
    assert roles[0] == "assistant"
    assert content == (whole.message.content or "")
    assert reasoning == (getattr(whole.message, "reasoning_content", None) or "")
    assert finish == whole.finish_reason
    assert usage.completion_tokens == 24 or finish == "stop"


def test_text_completion_stop_string_in_text(client, srv):
    full = client.completions.create(model=NAME, prompt="The answer is", max_tokens=30, temperature=0).choices[0].text
    assert full
    # a stop string made of three generated characters: never leaks, whole or in part
    valid = [i for i in range(2, len(full) - 3) if full[i:i + 3].isprintable() and "\ufffd" not in full[i:i + 3]]
    if not valid:
        pytest.skip("no printable run in this output")
    i = valid[0]
    stop = full[i:i + 3]
    cut = full.index(stop)
    r = client.completions.create(model=NAME, prompt="The answer is", max_tokens=30, temperature=0, stop=stop)
    assert r.choices[0].text == full[:cut] and r.choices[0].finish_reason == "stop"
    status, _, raw = srv.request("POST", "/v1/completions", {"prompt": "The answer is", "max_tokens": 30,
                                                            "temperature": 0, "stop": [stop], "stream": True})
    chunks = [json.loads(e) for e in sse_events(raw)[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == full[:cut]


def test_tools_auto_and_forced_choices(client, srv):
    r = client.chat.completions.create(model=NAME, messages=messages(), tools=TOOLS, tool_choice="auto", max_tokens=8,
                                       temperature=0)
    c = r.choices[0]
    assert c.finish_reason in ("stop", "length", "tool_calls")
    assert (c.message.tool_calls or []) == [] or all(t.function.name == "get_weather" for t in c.message.tool_calls)
    # the tools are in the prompt the model sees
    with_tools = srv.post("/tokenize", {"messages": messages(), "tools": TOOLS})[1]["count"]
    without = srv.post("/tokenize", {"messages": messages()})[1]["count"]
    assert with_tools > without + 50
    # required and named: the output is held to one call of the function (more in test_serve_schema.py); the
    # random model ends a string only when made to, so the city gets a maxLength
    bounded = json.loads(json.dumps(TOOLS))
    bounded[0]["function"]["parameters"]["properties"]["city"]["maxLength"] = 8
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        r = client.chat.completions.create(model=NAME, messages=messages(), tools=bounded, tool_choice=choice, max_tokens=400,
                                           temperature=0, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        c = r.choices[0]
        assert c.finish_reason == "tool_calls" and [t.function.name for t in c.message.tool_calls] == ["get_weather"]
        assert isinstance(json.loads(c.message.tool_calls[0].function.arguments)["city"], str)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=NAME, messages=messages(), tools=TOOLS, max_tokens=4,
                                       tool_choice={"type": "function", "function": {"name": "nope"}})
    assert "tool_choice" in str(e.value)
    # a tool-call history renders and continues
    hist = messages() + [
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]
    r = client.chat.completions.create(model=NAME, messages=hist, tools=TOOLS, max_tokens=4, temperature=0)
    assert r.choices[0].message.role == "assistant"


def test_multi_turn_follow_up_reuses_the_prefix(client):
    convo = messages("Tell me about Paris.")
    first = client.chat.completions.create(model=NAME, messages=convo, max_tokens=12, temperature=0,
                                           extra_body={"cache_salt": "mt"})
    p1 = first.usage.prompt_tokens
    convo += [{"role": "assistant", "content": "Paris is the capital of France."},
              {"role": "user", "content": "And Lyon?"}]
    second = client.chat.completions.create(model=NAME, messages=convo, max_tokens=12, temperature=0,
                                            extra_body={"cache_salt": "mt"})
    cached = second.usage.prompt_tokens_details.cached_tokens
    # the system and first user turn (all but the generation prompt) come back from the cache
    assert cached >= p1 - 12
    cold = client.chat.completions.create(model=NAME, messages=convo, max_tokens=12, temperature=0,
                                          extra_body={"cache_prompt": False})
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    assert cold.choices[0].message.content == second.choices[0].message.content


def test_bad_text_requests(srv):
    assert srv.post("/v1/chat/completions", {"messages": []})[0] == 400
    assert srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})[0] == 400
    assert srv.post("/v1/chat/completions", {"messages": messages(), "response_format": {"type": "json_schema"}})[0] == 400
    status, body = srv.post("/v1/completions", {"prompt": "x" * 5000})
    assert status == 400 and "maximum context length" in body["error"]["message"]


def test_json_object_output_parses(client):
    # json_object speculates: its seeded draws are speculative sampling's (the same distribution, another
    # stream); eight of them, of which some must end inside max_tokens so that the check is not empty
    stopped = 0
    for seed in range(1, 9):
        r = client.chat.completions.create(model=NAME, messages=messages("Reply in JSON."), max_tokens=200, temperature=1,
                                           seed=seed, response_format={"type": "json_object"},
                                           extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        c = r.choices[0]
        if c.finish_reason == "stop":
            stopped += 1
            assert isinstance(json.loads(c.message.content), dict)
        else:  # cut by max_tokens: still a prefix of an object
            assert c.message.content.lstrip().startswith("{")
    assert stopped >= 3


def test_json_object_with_thinking_constrains_only_the_answer(client):
    # the reasoning is free; what follows </think> is held to a JSON object
    ended = 0
    for seed in range(1, 7):
        r = client.chat.completions.create(model=NAME, messages=messages("Reply in JSON."), max_tokens=300, temperature=1,
                                           seed=seed, response_format={"type": "json_object"})
        m = r.choices[0].message
        assert m.reasoning_content
        if m.content:
            ended += 1
            assert m.content.lstrip().startswith("{")
            if r.choices[0].finish_reason == "stop":
                assert isinstance(json.loads(m.content), dict)
    print(f"{ended} of 6 reasoned to </think>")
