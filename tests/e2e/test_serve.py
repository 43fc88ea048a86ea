"""End-to-end tests of `qwen35 serve` with the tiny random checkpoints: a
real server process driven by the official openai client, by curl and by
raw sockets. The tiny models have no tokenizer, so prompts are token ids and
each generated token shows as "<id>" in the text."""

import concurrent.futures as cf
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from serve_util import MODELS, Server, recv_until, sse_events  # noqa: E402

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.skipif(not (MODELS / "tiny-a" / "config.json").exists(), reason="tiny test models missing")

PROMPT = [11, 22, 33, 44, 55, 66, 77]
NAME = "Qwen/Qwen3.5-9B"


@pytest.fixture(scope="module")
def srv():
    # one address for every test of this module, its pooled keep-alive connections and raw sockets
    # alike: the per-address connection limit has its own tests (test_hostile.py), so it is off here
    with Server("tiny-a", "--parallel", "4", "--timeout", "3", "--max-conns-per-client", "0") as s:
        yield s


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def greedy(client, prompt=PROMPT, n=12, **kw):
    r = client.completions.create(model=NAME, prompt=prompt, max_tokens=n, temperature=0, **kw)
    return r


def ids_of(text):
    return [int(t) for t in text.replace("<", " ").replace(">", " ").split()]


# ---- completions -------------------------------------------------------------

def test_completion_and_usage(client):
    r = greedy(client)
    assert r.object == "text_completion" and r.id.startswith("cmpl-")
    assert r.model == NAME
    c = r.choices[0]
    assert c.finish_reason == "length" and c.index == 0
    assert len(ids_of(c.text)) == 12
    assert r.usage.prompt_tokens == len(PROMPT)
    assert r.usage.completion_tokens == 12 and r.usage.total_tokens == 12 + len(PROMPT)


def test_streaming_equals_non_streaming(client):
    full = greedy(client).choices[0].text
    stream = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=12, temperature=0, stream=True,
                                       stream_options={"include_usage": True})
    text, finish, usage = "", None, None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].text
            finish = chunk.choices[0].finish_reason or finish
        else:
            usage = chunk.usage
    assert text == full
    assert finish == "length"
    assert usage.completion_tokens == 12 and usage.prompt_tokens == len(PROMPT)


def test_sse_wire_format_with_curl(srv):
    if not shutil.which("curl"):
        pytest.skip("curl missing")
    body = json.dumps({"prompt": PROMPT, "max_tokens": 3, "temperature": 0, "stream": True})
    out = subprocess.run(["curl", "-sN", "-H", "Content-Type: application/json", "-d", body, srv.url + "/v1/completions"],
                         capture_output=True, timeout=30).stdout
    events = sse_events(out)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert not any("usage" in c for c in chunks)  # only when asked
    assert out.endswith(b"data: [DONE]\n\n")


def test_stop_string_spanning_tokens_never_leaks(client, srv):
    text = greedy(client, n=16).choices[0].text
    toks = ids_of(text)
    # a stop string that starts inside token 3 and ends inside token 4
    t3, t4 = f"<{toks[2]}>", f"<{toks[3]}>"
    stop = t3[-2:] + t4[:2]
    cut = text.index(stop)
    r = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=16, temperature=0, stop=[stop])
    assert r.choices[0].text == text[:cut]
    assert r.choices[0].finish_reason == "stop"
    # streamed: no chunk may carry any part of the stop string
    status, _, raw = srv.request("POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": 16, "temperature": 0,
                                                            "stop": stop, "stream": True})
    assert status == 200
    chunks = [json.loads(e) for e in sse_events(raw)[:-1]]
    streamed = "".join(c["choices"][0]["text"] for c in chunks)
    assert streamed == text[:cut]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"][0]["stop_reason"] == stop


