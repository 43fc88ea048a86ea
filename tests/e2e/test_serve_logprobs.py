"""End-to-end tests of the prompt's log-probabilities on /v1/completions:
`echo` with `logprobs` (the prompt's tokens first in tokens, token_logprobs,
top_logprobs and text_offset, the first one null, as vLLM) and vLLM's
`prompt_logprobs` field. The values are checked against the demo model's own
logits (`qwen35 logits`), streaming and not, with n > 1, several prompts,
prompt chunks of a few rows and a prefix cache that already holds the prompt."""

import json
import math
import os
import struct
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from serve_util import BIN, ROOT, Server, sse_events  # noqa: E402

openai = pytest.importorskip("openai")

DEMO_DIR = ROOT / "models" / "qwen35-demo"
DEMO = "../../../models/qwen35-demo"
pytestmark = pytest.mark.skipif(not (DEMO_DIR / "model.safetensors").exists(), reason="demo model missing")

NAME = "Qwen/Qwen3.5-9B"
TEXT = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n        return n\n"
TOL = 1e-5  # the server's prompt chunks of 5 rows against one evaluation of the whole prompt (1.3e-6 measured)


@pytest.fixture(scope="module")
def srv():
    # chunks of 5 prompt tokens: the rows of a prompt come in several evaluations
    with Server(DEMO, "--parallel", "2", "--prefill-chunk", "5") as s:
        yield s


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def tokenize(srv, text):
    status, r = srv.post("/tokenize", {"prompt": text})
    assert status == 200, r
    return r["tokens"]


