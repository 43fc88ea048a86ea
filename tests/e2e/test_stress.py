"""A short form of scripts/stress.sh: 16 mixed clients with faults and one
SIGTERM-restart cycle for Q35_STRESS_SECONDS (default 15). The faults test
the server, not the backend, so it runs on the cpu backend only."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, os.path.dirname(__file__))
from serve_util import MODELS  # noqa: E402

pytestmark = [
    pytest.mark.skipif(not (MODELS / "tiny-a" / "config.json").exists(), reason="tiny test models missing"),
    pytest.mark.skipif(os.environ.get("Q35_BACKEND", "cpu") != "cpu", reason="server faults: once, on the cpu backend"),
]


def test_short_soak_with_faults(tmp_path):
    seconds = os.environ.get("Q35_STRESS_SECONDS", "15")
    out = tmp_path / "stress.json"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "stress.py"), "--seconds", seconds, "--out", str(out),
                        "--log", str(tmp_path / "server.log")], capture_output=True, text=True, timeout=float(seconds) + 120)
    print(r.stdout)
    summary = json.loads(out.read_text())
    assert r.returncode == 0 and summary["errors"] == 0, (r.stdout, r.stderr[-2000:])
    assert summary["requests"] > 100 and summary["restarts"] == 1 and summary["faults"] > 5
    log = (tmp_path / "server.log").read_text()
    assert "AddressSanitizer" not in log and "runtime error:" not in log, log[-4000:]
