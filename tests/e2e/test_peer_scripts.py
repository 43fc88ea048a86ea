"""The llama.cpp comparison scripts (make bench-peer, make quality-peer) without the network or a build
of llama.cpp: argument handling, the dry runs, and the refusal of a source archive whose checksum is
wrong. The long runs themselves are not part of make test."""

import os
import pathlib
import shutil
import struct
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD = str(pathlib.Path(os.environ.get("Q35_BIN", str(ROOT / "build" / "qwen35"))).parent)


def run(script, *args, env=None, timeout=120):
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run([str(ROOT / "scripts" / script), *args], capture_output=True, text=True, env=e,
                       timeout=timeout, cwd=ROOT)
    return p.returncode, p.stdout, p.stderr


def test_bench_peer_arguments(tmp_path):
    peer = {"PEER_DIR": str(tmp_path / "peer")}
    rc, out, err = run("bench-peer.sh", "--bogus", env=peer)
    assert rc == 2 and "unknown option '--bogus'" in err
    for var, val, msg in (("Q35_PEER_ROUNDS", "1", "at least 2"), ("Q35_PEER_THREADS", "1,x", "a list like 1,2"),
                          ("Q35_PEER_PROMPT", "0", "positive integer"), ("Q35_PEER_FORMATS", "Q3_K", "not handled"),
                          ("Q35_PEER_ISA", "sse4", "native or avx2")):
        rc, out, err = run("bench-peer.sh", BUILD, "--dry-run", env={**peer, var: val})
        assert rc == 1 and msg in err, (var, err)
    rc, out, err = run("bench-peer.sh", BUILD, "--dry-run", env=peer)
    assert rc == 0, err
    assert "would download with pip from PyPI" in out and "qwen35-9b-random-Q4_K_M.gguf" in out
    assert "instruction sets native" in out and "output: bench-data/peer.json" in out
    assert "/peer/build/bin (would build" in out
    if "avx2" in pathlib.Path("/proc/cpuinfo").read_text().split():
        # llama.cpp built for AVX2 only, in its own folder, and its own output file
        rc, out, err = run("bench-peer.sh", BUILD, "--dry-run", env={**peer, "Q35_PEER_ISA": "avx2"})
        assert rc == 0, err
        assert "instruction sets avx2" in out and "output: bench-data/peer-avx2.json" in out
        assert "/peer/build-avx2/bin (would build" in out
    assert not (tmp_path / "peer").exists()          # a dry run makes nothing


def test_quality_peer_arguments(tmp_path):
    peer = {"PEER_DIR": str(tmp_path / "peer")}
    rc, out, err = run("quality-peer.sh", "--nope", env=peer)
    assert rc == 2 and "unknown option" in err
    rc, out, err = run("quality-peer.sh", BUILD, "--dry-run", env={**peer, "Q35_QUALITY_POLICIES": "default,q2"})
    assert rc == 1 and "policy 'q2' not known" in err
    rc, out, err = run("quality-peer.sh", BUILD, "--dry-run", env={**peer, "Q35_QUALITY_POLICIES": "default+mix+gptq"})
    assert rc == 1 and "policy 'default+mix+gptq' not known" in err
    rc, out, err = run("quality-peer.sh", BUILD, "--dry-run", env={**peer, "Q35_QUALITY_CALIB": str(tmp_path / "none")})
    assert rc == 1 and "no calibration text" in err
    rc, out, err = run("quality-peer.sh", BUILD, "--dry-run", env={**peer, "Q35_QUALITY_CTX": "511"})
    assert rc == 1 and "even number" in err
    rc, out, err = run("quality-peer.sh", BUILD, "--dry-run", env={**peer, "Q35_QUALITY_TEXT": str(tmp_path / "none")})
    assert rc == 1 and "no text" in err
    rc, out, err = run("quality-peer.sh", BUILD, "--dry-run", env=peer)
    assert rc == 0, err
    assert "Q8_0 Q4_K_M Q4_0 IQ4_NL" in out and "bf16 default bfp8 bfp4-all tuned default+gptq" in out
    assert not (tmp_path / "peer").exists()


