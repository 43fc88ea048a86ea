"""`qwen35 bench` against a real `qwen35 serve` on the embedded demo model:
the seed's protocol end to end, with speculation counters read from the
server's /metrics and one distinct completion across repeats."""

import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from serve_util import BIN, ROOT, Server  # noqa: E402


class DemoServer(Server):
    def __init__(self, *args):
        super().__init__("tiny-a", *args)
        self.args[self.args.index("-m") + 1] = str(ROOT / "models" / "qwen35-demo")


def test_bench_against_qwen35_serve(tmp_path):
    out = tmp_path / "speed.json"
    with DemoServer("--served-model-name", "demo") as srv:
        p = subprocess.run([BIN, "bench", "--url", srv.url, "--workload", "short,code", "--warmups", "1", "--runs", "3",
                            "--max-tokens", "24", "--output", str(out)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr + p.stdout
    report = json.loads(out.read_text())
    assert report["complete"] is True
    assert len(report["workloads"]) == 2
    for w in report["workloads"]:
        runs = [r for r in w["runs"] if not r["warmup"]]
        assert len(runs) == 3 and all(r["ok"] for r in runs)
        assert all(r["completion_tokens"] == 24 for r in runs)  # ignore_eos: exactly max_tokens
        summary = w["summary"]
        assert summary["distinct_completions"] == 1 and summary["all_max_tokens"]  # deterministic at temperature 0
        assert summary["spec_decode"] and summary["spec_decode"]["draft_tokens"] > 0
    # greedy requests speculate with the MTP head; the counters came from /metrics
    spec = report["spec_decode"]
    assert spec["drafts"] > 0 and 0 <= spec["accepted_tokens"] <= spec["draft_tokens"], spec
    assert spec["source"] == "metrics" and report["metrics_available"]