def test_stop_token_ids_min_tokens_and_ignore_eos(client, srv):
    toks = ids_of(greedy(client, n=10).choices[0].text)
    status, body = srv.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 10, "temperature": 0,
                                                "stop_token_ids": [toks[4]]})
    assert status == 200
    ch = body["choices"][0]
    first = toks.index(toks[4])
    assert ids_of(ch["text"]) == toks[:first] and ch["finish_reason"] == "stop" and ch["stop_reason"] == toks[4]
    # min_tokens masks the stop token until enough tokens are out
    status, body = srv.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 10, "temperature": 0,
                                                "stop_token_ids": [toks[0]], "min_tokens": 3, "return_token_ids": True})
    assert status == 200 and len(body["choices"][0]["token_ids"]) >= 3


def test_seeded_sampling_is_reproducible_under_load(client, srv):
    kw = dict(model=NAME, prompt=PROMPT, max_tokens=20, temperature=1.0, top_p=0.9, seed=1234, extra_body={"top_k": 50})
    alone = client.completions.create(**kw).choices[0].text
    other = client.completions.create(**{**kw, "seed": 99}).choices[0].text
    assert other != alone
    # the same request again while six other sampled requests decode with it
    with cf.ThreadPoolExecutor(8) as ex:
        noise = [ex.submit(client.completions.create, model=NAME, prompt=[5 + i] * (3 + i), max_tokens=30,
                           temperature=1.0, seed=i) for i in range(6)]
        again = [ex.submit(client.completions.create, **kw) for _ in range(2)]
        for f in noise:
            f.result()
        assert all(f.result().choices[0].text == alone for f in again)


def test_n_choices_logprobs_and_echo(client, srv):
    r = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=5, temperature=0.8, n=3, seed=7, logprobs=4)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert r.usage.completion_tokens == 15 and r.usage.prompt_tokens == len(PROMPT)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == 5
    # vLLM's entries: the chosen token first, then the 4 most likely (it may be one of them)
    for tok, top in zip(lp.tokens, lp.top_logprobs):
        assert list(top)[0] == tok and len(top) in (4, 5)
    assert all(x <= 0 for x in lp.token_logprobs)
    r = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=3, temperature=0, echo=True)
    assert r.choices[0].text.startswith("".join(f"<{t}>" for t in PROMPT))
    status, body = srv.post("/v1/completions", {"prompt": PROMPT, "logprobs": 21})
    assert status == 400 and body["error"]["param"] == "logprobs"


def test_penalties_change_greedy_output(client):
    plain = greedy(client, n=24).choices[0].text
    pen = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=24, temperature=0,
                                    extra_body={"repetition_penalty": 1.8}, presence_penalty=1.5, frequency_penalty=1.0)
    assert len(ids_of(pen.choices[0].text)) == 24
    assert pen.choices[0].text != plain or len(set(ids_of(plain))) == 24


# ---- errors ---------------------------------------------------------------------