@pytest.mark.skipif(not shutil.which("cmake") or not shutil.which("g++"), reason="cmake/g++ not installed")
def test_peer_llama_refuses_a_wrong_checksum(tmp_path):
    peer = tmp_path / "peer"
    (peer / "sdist").mkdir(parents=True)
    (peer / "sdist" / "llama_cpp_python-0.3.36.tar.gz").write_bytes(b"not the archive")
    rc, out, err = run("peer-llama.sh", env={"PEER_DIR": str(peer)})
    assert rc == 1
    assert "sha256" in err and "expected 832db0699007f1be" in err
    assert not (peer / "build").exists()


def test_kld_file_reader(tmp_path):
    np = pytest.importorskip("numpy")
    import sys
    sys.path.insert(0, str(ROOT / "scripts"))
    import peer_quality
    n_ctx, n_vocab, n_chunk = 8, 5, 2
    toks = np.arange(n_ctx * n_chunk, dtype=np.int32)
    rows = n_ctx - 1 - n_ctx // 2
    nv = 2 * ((n_vocab + 1) // 2) + 4
    body = np.zeros((n_chunk, rows, nv), dtype=np.uint16)
    body[:, :, 0:2] = np.array([0.5], dtype=np.float32).view(np.uint16)      # scale
    body[:, :, 2:4] = np.array([-3.0], dtype=np.float32).view(np.uint16)     # min log-prob
    body[:, :, 4:4 + n_vocab] = np.arange(n_vocab, dtype=np.uint16)
    f = tmp_path / "base.kld"
    f.write_bytes(b"_logits_" + struct.pack("<Iii", n_ctx, n_vocab, n_chunk) + toks.tobytes() + body.tobytes())
    k = peer_quality.read_kld(str(f))
    assert k["first"] == 4 and k["n_rows"] == 3 and k["tokens"].shape == (2, 8)
    lp = peer_quality.llama_logprobs(k, 1)
    assert lp.shape == (3, 5) and abs(lp[0, 4] - (0.5 * 4 - 3.0)) < 1e-6
    f.write_bytes(b"_logits_" + struct.pack("<Iii", n_ctx, n_vocab, n_chunk) + toks.tobytes() + body.tobytes()[:-2])
    with pytest.raises(SystemExit, match="truncated"):
        peer_quality.read_kld(str(f))


def test_windows_file_holds_the_text_tokens_in_whole_windows(tmp_path):
    np = pytest.importorskip("numpy")
    import argparse
    import sys
    sys.path.insert(0, str(ROOT / "scripts"))
    import peer_quality
    binary = os.environ.get("Q35_BIN", str(ROOT / "build" / "qwen35"))
    text = tmp_path / "t.txt"
    text.write_text((ROOT / "models" / "qwen35-demo-eval.txt").read_text()[:3000])
    out = tmp_path / "w.kld"
    a = argparse.Namespace(kld=str(out), qwen35=binary, text=str(text), tokenizer=str(ROOT / "models" / "qwen35-demo"),
                           n_ctx=64)
    peer_quality.cmd_windows(a)
    r = subprocess.run([binary, "tokenize", "-m", a.tokenizer, "--file", str(text), "--ids-only"], capture_output=True,
                       text=True)
    ids = [int(x) for x in r.stdout.replace(",", " ").split()]
    k = peer_quality.read_kld(str(out), with_logprobs=False)
    assert k["n_ctx"] == 64 and k["n_vocab"] == 4096 and k["n_chunk"] == len(ids) // 64 >= 2
    assert k["tokens"].reshape(-1).tolist() == ids[:k["n_chunk"] * 64]
    a.n_ctx = len(ids) + 1
    with pytest.raises(SystemExit, match="fewer than one window"):
        peer_quality.cmd_windows(a)
