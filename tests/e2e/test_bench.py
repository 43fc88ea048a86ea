"""End-to-end tests of `qwen35 bench` against the fake OpenAI-compatible
server in fake_openai_server.py, which stands in for vLLM and llama-server.
Every server listens on a free 127.0.0.1 port for one test."""

import json
import os
import pathlib
import socket
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from fake_openai_server import FakeServer  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = os.environ.get("Q35_BIN", str(ROOT / "build" / "qwen35"))


def bench(*args, timeout=60):
    proc = subprocess.run([BIN, "bench", *args], capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


def prompt_of(name):
    return (ROOT / "bench" / "workloads" / (name + ".txt")).read_text().rstrip("\r\n")


def test_protocol_and_report(tmp_path):
    out = tmp_path / "speed.json"
    with FakeServer("normal") as srv:
        rc, stdout, stderr = bench("--url", srv.url + "/v1", "--workload", "all", "--max-tokens", "24",
                                   "--output", str(out))
        requests = list(srv.state.requests)
    assert rc == 0, stderr
    assert "decode tok/s" in stdout and "distinct" in stdout

    # What went over the wire: the seed's protocol.
    assert len(requests) == 4 * (2 + 5)
    for req in requests:
        assert req["model"] == "fake-qwen"  # from /v1/models
        assert req["temperature"] == 0
        assert req["stream"] is True
        assert req["stream_options"] == {"include_usage": True}
        assert req["ignore_eos"] is True
        assert req["max_tokens"] == 24
        assert req["cache_prompt"] is False
    assert len({r["cache_salt"] for r in requests}) == len(requests)
    assert requests[0]["prompt"] == prompt_of("short")
    assert requests[-1]["prompt"] == prompt_of("reasoning")

    report = json.loads(out.read_text())
    assert report["schema"] == "qwen35-bench/1"
    assert report["complete"] is True and report["error"] is None
    assert report["metrics_available"] is True
    assert [w["name"] for w in report["workloads"]] == ["short", "code", "long", "reasoning"]
    for w in report["workloads"]:
        runs = w["runs"]
        assert [r["label"] for r in runs] == ["warmup1", "warmup2", "run1", "run2", "run3", "run4", "run5"]
        measured = [r for r in runs if not r["warmup"]]
        for r in runs:
            assert r["ok"] and r["error"] is None
            assert r["completion_tokens"] == 24 and r["completion_tokens_source"] == "usage"
            assert r["ttft_ms"] > 0 and r["total_ms"] >= r["ttft_ms"]
            assert len(r["sha256"]) == 64
        s = w["summary"]
        assert s["measured_runs"] == 5
        assert s["distinct_completions"] == 1
        assert s["all_max_tokens"] is True
        rates = sorted(r["decode_tok_s"] for r in measured)
        assert s["decode_tok_s"]["min"] == pytest.approx(rates[0])
        assert s["decode_tok_s"]["median"] == pytest.approx(rates[2])
        assert s["decode_tok_s"]["max"] == pytest.approx(rates[4])
        median_run = runs[s["median_run"]]
        assert not median_run["warmup"]
        assert median_run["decode_tok_s"] == pytest.approx(s["decode_tok_s"]["median"])
        # The fake server drafts max_tokens/2 per request and accepts 5/6 of them.
        for r in measured:
            assert r["spec_decode"]["source"] == "metrics"
            assert r["spec_decode"]["draft_tokens"] == 12 and r["spec_decode"]["accepted_tokens"] == 10
        assert s["spec_decode"]["draft_tokens"] == 60 and s["spec_decode"]["accepted_tokens"] == 50
        assert s["spec_decode"]["acceptance_rate"] == pytest.approx(50 / 60)
        assert w["prompt_tokens"] == len(prompt_of(w["name"]).split())
    assert report["spec_decode"]["draft_tokens"] == 240
    assert report["spec_decode"]["drafts"] == 240
    assert report["server_memory"]["max_sampled_resident_bytes"] == pytest.approx(1.0e9 + 28e6)


def test_distinct_completions_counted():
    with FakeServer("varying") as srv:
        rc, stdout, _ = bench("--url", srv.url, "--workload", "short", "--warmups", "0", "--runs", "3",
                              "--max-tokens", "8")
    assert rc == 0
    assert "3 of 3" in stdout


def test_completion_tokens_from_chunks_without_usage(tmp_path):
    out = tmp_path / "speed.json"
    with FakeServer("nousage") as srv:
        rc, _, stderr = bench("--url", srv.url, "--warmups", "1", "--runs", "1", "--max-tokens", "10",
                              "--output", str(out))
    assert rc == 0, stderr
    run = json.loads(out.read_text())["workloads"][0]["runs"][1]
    assert run["completion_tokens"] == 10 and run["completion_tokens_source"] == "chunks"


def test_llama_server_style_timings(tmp_path):
    out = tmp_path / "speed.json"
    with FakeServer("llama") as srv:
        rc, stdout, stderr = bench("--url", srv.url, "--model", "anything", "--warmups", "0", "--runs", "2",
                                   "--max-tokens", "12", "--output", str(out))
    assert rc == 0, stderr
    report = json.loads(out.read_text())
    assert report["metrics_available"] is False
    assert report["model"] == "anything"
    spec = report["spec_decode"]
    assert spec["source"] == "response"
    assert spec["draft_tokens"] == 12 and spec["accepted_tokens"] == 10
    assert "server peak memory: not reported" in stdout


def test_custom_prompt_file(tmp_path):
    prompt = tmp_path / "mine.txt"
    prompt.write_text("Count to ten.\n\n")
    with FakeServer("normal") as srv:
        rc, stdout, _ = bench("--url", srv.url, "--workload", str(prompt), "--warmups", "0", "--runs", "1",
                              "--max-tokens", "4")
        assert srv.state.requests[0]["prompt"] == "Count to ten."
    assert rc == 0
    assert "mine" in stdout


def test_api_key():
    with FakeServer("unauthorized") as srv:
        rc, _, stderr = bench("--url", srv.url, "--model", "m", "--runs", "1", "--warmups", "0")
        assert rc != 0
        assert "401" in stderr and "Invalid API Key" in stderr and "--api-key" in stderr
        rc, _, stderr = bench("--url", srv.url, "--model", "m", "--api-key", "secret", "--runs", "1",
                              "--warmups", "0", "--max-tokens", "4")
        assert rc == 0, stderr


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_server():
    rc, _, stderr = bench("--url", "http://127.0.0.1:%d" % free_port(), "--timeout", "5")
    assert rc != 0
    assert "cannot reach" in stderr


def test_non_streaming_response():
    with FakeServer("nonstream") as srv:
        rc, _, stderr = bench("--url", srv.url, "--runs", "1", "--warmups", "0", "--max-tokens", "4")
    assert rc != 0
    assert "without streaming" in stderr and "application/json" in stderr


def test_malformed_event():
    with FakeServer("malformed") as srv:
        rc, _, stderr = bench("--url", srv.url, "--runs", "1", "--warmups", "0", "--max-tokens", "4")
    assert rc != 0
    assert "malformed event" in stderr


def test_first_token_timeout():
    with FakeServer("hang") as srv:
        t0 = time.monotonic()
        rc, _, stderr = bench("--url", srv.url, "--runs", "1", "--warmups", "0", "--timeout", "1")
        elapsed = time.monotonic() - t0
    assert rc != 0
    assert "no text within 1 s" in stderr
    assert elapsed < 15


def test_server_dies_mid_stream_keeps_runs(tmp_path):
    out = tmp_path / "speed.json"
    with FakeServer("die:4") as srv:
        rc, stdout, stderr = bench("--url", srv.url, "--max-tokens", "16", "--output", str(out))
    assert rc != 0
    assert "mid-stream" in stderr and "runs so far are in the JSON" in stderr
    report = json.loads(out.read_text())
    assert report["complete"] is False and "mid-stream" in report["error"]
    runs = report["workloads"][0]["runs"]
    assert [r["ok"] for r in runs] == [True, True, True, True, False]
    assert runs[4]["label"] == "run3" and "mid-stream" in runs[4]["error"]
    summary = report["workloads"][0]["summary"]
    assert summary["measured_runs"] == 2
    assert summary["decode_tok_s"]["median"] is not None


def test_server_dies_before_the_first_event():
    with FakeServer("die:0:0") as srv:
        rc, _, stderr = bench("--url", srv.url, "--runs", "1", "--warmups", "0", "--max-tokens", "8")
    assert rc != 0
    assert "after 0 events without data: [DONE]" in stderr and "mid-stream" in stderr


@pytest.mark.parametrize("args, message", [
    ([], "--url is required"),
    (["--url", "127.0.0.1:8000"], "must start with http"),
    (["--url", "http://127.0.0.1:1", "--workload", "nope-not-a-file"], "workload 'nope-not-a-file'"),
    (["--url", "http://127.0.0.1:1", "--runs", "0"], "bad value '0' for --runs"),
    (["--url", "http://127.0.0.1:1", "--frobnicate", "1"], "unknown option"),
])
def test_bad_arguments(args, message):
    rc, _, stderr = bench(*args)
    assert rc == 2
    assert message in stderr