@pytest.mark.parametrize("body,status,param", [
    ('{"prompt": [1, 2', 400, None),                                   # malformed JSON
    ('[1, 2, 3]', 400, None),                                          # not an object
    ({"prompt": [1, 2], "max_tokens": "8"}, 400, "max_tokens"),        # wrong type
    ({"prompt": [1, 2], "temperature": -1}, 400, "temperature"),
    ({"prompt": [1, 2], "best_of": 2}, 400, "best_of"),                # unsupported field, named
    ({"prompt": [1, 2], "suffix": "x"}, 400, "suffix"),
    ({"prompt": [1, 999999]}, 400, "prompt"),                          # id outside the vocabulary
    ({"prompt": []}, 400, "prompt"),
    ({"prompt": [1, 2], "model": "gpt-4"}, 404, "model"),              # unknown model
    ({"prompt": [1, 2], "n": 100}, 400, "n"),
    ({"prompt": [1, 2], "n": 10, "max_tokens": 4000}, 400, "n"),       # n x max_tokens over the limit
    ({"prompt": [1, 2], "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ({"prompt": [1, 2], "response_format": {"type": "json_schema"}}, 400, "response_format"),
    ({"prompt": [1, 2], "logprobs": 21}, 400, "logprobs"),
])
def test_bad_requests(srv, body, status, param):
    got, data = srv.post("/v1/completions", body)
    assert got == status, data
    err = data["error"]
    assert err["code"] == status and err["message"] and err["type"]
    if param:
        assert err["param"] == param


def test_context_length_message(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=NAME, prompt=PROMPT, max_tokens=4095)
    assert "maximum context length is 4096 tokens" in str(e.value)


def test_invalid_utf8_and_nul(srv):
    status, _, _ = srv.request("POST", "/v1/completions", b'{"prompt": "caf\xc3(", "max_tokens": 2}')
    assert status == 400
    status, _, _ = srv.request("POST", "/v1/completions", b'{"prompt": "a\\u0000b"}')
    assert status == 400
    status, _, _ = srv.request("POST", "/v1/completions", b'{"prompt": "\\ud800"}')
    assert status == 400


def test_routes_methods_and_no_tokenizer(srv, client):
    assert srv.request("GET", "/v1/completions")[0] == 405
    status, headers, _ = srv.request("DELETE", "/v1/models")
    assert status == 405 and headers.get("Allow") == "GET"
    assert srv.request("GET", "/nope")[0] == 404
    assert srv.request("GET", "/health")[0] == 200
    status, _, body = srv.request("GET", "/version")
    assert status == 200 and "version" in json.loads(body)
    models = client.models.list()
    assert [m.id for m in models.data] == [NAME]
    # no tokenizer in the tiny checkpoints: text paths say so
    assert srv.post("/tokenize", {"prompt": "hi"})[0] == 501
    assert srv.post("/detokenize", {"tokens": [1]})[0] == 501
    with pytest.raises(openai.APIStatusError) as e:
        client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}])
    assert e.value.status_code == 501
    assert srv.post("/v1/completions", {"prompt": "text"})[0] == 501


def test_body_limits_and_slow_clients(srv):
    big = b'{"prompt": [' + b"1," * (5 << 20) + b'1]}'
    status, _, body = srv.request("POST", "/v1/completions", big)
    assert status == 413
    # a body that never finishes: the connection is closed after --timeout
    s = srv.raw_socket()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: 100\r\n\r\n{\"prompt\": [1,")
    t0 = time.monotonic()
    s.settimeout(10)
    try:
        got = s.recv(4096)
    except (ConnectionResetError, socket.timeout):
        got = b""
    assert got == b"" and time.monotonic() - t0 < 9
    s.close()
    # headers that never end
    s = srv.raw_socket()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
    s.settimeout(10)
    try:
        s.recv(4096)
    except (ConnectionResetError, socket.timeout):
        pass
    s.close()
    assert srv.request("GET", "/health")[0] == 200


