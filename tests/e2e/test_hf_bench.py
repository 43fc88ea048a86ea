"""scripts/bench_decode_hf.py, the transformers side of gpu-check's decode comparison: its refusals of bad
arguments (no torch needed: they come before it is imported), and where a python with torch and
transformers is at hand (this one, or the reference stack's .venv-ref), a run on a tiny checkpoint's
config on the CPU."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "bench_decode_hf.py"
TINY = ROOT / "tests" / "data" / "models" / "tiny-a"


def run(python, *args):
    p = subprocess.run([python, str(SCRIPT), *args], capture_output=True, text=True, timeout=600, cwd=ROOT)
    return p.returncode, p.stdout, p.stderr


def test_bad_arguments(tmp_path):
    rc, out, err = run(sys.executable, "--config", str(tmp_path / "none"))
    assert rc == 2 and "cannot read a config from" in err, err
    (tmp_path / "config.json").write_text("{not json")
    rc, out, err = run(sys.executable, "--config", str(tmp_path))
    assert rc == 2 and "cannot read a config from" in err, err
    rc, out, err = run(sys.executable, "--config", str(TINY), "--decode", "0")
    assert rc == 2 and "at least 1" in err, err


def test_missing_torch_is_exit_status_2(tmp_path):
    # a torch that cannot be imported (shadowed here) is a clear refusal, not a traceback
    (tmp_path / "torch.py").write_text("raise ImportError('no torch in this test')\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    p = subprocess.run([sys.executable, str(SCRIPT), "--config", str(TINY)], capture_output=True, text=True,
                       timeout=120, cwd=ROOT, env=env)
    assert p.returncode == 2 and "needs torch and transformers" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


def reference_python():
    for py in (sys.executable, str(ROOT / ".venv-ref" / "bin" / "python")):
        if os.access(py, os.X_OK) and subprocess.run([py, "-c", "import torch, transformers"],
                                                     capture_output=True).returncode == 0:
            return py
    return None


def test_decodes_a_tiny_model_on_the_cpu(tmp_path):
    py = reference_python()
    if py is None:
        pytest.skip("no python with torch and transformers (scripts/requirements-reference.txt into .venv-ref)")
    out_json = tmp_path / "hf.json"
    rc, out, err = run(py, "--config", str(TINY), "--device", "cpu", "--dtype", "float32", "--prompt", "9",
                       "--decode", "5", "--threads", "1", "--json", str(out_json))
    if rc == 2 and "has no Qwen3.5 model" in err:
        pytest.skip(err.strip())
    assert rc == 0, err
    res = json.loads(out_json.read_text())
    cfg = json.loads((TINY / "config.json").read_text())["text_config"]
    assert res["layers"] == cfg["num_hidden_layers"] and res["hidden"] == cfg["hidden_size"]
    assert res["vocab"] == cfg["vocab_size"] and res["prompt_tokens"] == 9 and res["decode_steps"] == 5
    assert res["decode_tok_s"] > 0 and res["ttft_s"] > 0 and res["device"] == "cpu"
    assert res["decode_mean_tok_s"] > 0
    assert res["cache_positions"] == 9 + 5  # each step read the cache and added its token
    assert res["gdn_path"] == "torch fallback"  # fla's kernels are CUDA-only
    assert json.loads(out.strip().splitlines()[-1]) == res  # the last line printed is the same JSON