def reference(ids, tmp_path):
    """Each row's log-softmax from `qwen35 logits` (one evaluation of the whole prompt)."""
    out = tmp_path / "logits.f32"
    p = subprocess.run([BIN, "logits", "-m", str(DEMO_DIR), "--prompt-ids", ",".join(map(str, ids)), "-o", str(out), "-t", "1"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    raw = out.read_bytes()
    V = len(raw) // 4 // len(ids)
    rows = []
    for i in range(len(ids)):
        row = struct.unpack_from("<%df" % V, raw, 4 * V * i)
        mx = max(row)
        lse = mx + math.log(sum(math.exp(x - mx) for x in row))
        rows.append([x - lse for x in row])
    return rows


@pytest.fixture(scope="module")
def ref(srv, tmp_path_factory):
    ids = tokenize(srv, TEXT)
    assert len(ids) > 12  # several chunks of 5
    return ids, reference(ids, tmp_path_factory.mktemp("plp"))


def token_str(srv, i):
    status, r = srv.post("/detokenize", {"tokens": [i]})
    assert status == 200
    return r["prompt"]


def check_prompt_rows(srv, lp, ids, rows, k):
    """The first len(ids) entries of a completions logprobs object against the reference."""
    n = len(ids)
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["text_offset"][0] == 0
    for i in range(1, n):
        want = rows[i - 1][ids[i]]
        assert abs(lp["token_logprobs"][i] - want) < TOL, (i, lp["token_logprobs"][i], want)
        top = lp["top_logprobs"][i]
        best = sorted(range(len(rows[i - 1])), key=lambda t: (-rows[i - 1][t], t))[:k]
        # vLLM's entry: the prompt token itself, then the k most likely
        assert list(top)[0] == lp["tokens"][i]
        assert set(top) == {lp["tokens"][i]} | {token_str(srv, t) for t in best}
        for t in best:
            assert abs(top[token_str(srv, t)] - rows[i - 1][t]) < TOL
        assert lp["text_offset"][i] == lp["text_offset"][i - 1] + len(lp["tokens"][i - 1].encode())
    assert "".join(lp["tokens"][:n]) == TEXT


def test_echo_with_logprobs_returns_the_prompt_rows_first(client, srv, ref):
    ids, rows = ref
    r = client.completions.create(model=NAME, prompt=TEXT, max_tokens=4, temperature=0, echo=True, logprobs=3)
    c = r.choices[0]
    lp = c.logprobs.model_dump()
    assert c.text.startswith(TEXT)
    assert len(lp["tokens"]) == len(ids) + 4 and len(lp["top_logprobs"]) == len(ids) + 4
    check_prompt_rows(srv, lp, ids, rows, 3)
    # the generated rows follow, each with its own token first as well
    for i in range(len(ids), len(ids) + 4):
        assert list(lp["top_logprobs"][i])[0] == lp["tokens"][i] and lp["token_logprobs"][i] <= 0
    # the first generated token (greedy) is the best of the prompt's last row
    last = rows[len(ids) - 1]
    assert abs(lp["token_logprobs"][len(ids)] - max(last)) < TOL
    # vLLM's prompt_logprobs rides along: id -> logprob, rank, decoded_token
    plp = c.model_extra["prompt_logprobs"]
    assert plp[0] is None and len(plp) == len(ids)
    for i in range(1, len(ids)):
        e = plp[i][str(ids[i])]
        row = rows[i - 1]
        assert abs(e["logprob"] - row[ids[i]]) < TOL
        assert e["rank"] == 1 + sum(x > row[ids[i]] for x in row)
        assert e["decoded_token"] == lp["tokens"][i]


def test_streaming_sends_the_prompt_rows_with_the_echo(srv, ref):
    ids, rows = ref
    body = {"model": NAME, "prompt": TEXT, "max_tokens": 3, "temperature": 0, "echo": True, "logprobs": 2}
    status, _, raw = srv.request("POST", "/v1/completions", dict(body, stream=True))
    assert status == 200
    chunks = [json.loads(e) for e in sse_events(raw) if e != "[DONE]"]
    first = chunks[0]["choices"][0]
    assert first["text"] == TEXT
    check_prompt_rows(srv, first["logprobs"], ids, rows, 2)
    streamed = [t for ch in chunks[1:] for t in (ch["choices"][0]["logprobs"] or {}).get("tokens", [])]
    status, whole = srv.post("/v1/completions", body)
    assert status == 200
    assert whole["choices"][0]["logprobs"]["tokens"] == first["logprobs"]["tokens"] + streamed
    assert whole["choices"][0]["logprobs"]["token_logprobs"][:len(ids)] == first["logprobs"]["token_logprobs"]


def test_every_choice_and_every_prompt_gets_its_rows(client, srv, ref, tmp_path):
    ids, rows = ref
    other = "import os\nprint(os.getcwd())\n"
    oids = tokenize(srv, other)
    orows = reference(oids, tmp_path)
    r = client.completions.create(model=NAME, prompt=[TEXT, other], max_tokens=3, temperature=0.9, seed=5, n=3,
                                  echo=True, logprobs=1)
    assert len(r.choices) == 6
    for c in r.choices:
        p_ids, p_rows = (ids, rows) if c.index < 3 else (oids, orows)
        lp = c.logprobs.model_dump()
        assert len(lp["tokens"]) == len(p_ids) + 3
        for i in range(1, len(p_ids)):
            assert abs(lp["token_logprobs"][i] - p_rows[i - 1][p_ids[i]]) < TOL


def test_a_cached_prefix_does_not_hide_the_prompt_rows(client, srv, ref):
    ids, rows = ref
    # fill the prefix cache and the warm slot with this very prompt first
    for _ in range(2):
        client.completions.create(model=NAME, prompt=TEXT, max_tokens=2, temperature=0)
    r = client.completions.create(model=NAME, prompt=TEXT, max_tokens=2, temperature=0, echo=True, logprobs=0)
    lp = r.choices[0].logprobs.model_dump()
    for i in range(1, len(ids)):
        assert abs(lp["token_logprobs"][i] - rows[i - 1][ids[i]]) < TOL
        assert list(lp["top_logprobs"][i]) == [lp["tokens"][i]]  # logprobs=0: the token alone


def test_prompt_logprobs_without_echo_and_bad_values(srv, ref):
    ids, rows = ref
    status, r = srv.post("/v1/completions", {"model": NAME, "prompt": ids, "max_tokens": 1, "prompt_logprobs": 2})
    assert status == 200, r
    c = r["choices"][0]
    assert c["logprobs"] is None and not c["text"].startswith(TEXT)
    plp = c["prompt_logprobs"]
    assert plp[0] is None and all(len(e) in (2, 3) for e in plp[1:])
    for i in range(1, len(ids)):
        assert abs(plp[i][str(ids[i])]["logprob"] - rows[i - 1][ids[i]]) < TOL
    for bad in (21, -1, "2", 1.5):
        status, r = srv.post("/v1/completions", {"model": NAME, "prompt": ids, "prompt_logprobs": bad})
        assert status == 400 and r["error"]["param"] == "prompt_logprobs", r
    status, r = srv.post("/v1/completions", {"model": NAME, "prompt": ids, "echo": True, "logprobs": 21})
    assert status == 400 and r["error"]["param"] == "logprobs"
    # a one-token prompt has only the null row
    status, r = srv.post("/v1/completions", {"model": NAME, "prompt": ids[:1], "max_tokens": 1, "echo": True, "logprobs": 1})
    assert status == 200 and r["choices"][0]["logprobs"]["token_logprobs"][0] is None
    assert r["choices"][0]["prompt_logprobs"] == [None]


def test_max_tokens_zero_with_echo_scores_the_prompt_alone(client, srv, ref):
    # lm-eval-harness's loglikelihood request: echo, logprobs, max_tokens 0 (vLLM's echo without generation)
    ids, rows = ref
    r = client.completions.create(model=NAME, prompt=TEXT, max_tokens=0, temperature=0, echo=True, logprobs=1)
    c = r.choices[0]
    lp = c.logprobs.model_dump()
    assert c.text == TEXT and len(lp["tokens"]) == len(ids)
    check_prompt_rows(srv, lp, ids, rows, 1)
    body = {"model": NAME, "prompt": ids, "max_tokens": 0, "echo": True, "logprobs": 1, "stream": True}
    status, _, raw = srv.request("POST", "/v1/completions", body)
    assert status == 200
    chunks = [json.loads(e) for e in sse_events(raw) if e != "[DONE]"]
    assert "".join(ch["choices"][0]["text"] for ch in chunks) == TEXT
    assert [t for ch in chunks for t in (ch["choices"][0]["logprobs"] or {}).get("tokens", [])] == lp["tokens"]
    assert chunks[-1]["choices"][0]["finish_reason"] in ("length", "stop")
    status, r = srv.post("/v1/completions", {"model": NAME, "prompt": ids, "max_tokens": 0})
    assert status == 400 and r["error"]["param"] == "max_tokens", r