def test_disconnect_cancels(srv):
    before = srv.metrics()
    s = srv.raw_socket()
    body = json.dumps({"prompt": PROMPT, "max_tokens": 3000, "temperature": 0, "stream": True, "ignore_eos": True}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
              + str(len(body)).encode() + b"\r\n\r\n" + body)
    assert b"data: " in recv_until(s, b"data: ")
    s.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        m = srv.metrics()
        aborted = m.get("vllm:request_success_total", 0) - before.get("vllm:request_success_total", 0)
        if m["vllm:num_requests_running"] == 0 and aborted >= 1:
            break
        time.sleep(0.05)
    assert m["vllm:num_requests_running"] == 0
    assert m["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] < 3000


def test_fuzzed_requests_do_not_crash(srv):
    rng = random.Random(5)
    fields = ["prompt", "max_tokens", "temperature", "top_p", "top_k", "min_p", "stop", "n", "logprobs", "echo",
              "stream", "stream_options", "seed", "stop_token_ids", "min_tokens", "messages", "tools", "model",
              "presence_penalty", "ignore_eos", "response_format", "cache_salt"]
    values = [None, True, False, 0, -1, 1, 2, 3.5, 1e300, -1e300, "", "x", "\u00e9\u4e2d", [], [1], [1, 2, 3], [[1, 2], [3]],
              {}, {"include_usage": True}, {"type": "json_object"}, ["a", "b"], [-5], [10 ** 30], "\ud7ff"]
    for i in range(300):
        body = {k: rng.choice(values) for k in rng.sample(fields, rng.randint(0, 6))}
        if rng.random() < 0.7:
            body["prompt"] = [rng.randint(0, 319) for _ in range(rng.randint(1, 6))]
        if body.get("max_tokens") not in (None, 1, 2):
            body["max_tokens"] = 2
        path = rng.choice(["/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"])
        raw = json.dumps(body)
        if rng.random() < 0.2:
            cut = rng.randint(0, len(raw))
            raw = raw[:cut] + rng.choice(["", "\x00", "\\", "\"", "}", "\xff"]) + raw[cut:]
        status, _, data = srv.request("POST", path, raw.encode("utf-8", "surrogatepass"))
        assert status in (200, 400, 404, 413, 501), (status, raw, data)
        if status == 200 and not body.get("stream"):
            json.loads(data)
    assert srv.alive()


# ---- prefix cache -----------------------------------------------------------------

def test_prefix_cache_reuse_is_exact_and_skips_work(srv):
    rng = random.Random(3)
    turn1 = [rng.randint(0, 318) for _ in range(1200)]
    req = {"prompt": turn1, "max_tokens": 8, "temperature": 0, "return_token_ids": True, "cache_salt": "t1"}
    s1, r1 = srv.post("/v1/completions", req)
    assert s1 == 200 and r1["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    # the follow-up: the whole first turn, its answer, and new tokens
    turn2 = turn1 + r1["choices"][0]["token_ids"] + [rng.randint(0, 318) for _ in range(40)]
    s2, r2 = srv.post("/v1/completions", {**req, "prompt": turn2})
    cached = r2["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= len(turn1) + 8 - 1
    s3, r3 = srv.post("/v1/completions", {**req, "prompt": turn2, "cache_prompt": False})
    assert r3["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert r2["choices"][0]["token_ids"] == r3["choices"][0]["token_ids"]
    # a repeat of the same prompt reuses all but its last token
    s4, r4 = srv.post("/v1/completions", {**req, "prompt": turn2})
    assert r4["usage"]["prompt_tokens_details"]["cached_tokens"] == len(turn2) - 1
    assert r4["choices"][0]["token_ids"] == r3["choices"][0]["token_ids"]
    # another salt sees nothing
    s5, r5 = srv.post("/v1/completions", {**req, "prompt": turn2, "cache_salt": "other"})
    assert r5["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_choices_share_one_prompt_evaluation(srv):
    rng = random.Random(8)
    prompt = [rng.randint(0, 318) for _ in range(900)]
    before = srv.metrics()["vllm:prefix_cache_hits_total"]
    status, r = srv.post("/v1/completions", {"prompt": prompt, "max_tokens": 6, "temperature": 0, "n": 3,
                                             "return_token_ids": True, "cache_salt": "n3"})
    assert status == 200
    hits = srv.metrics()["vllm:prefix_cache_hits_total"] - before
    assert hits >= 2 * (len(prompt) - 1)  # choices 1 and 2 restored choice 0's checkpoint
    ids = [c["token_ids"] for c in r["choices"]]
    assert ids[0] == ids[1] == ids[2]  # greedy from an exact copy of the same state
    alone = srv.post("/v1/completions", {"prompt": prompt, "max_tokens": 6, "temperature": 0, "cache_prompt": False,
                                         "return_token_ids": True})[1]
    assert alone["choices"][0]["token_ids"] == ids[0]


def test_prefix_cache_is_bounded():
    with Server("tiny-a", "--parallel", "1", "--prefix-cache-mb", "1") as s:
        rng = random.Random(4)
        for i in range(12):
            p = [rng.randint(0, 318) for _ in range(400)]
            assert s.post("/v1/completions", {"prompt": p, "max_tokens": 2, "temperature": 0})[0] == 200
        m = s.metrics()
        assert 0 < m["qwen35:prefix_cache_bytes"] <= 1 << 20
        assert m["qwen35:prefix_cache_capacity_bytes"] == 1 << 20
        assert m["qwen35:prefix_cache_evictions_total"] > 0
        assert m["qwen35:prefix_cache_lookup_misses_total"] >= 12
    # --prefix-cache-bytes takes a suffix; the same prompt twice is a lookup hit
    with Server("tiny-a", "--parallel", "1", "--prefix-cache-bytes", "3M") as s:
        for _ in range(2):
            assert s.post("/v1/completions", {"prompt": PROMPT * 20, "max_tokens": 2, "temperature": 0})[0] == 200
        m = s.metrics()
        assert m["qwen35:prefix_cache_capacity_bytes"] == 3 << 20
        assert m["qwen35:prefix_cache_lookup_hits_total"] >= 1 and m["qwen35:prefix_cache_entries"] >= 1
    from serve_util import BIN
    for bad in ("-1", "1T", "12Mb", ""):
        r = subprocess.run([BIN, "serve", "--prefix-cache-bytes", bad], capture_output=True, text=True, timeout=10)
        assert r.returncode == 2 and "bad value" in r.stderr, (bad, r.stderr)


# ---- concurrency and auth ----------------------------------------------------------

def test_concurrent_streams_match_serial(client):
    prompts = [[3 + i, 100 + i, 7] * (1 + i % 3) for i in range(8)]
    serial = [greedy(client, p, n=16).choices[0].text for p in prompts]

    def stream(p):
        out = ""
        for ch in client.completions.create(model=NAME, prompt=p, max_tokens=16, temperature=0, stream=True):
            out += ch.choices[0].text if ch.choices else ""
        return out

    with cf.ThreadPoolExecutor(8) as ex:
        assert list(ex.map(stream, prompts)) == serial


def test_queue_full_is_refused():
    with Server("tiny-a", "--parallel", "1", "--max-queue", "1") as s:
        body = {"prompt": PROMPT, "max_tokens": 400, "temperature": 0, "ignore_eos": True}
        with cf.ThreadPoolExecutor(6) as ex:
            results = list(ex.map(lambda _: s.post("/v1/completions", body), range(6)))
        codes = sorted(r[0] for r in results)
        assert 200 in codes and 429 in codes
        busy = [r[1] for r in results if r[0] == 429][0]
        assert "busy" in busy["error"]["message"]


def test_api_key(tmp_path):
    key = tmp_path / "key"
    key.write_text("s3cret-key\n")
    with Server("tiny-a", "--api-key-file", str(key)) as s:
        assert s.request("GET", "/health")[0] == 200
        assert s.request("GET", "/metrics")[0] == 200
        status, _, body = s.request("GET", "/v1/models")
        assert status == 401 and json.loads(body)["error"]["code"] == 401
        assert s.request("GET", "/v1/models", headers={"Authorization": "Bearer s3cret-kez"})[0] == 401
        assert s.request("GET", "/v1/models", headers={"Authorization": "Basic s3cret-key"})[0] == 401
        assert s.post("/tokenize", {"prompt": "x"})[0] == 401
        bad = openai.OpenAI(base_url=s.url + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.completions.create(model=NAME, prompt=PROMPT, max_tokens=2)
        good = openai.OpenAI(base_url=s.url + "/v1", api_key="s3cret-key", max_retries=0)
        # greedy and past EOS: an unseeded sample may end at once, which is not what this test is about
        r = good.completions.create(model=NAME, prompt=PROMPT, max_tokens=2, temperature=0, extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 2


def test_metrics_names(srv, client):
    greedy(client, n=3)
    m = srv.metrics()
    for name in ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:prompt_tokens_total",
                 "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_count",
                 "vllm:inter_token_latency_seconds_count", "vllm:spec_decode_num_drafts_total",
                 "vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total",
                 "process_resident_memory_bytes", "process_resident_memory_peak_bytes"]:
        assert name in m, name
    assert m["vllm:generation_tokens_total"] >= 3 and m["process_resident_memory_bytes"] > 0
    # the tiny models carry an MTP head: a lone greedy request speculates
    assert m["vllm:spec_decode_num_drafts_total"] > 0
    assert m["vllm:spec_decode_num_draft_tokens_total"] >= m["vllm:spec_decode_num_drafts_total"]


def test_speculation_gives_the_plain_greedy_tokens():
    body = {"prompt": PROMPT, "max_tokens": 40, "temperature": 0, "return_token_ids": True, "logprobs": 2}
    with Server("tiny-b", "--spec-k", "2") as s:
        spec = s.post("/v1/completions", body)[1]["choices"][0]
        m = s.metrics()
        assert m["vllm:spec_decode_num_draft_tokens_total"] > 0
        # accepted drafts by position in a step (vLLM's per-position counter): they add up to the total
        assert m["vllm:spec_decode_num_accepted_tokens_per_pos_total"] == m["vllm:spec_decode_num_accepted_tokens_total"]
        text = s.request("GET", "/metrics")[2].decode()
        assert 'position="0"' in text and 'position="1"' in text and 'position="2"' not in text
    with Server("tiny-b", "--spec-k", "0") as s:
        plain = s.post("/v1/completions", body)[1]["choices"][0]
        assert s.metrics()["vllm:spec_decode_num_draft_tokens_total"] == 0
    assert spec["token_ids"] == plain["token_ids"] and spec["text"] == plain["text"]
    for a, b in zip(spec["logprobs"]["token_logprobs"], plain["logprobs"]["token_logprobs"]):
        assert abs(a - b) < 1e-3


def test_sampled_requests_speculate_and_stay_seeded(srv, client):
    """Sampled requests go through speculative rejection sampling with their own sampler settings: the
    counters move, and a seeded request gives the same tokens every time."""
    kw = dict(model=NAME, prompt=PROMPT, max_tokens=24, temperature=0.8, top_p=0.95, seed=4321, presence_penalty=0.3,
              frequency_penalty=0.2, extra_body={"top_k": 40, "min_p": 0.01, "repetition_penalty": 1.1, "min_tokens": 4})
    before = srv.metrics()
    first = client.completions.create(**kw).choices[0].text
    m = srv.metrics()
    drafts = m["vllm:spec_decode_num_draft_tokens_total"] - before["vllm:spec_decode_num_draft_tokens_total"]
    steps = m["vllm:spec_decode_num_drafts_total"] - before["vllm:spec_decode_num_drafts_total"]
    accepted = m["vllm:spec_decode_num_accepted_tokens_total"] - before["vllm:spec_decode_num_accepted_tokens_total"]
    assert steps > 0 and drafts >= steps and 0 <= accepted <= drafts
    assert len(ids_of(first)) == 24
    for _ in range(2):
        assert client.completions.create(**kw).choices[0].text == first
    assert client.completions.create(**{**kw, "seed": 4322}).choices[0].text != first


def test_speculation_with_penalties_and_min_tokens_gives_the_plain_greedy_tokens():
    """Greedy requests with penalties, min_tokens and stop ids speculate through the sampler's (one-hot)
    distribution: the tokens are exactly those of plain decoding."""
    body = {"prompt": PROMPT, "max_tokens": 40, "temperature": 0, "return_token_ids": True, "repetition_penalty": 1.4,
            "presence_penalty": 0.6, "frequency_penalty": 0.3}
    outs = []
    for k in ("2", "0"):
        with Server("tiny-b", "--spec-k", k) as s:
            first = s.post("/v1/completions", {**body, "max_tokens": 1})[1]["choices"][0]["token_ids"][0]
            got = [s.post("/v1/completions", body)[1]["choices"][0]["token_ids"],
                   s.post("/v1/completions", {**body, "min_tokens": 6, "stop_token_ids": [first]})[1]["choices"][0]["token_ids"]]
            drafts = s.metrics()["vllm:spec_decode_num_draft_tokens_total"]
            assert (drafts > 0) == (k != "0")
            outs.append(got)
    assert outs[0] == outs[1]
    assert len(outs[0][0]) == 40 and len(outs[0][1]) >= 6


def test_draft_vocab_server_gives_the_plain_tokens(tmp_path):
    dv = tmp_path / "dv.txt"
    dv.write_text("\n".join(str(i) for i in range(1, 384, 2)) + "\n")  # half of tiny-b's ids
    body = {"prompt": PROMPT, "max_tokens": 40, "temperature": 0, "return_token_ids": True}
    with Server("tiny-b", "--spec-k", "2", "--draft-vocab", str(dv)) as s:
        spec = s.post("/v1/completions", body)[1]["choices"][0]["token_ids"]
        sampled = s.post("/v1/completions", {**body, "temperature": 0.9, "seed": 3})[1]["choices"][0]["token_ids"]
        assert s.post("/v1/completions", {**body, "temperature": 0.9, "seed": 3})[1]["choices"][0]["token_ids"] == sampled
        assert s.metrics()["vllm:spec_decode_num_draft_tokens_total"] > 0
    with Server("tiny-b", "--spec-k", "0") as s:
        plain = s.post("/v1/completions", body)[1]["choices"][0]["token_ids"]
    assert spec == plain and len(sampled) == 40


def test_kv_cache_q8_server_says_so_and_gives_runs_tokens():
    """serve --kv-cache q8: the startup line names it with its smaller bytes per position, and greedy tokens
    (speculating) are `qwen35 run --kv-cache q8`'s."""
    body = {"prompt": PROMPT, "max_tokens": 30, "temperature": 0, "return_token_ids": True}
    import re
    per_pos = {}
    for kv in ("f32", "q8"):
        with Server("tiny-b", "--kv-cache", kv, "--spec-k", "2") as s:
            line = next(x for x in s.log if "bytes per position" in x)
            m = re.search(r"(\d+) bytes per position, KV cache (\w+)", line)
            assert m and m.group(2) == kv, line
            per_pos[kv] = int(m.group(1))
            got = s.post("/v1/completions", body)[1]["choices"][0]["token_ids"]
    assert per_pos["q8"] < per_pos["f32"], per_pos
    from serve_util import BIN
    run = subprocess.run([BIN, "run", "-m", str(MODELS / "tiny-b"), "--prompt-ids",
                          ",".join(map(str, PROMPT)), "-n", "30", "--kv-cache", "q8", "-t", "1"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert got == [int(t) for t in run.stdout.strip().split(",")]


def test_bench_runs_against_serve(srv, tmp_path):
    """qwen35 bench reads this server's streams, usage and metrics."""
    prompt = tmp_path / "p.txt"
    prompt.write_text("ignored")  # text prompts need a tokenizer: expect a clear failure, not a hang
    from serve_util import BIN
    proc = subprocess.run([BIN, "bench", "--url", srv.url, "--workload", str(prompt), "--warmups", "0", "--runs", "1",
                           "--max-tokens", "4", "--timeout", "20"], capture_output=True, text=True, timeout=60)
    assert "501" in proc.stdout + proc.stderr or "tokenizer" in proc.stdout + proc.stderr


# ---- load ------------------------------------------------------------------------------

def test_load_streams_no_errors_flat_memory(srv, client):
    seconds = float(os.environ.get("Q35_LOAD_SECONDS", "8"))
    deadline = time.monotonic() + seconds
    errors, done = [], [0]

    def worker(i):
        rng = random.Random(i)
        while time.monotonic() < deadline:
            try:
                n = 0
                for ch in client.completions.create(model=NAME, prompt=[rng.randint(0, 318) for _ in range(rng.randint(1, 64))],
                                                    max_tokens=rng.randint(1, 48), temperature=0.7, stream=True,
                                                    stream_options={"include_usage": True}):
                    n += 1
                done[0] += 1
            except Exception as e:  # noqa: BLE001
                errors.append(repr(e))

    m0 = srv.metrics()
    # the prefix cache grows up to its budget by design: what it holds is not a leak
    warm = m0["process_resident_memory_bytes"] - m0["qwen35:prefix_cache_bytes"]
    with cf.ThreadPoolExecutor(8) as ex:
        list(ex.map(worker, range(8)))
    m = srv.metrics()
    assert not errors, errors[:3]
    assert done[0] > 8
    assert m["vllm:num_requests_running"] == 0
    rest = m["process_resident_memory_bytes"] - m["qwen35:prefix_cache_bytes"]
    growth = rest - warm
    print(f"load: {done[0]} streams in {seconds:.0f} s; RSS less the prefix cache {warm / 2**20:.1f} -> "
          f"{rest / 2**20:.1f} MiB; prefix cache {m['qwen35:prefix_cache_bytes'] / 2**20:.1f} MiB "
          f"in {m['qwen35:prefix_cache_entries']:.0f} entries")
    assert growth < 64 << 20


def test_queued_stream_outlives_idle_timeout_and_shutdown_ends_streams():
    # --drain-timeout 0: the signal cuts what runs (test_hostile.py lets it finish)
    with Server("tiny-a", "--parallel", "1", "--timeout", "1", "--drain-timeout", "0") as s:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=60)
        long_body = {"prompt": PROMPT, "max_tokens": 4000, "temperature": 0, "ignore_eos": True}
        with cf.ThreadPoolExecutor(2) as ex:
            first = ex.submit(s.post, "/v1/completions", {**long_body, "max_tokens": 800}, timeout=120)
            time.sleep(0.3)
            # waits behind the first for longer than --timeout before its first byte
            out = "".join(ch.choices[0].text for ch in c.completions.create(
                model=NAME, prompt=PROMPT, max_tokens=4, temperature=0, stream=True))
            assert len(ids_of(out)) == 4
            assert first.result()[0] == 200
        # a stream cut by shutdown ends with an error event, then [DONE]
        sock = s.raw_socket()
        body = json.dumps({**long_body, "stream": True}).encode()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
                     + str(len(body)).encode() + b"\r\n\r\n" + body)
        raw = recv_until(sock, b"data: ")
        s.proc.send_signal(15)
        sock.settimeout(10)
        while True:
            part = sock.recv(65536)
            if not part:
                break
            raw += part
        sock.close()
        assert s.proc.wait(timeout=10) == 0
        text = raw.decode(errors="replace")
        assert '"error"' in text and "shutting down" in text
        assert "data: [DONE]" in text.split('"error"')[-1]


def test_health_is_503_while_loading_and_a_signal_ends_the_load(tmp_path):
    """config.json is a FIFO nobody writes: loading blocks on it."""
    model = tmp_path / "m"
    model.mkdir()
    os.mkfifo(model / "config.json")
    from serve_util import BIN
    proc = subprocess.Popen([BIN, "serve", "-m", str(model), "--port", "0"], stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        port = int(line.split("127.0.0.1:")[1].split()[0])
        import http.client
        for path in ("/health", "/v1/models", "/metrics"):
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            c.request("GET", path)
            r = c.getresponse()
            assert r.status == 503 and json.loads(r.read())["error"]["message"] == "Loading model"
        proc.send_signal(15)
        assert proc.wait(timeout=10) != 0
        assert "while loading" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
