"""End-to-end tests of `qwen35 run` and `qwen35 logits` on the tiny test
checkpoints: their output format, speculation on and off, and clear errors."""

import json
import os
import pathlib
import re
import shutil
import struct
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = os.environ.get("Q35_BIN", str(ROOT / "build" / "qwen35"))
MODELS = ROOT / "tests" / "data" / "models"
GOLDEN = ROOT / "tests" / "data" / "golden"


def q35(*args, timeout=120):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=timeout)


def golden(name):
    return json.loads((GOLDEN / (name + ".json")).read_text())


def test_run_prints_the_greedy_continuation_with_and_without_speculation():
    g = golden("tiny-b")
    ids = ",".join(map(str, g["prompt_ids"]))
    outs = []
    for extra in ([], ["--no-spec"], ["--spec-k", "3"], ["--no-mmap"], ["--mmap"]):
        p = q35("run", "-m", str(MODELS / "tiny-b"), "--prompt-ids", ids, "-n", "32", *extra)
        assert p.returncode == 0, p.stderr
        outs.append([int(x) for x in p.stdout.strip().split(",")])
        assert "tok/s" in p.stderr
        assert ("speculation: k=" in p.stderr) == ("--no-spec" not in extra)
    assert all(o == g["greedy_ids"] for o in outs)


def test_logits_file_matches_the_golden(tmp_path):
    g = golden("tiny-c")
    out = tmp_path / "logits.f32"
    p = q35("logits", "-m", str(MODELS / "tiny-c"), "--prompt-ids", ",".join(map(str, g["prompt_ids"])), "-o", str(out))
    assert p.returncode == 0, p.stderr
    data = out.read_bytes()
    V, n = g["vocab_size"], len(g["prompt_ids"])
    assert len(data) == 4 * V * n
    ours = struct.unpack("<%df" % (V * n), data)
    ref = struct.unpack("<%df" % (V * n), (GOLDEN / g["prompt_logits_file"]).read_bytes())
    for row in range(n):
        a, b = ours[row * V:(row + 1) * V], ref[row * V:(row + 1) * V]
        assert max(abs(x - y) for x, y in zip(a, b)) <= 1e-4 * max(abs(y) for y in b)


def strip_mtp(src, dst):
    """A copy of a single-file checkpoint whose header no longer lists mtp.*."""
    shutil.copytree(src, dst)
    path = dst / "model.safetensors"
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    header = {k: v for k, v in header.items() if not k.startswith("mtp.")}
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n:])


def test_model_without_mtp_runs_and_says_so(tmp_path):
    strip_mtp(MODELS / "tiny-a", tmp_path / "nomtp")
    p = q35("run", "-m", str(tmp_path / "nomtp"), "--prompt-ids", "1,2,3", "-n", "8")
    assert p.returncode == 0, p.stderr
    assert "no MTP head" in p.stderr
    assert len(p.stdout.strip().split(",")) == 8
    p = q35("run", "-m", str(tmp_path / "nomtp"), "--prompt-ids", "1,2,3", "-n", "8", "--spec-k", "2")
    assert p.returncode == 1 and "no MTP head" in p.stderr


def test_bad_arguments_give_clear_errors(tmp_path):
    m = str(MODELS / "tiny-a")
    cases = [
        (["run", "-m", m, "--prompt-ids", "1,2,3", "--spec-k", "9"], "--spec-k must be 0..8"),
        (["run", "-m", m, "--prompt-ids", "1,,3"], "bad --prompt-ids"),
        (["run", "-m", m, "--prompt-ids", "1,2,99999"], "outside the vocabulary"),
        (["run", "-m", str(tmp_path / "missing"), "--prompt-ids", "1"], "not a directory"),
        (["logits", "-m", m, "--prompt-ids", "1"], "missing required options"),
        (["frobnicate"], "unknown command"),
        (["run", "-m", m, "--prompt-ids", "1", "--kv-cache", "q4"], "--kv-cache must be f32 or q8"),
        (["eval", "-m", m, "--ids", "1,2", "--kv-cache", "f16"], "--kv-cache must be f32 or q8"),
        (["speed", "-m", m, "--kv-cache", "int8"], "bad value 'int8' for --kv-cache"),
        (["chat", "-m", m, "--kv-cache", ""], "bad value '' for --kv-cache"),
    ]
    for args, msg in cases:
        p = q35(*args)
        assert p.returncode != 0, args
        assert msg in p.stderr, (args, p.stderr)


def test_kernel_override_by_environment():
    g = golden("tiny-a")
    ids = ",".join(map(str, g["prompt_ids"]))
    outs = {}
    for name in ("ref", "avx2", None):
        env = dict(os.environ)
        env.pop("Q35_KERNELS", None)
        if name:
            env["Q35_KERNELS"] = name
        p = subprocess.run([BIN, "run", "-m", str(MODELS / "tiny-a"), "--prompt-ids", ids, "-n", "32"],
                           capture_output=True, text=True, timeout=120, env=env)
        if name == "avx2" and "lacks the instructions" in p.stderr:
            continue  # a CPU without AVX2 refuses it clearly; nothing to compare
        assert p.returncode == 0, p.stderr
        outs[name] = [int(x) for x in p.stdout.strip().split(",")]
    assert all(v == g["greedy_ids"] for v in outs.values())
    env = dict(os.environ, Q35_KERNELS="bogus")
    p = subprocess.run([BIN, "run", "-m", str(MODELS / "tiny-a"), "--prompt-ids", "1,2"], capture_output=True,
                       text=True, timeout=60, env=env)
    assert p.returncode == 1 and 'kernels "bogus": unknown' in p.stderr


def test_prefetch_level_by_environment():
    # Q35_PREFETCH=l1|l2 forces the avx512 tiles' prefetch level: the tokens are the same either way;
    # any other value is refused at start, naming it
    g = golden("tiny-a")
    ids = ",".join(map(str, g["prompt_ids"]))
    for level in ("l1", "l2"):
        env = dict(os.environ, Q35_PREFETCH=level)
        p = subprocess.run([BIN, "run", "-m", str(MODELS / "tiny-a"), "--prompt-ids", ids, "-n", "32"],
                           capture_output=True, text=True, timeout=120, env=env)
        assert p.returncode == 0, p.stderr
        assert [int(x) for x in p.stdout.strip().split(",")] == g["greedy_ids"]
    env = dict(os.environ, Q35_PREFETCH="l9")
    p = subprocess.run([BIN, "run", "-m", str(MODELS / "tiny-a"), "--prompt-ids", "1,2"], capture_output=True,
                       text=True, timeout=60, env=env)
    assert p.returncode == 1 and "Q35_PREFETCH=l9: unknown (choose l1 or l2)" in p.stderr, p.stderr


DEMO = ROOT / "models" / "qwen35-demo"


def test_chat_with_the_embedded_model_is_deterministic_and_matches_run():
    env = {k: v for k, v in os.environ.items() if k != "QWEN35_MODEL"}
    outs = []
    for extra in ([], ["--no-spec"], ["--spec-k", "2"]):
        p = subprocess.run([BIN, "chat", "-n", "24", *extra], input="What is a list?\n/reset\nWhat is a list?\n",
                           capture_output=True, text=True, timeout=120, env=env)
        assert p.returncode == 0, p.stderr
        lines = [l for l in p.stdout.split("\n")]
        outs.append(p.stdout)
    # greedy output is the same with and without speculation, and /reset starts over
    assert outs[0] == outs[1] == outs[2]
    replies = outs[0].strip("\n").split("\n")
    assert len(replies) >= 2 and any(r.strip() for r in replies)
    half = len(replies) // 2
    assert replies[:half] == replies[half:]


def test_chat_without_a_tokenizer_says_so(tmp_path):
    p = q35("chat", "-m", str(MODELS / "tiny-a"))
    assert p.returncode == 1 and "tokenizer.json" in p.stderr


def test_run_with_a_text_prompt_prints_text():
    outs = []
    for extra in ([], ["--no-spec"]):
        p = q35("run", "-m", str(DEMO), "--prompt", "The list type is a mutable sequence.", "-n", "30", *extra)
        assert p.returncode == 0, p.stderr
        outs.append(p.stdout)
    assert outs[0] == outs[1]
    assert any(c.isalpha() for c in outs[0])
    p = q35("run", "-m", str(DEMO), "--prompt", "x", "--prompt-ids", "1")
    assert p.returncode == 2


def test_sampled_chat_depends_only_on_the_seed():
    """Sampled replies take speculative steps (rejection sampling) and depend only on the seed."""
    outs = []
    for seed in ("5", "5", "6"):
        p = subprocess.run([BIN, "chat", "-n", "24", "--temp", "1.0", "--seed", seed], input="What is a list?\n",
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        outs.append(p.stdout)
        m = re.search(r"speculation: k=1, .* (\d+) drafts, (\d+) accepted", p.stderr)
        assert m and int(m.group(1)) > 0, p.stderr
    assert outs[0] == outs[1]
    assert outs[0] != outs[2]
    p = subprocess.run([BIN, "chat", "-n", "24", "--temp", "1.0", "--seed", "5", "--no-spec"], input="What is a list?\n",
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "speculation:" not in p.stderr


def test_draft_vocab_keeps_the_greedy_output_and_rejects_bad_lists(tmp_path):
    """--draft-vocab FILE: a reduced draft head (also on a weight cache, where lm_head is bfp8) never
    changes greedy output; a bad list is a clear error."""
    g = golden("tiny-b")
    ids = ",".join(map(str, g["prompt_ids"]))
    cache = tmp_path / "cache"
    p = q35("prepare", "--checkpoint", str(MODELS / "tiny-b"), "--out", str(cache))
    assert p.returncode == 0, p.stderr
    dv = tmp_path / "dv.txt"
    dv.write_text("# every other id\n" + "\n".join(str(i) for i in range(0, g["vocab_size"], 2)) + "\n")
    for model in (MODELS / "tiny-b", cache):
        plain = q35("run", "-m", str(model), "--prompt-ids", ids, "-n", "32", "--no-spec")
        spec = q35("run", "-m", str(model), "--prompt-ids", ids, "-n", "32", "--spec-k", "2", "--draft-vocab", str(dv))
        assert plain.returncode == 0 and spec.returncode == 0, spec.stderr
        assert spec.stdout == plain.stdout
        assert "draft head %d of %d rows" % (g["vocab_size"] // 2, g["vocab_size"]) in spec.stderr
    m = str(MODELS / "tiny-b")
    bad = [("", "no token ids"), ("1\nx\n", "dv.txt:2: expected a token id"), ("3\n99999\n", "outside the vocabulary"),
           ("4\n4\n", "listed twice")]
    for text, msg in bad:
        dv.write_text(text)
        p = q35("run", "-m", m, "--prompt-ids", ids, "-n", "4", "--draft-vocab", str(dv))
        assert p.returncode != 0 and "--draft-vocab" in p.stderr and msg in p.stderr, (text, p.stderr)
    p = q35("run", "-m", m, "--prompt-ids", ids, "-n", "4", "--draft-vocab", str(tmp_path / "missing.txt"))
    assert p.returncode != 0 and "missing.txt" in p.stderr
    strip_mtp(MODELS / "tiny-a", tmp_path / "nomtp")
    dv.write_text("1\n2\n")
    p = q35("run", "-m", str(tmp_path / "nomtp"), "--prompt-ids", "1,2,3", "-n", "4", "--draft-vocab", str(dv))
    assert p.returncode != 0 and "no MTP head" in p.stderr


def test_draft_vocab_command_writes_the_most_frequent_ids(tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_text("the list the list the dict. " * 50)
    out = tmp_path / "dv.txt"
    p = q35("draft-vocab", "-m", str(DEMO), "--text", str(text), "--size", "40", "-o", str(out), "--check", str(text))
    assert p.returncode == 0, p.stderr
    lines = [l for l in out.read_text().splitlines() if not l.startswith("#")]
    assert len(lines) == 40 and len(set(lines)) == 40
    tok = q35("tokenize", "-m", str(DEMO), "--text", "the list the list the dict. ", "--ids-only")
    corpus_ids = set(tok.stdout.split())
    assert corpus_ids <= set(lines)  # every id of the corpus is among the most frequent
    assert "100.00% of them in the draft vocabulary" in p.stderr
    run = q35("run", "-m", str(DEMO), "--prompt", "The list type is", "-n", "12", "--draft-vocab", str(out))
    plain = q35("run", "-m", str(DEMO), "--prompt", "The list type is", "-n", "12", "--no-spec")
    assert run.returncode == 0 and run.stdout == plain.stdout
    for args, msg in [(["--size", "0"], "--size must be"), (["--size", "101%"], "--size must be"),
                      (["--size", "10", "--text", str(tmp_path / "nope.txt")], "nope.txt")]:
        p = q35("draft-vocab", "-m", str(DEMO), "--text", str(text), *args)
        assert p.returncode != 0 and msg in p.stderr, (args, p.stderr)


def test_speed_reports_reduced_draft_heads(tmp_path):
    out = tmp_path / "speed.json"
    p = q35("speed", "-m", str(MODELS / "tiny-b"), "-t", "1", "--prompt", "8", "--decode", "4", "--spec-k", "2",
            "--draft-rows", "64,128", "--json", str(out), timeout=300)
    assert p.returncode == 0, p.stderr
    spec = json.loads(out.read_text())["spec"]
    assert spec["k"] == 2 and spec["step_cost"] > 0
    assert [h["rows"] for h in spec["draft_heads"]] == [64, 128]
    for h in spec["draft_heads"]:
        assert h["step_cost"] > 0 and h["synthetic_tok_s"] > 0 and 0 <= h["break_even_acceptance"] <= 1
    assert "draft head     64 rows" in p.stdout
    p = q35("speed", "-m", str(MODELS / "tiny-b"), "--draft-rows", "12,x")
    assert p.returncode != 0 and "--draft-rows" in p.stderr


def test_speed_reports_speed_and_memory(tmp_path):
    """`qwen35 speed` on a tiny model: every figure present and sane, and the
    memory split follows where the weights live (mapped file or --no-mmap copy)."""
    model = MODELS / "tiny-b"
    size = sum(f.stat().st_size for f in model.glob("*.safetensors"))  # three shards
    for extra in (["--mmap"], ["--no-mmap"]):
        out = tmp_path / "speed.json"
        p = q35("speed", "-m", str(model), "-t", "1", "--prompt", "40", "--decode", "4", "--json", str(out), *extra)
        assert p.returncode == 0, p.stderr
        r = json.loads(out.read_text())
        assert r["schema"] == "qwen35-speed/1"
        assert r["decode"][0]["threads"] == 1 and r["decode"][0]["tok_s"] > 0
        assert r["decode"][0]["measured_bw_gb_s"] > 0
        assert r["prompt"][0]["tokens"] == 40 and r["prompt"][0]["tok_s"] > 0
        assert r["weight_file_bytes"] == size
        assert r["weights_copied"] is (extra == ["--no-mmap"])
        assert r["engine_memory_bytes"] > 0
        assert r["peak_rss_bytes"] >= r["engine_memory_bytes"]
        if extra == ["--no-mmap"]:
            assert r["peak_rss_bytes"] >= size + r["engine_memory_bytes"]
        assert "memory: weight files" in p.stdout
    bad = q35("speed", "-m", str(model), "--decode", "1")
    assert bad.returncode == 2 and "--decode" in bad.stderr


def test_speed_reports_context_depths(tmp_path):
    """`qwen35 speed --depth`: decode and a prompt after that many positions of (random) context, against
    depth 0, and the memory a session takes per 1k positions: the demo's fp32 KV cache is 2 attention layers x
    (K, V) x 2 KV heads x 32 x 4 bytes = 1 KiB per position, 1 MiB per 1k."""
    out = tmp_path / "speed.json"
    p = q35("speed", "-m", str(DEMO), "-t", "1", "--prompt", "16", "--decode", "4", "--spec-k", "0",
            "--draft-rows", "0", "--depth", "4096,16384", "--depth-prompt", "64", "--json", str(out), timeout=300)
    assert p.returncode == 0, p.stderr
    r = json.loads(out.read_text())
    assert [d["depth"] for d in r["depth"]] == [0, 4096, 16384]
    assert r["depth"][0]["decode_vs_depth0"] == 1
    for d in r["depth"]:
        assert d["decode_tok_s"] > 0 and d["prompt_tokens"] == 64 and d["prompt_tok_s"] > 0
    # measured as resident growth: at least the cache itself, and at most one more 2 MiB huge page for each of
    # the 8 head regions (2 layers x K, V x 2 heads) that the 16 MiB of the fills end inside
    assert 1024 * 1024 <= r["context_bytes_per_1k"] <= (16 + 8 * 2) / 16 * 1024 * 1024, r["context_bytes_per_1k"]
    assert "depth 16384" in p.stdout and "context memory" in p.stdout
    p = q35("speed", "-m", str(DEMO), "-t", "1", "--prompt", "16", "--decode", "4", "--spec-k", "0",
            "--draft-rows", "0", "--depth", "256", "--depth-prompt", "0", "--json", str(out), timeout=300)
    assert p.returncode == 0, p.stderr
    assert all(d["prompt_tok_s"] == 0 for d in json.loads(out.read_text())["depth"])
    for bad in (["--depth", "0"], ["--depth", "8k"], ["--depth-prompt", "9000"]):
        p = q35("speed", "-m", str(DEMO), *bad)
        assert p.returncode == 2 and bad[0] in p.stderr, (bad, p.stderr)


def test_kv_cache_q8_runs_reports_its_size_and_keeps_speculation_exact(tmp_path):
    """--kv-cache q8: the demo's rows (head_dim 32: one scale and 32 codes, 36 bytes) take 2 layers x (K, V) x
    2 KV heads x 36 = 288 bytes per position against f32's 1 KiB; speed says so and measures it; run's greedy
    tokens are the same with and without speculation; eval against the f32 model moves little."""
    out = tmp_path / "speed.json"
    p = q35("speed", "-m", str(DEMO), "-t", "1", "--prompt", "16", "--decode", "4", "--spec-k", "0",
            "--draft-rows", "0", "--depth", "16384", "--depth-prompt", "0", "--kv-cache", "q8", "--json", str(out),
            timeout=300)
    assert p.returncode == 0, p.stderr
    r = json.loads(out.read_text())
    assert r["kv_cache"] == "q8" and r["kv_bytes_per_position"] == 288, r
    assert "KV cache q8 (0.3 KiB per position)" in p.stdout
    # resident growth over the fill: the cache itself, and at most one more 2 MiB huge page for each of the 8
    # head regions that the 4.5 MiB of the fill ends inside
    assert 288 * 1024 <= r["context_bytes_per_1k"] <= (4.5 + 8 * 2) / 16 * 1024 * 1024, r["context_bytes_per_1k"]
    ids = ",".join(str(i) for i in golden("tiny-a")["prompt_ids"])
    toks = []
    for spec in ("0", "2"):
        p = q35("run", "-m", str(MODELS / "tiny-a"), "--prompt-ids", ids, "-n", "40", "--spec-k", spec,
                "--kv-cache", "q8")
        assert p.returncode == 0, p.stderr
        toks.append(p.stdout.strip())
    assert toks[0] == toks[1] and len(toks[0].split(",")) == 40
    text = "/usr/share/doc/python3.11/html/_sources/library/asyncio-task.rst.txt"
    if os.path.exists(text):
        p = q35("eval", "-m", str(DEMO), "--text", text, "--ctx", "512", "--kld-base", str(DEMO), "--kv-cache", "q8",
                "--json", timeout=300)
        assert p.returncode == 0, p.stderr
        r = json.loads(p.stdout)
        assert 0 < r["kld_mean"] < 1e-4 and r["top1_agreement"] > 0.99, r


def test_speed_vision_reports_encode_time_dtype_error_and_added_ttft(tmp_path):
    """`qwen35 speed --vision` at the 9B tower shapes on a small image: encode time, with --tower-dtype bfp8
    the output's distance from the BF16 tower's, with -m the time to first token the image adds; bad
    --tower-dtype values are refused."""
    out = tmp_path / "vision.json"
    p = q35("speed", "--vision", "--image-side", "64", "-t", "1", "--tower-dtype", "bfp8", "-m", str(MODELS / "tiny-b"),
            "--json", str(out), timeout=300)
    assert p.returncode == 0, p.stderr
    r = json.loads(out.read_text())
    assert r["tower_dtype"] == "bfp8" and r["patches"] == 16 and r["tokens"] == 4
    run = r["runs"][0]
    assert run["threads"] == 1 and run["encode_s"] > 0
    assert 0 < run["out_rel_rms_vs_bf16"] < 0.5 and 0 < run["out_rel_max_vs_bf16"] < 0.5
    assert 0 < run["ttft_text_s"] < run["ttft_image_s"]
    assert abs(run["added_ttft_s"] - (run["ttft_image_s"] - run["ttft_text_s"])) < 1e-3
    assert "time to first token" in p.stdout
    bad = q35("speed", "--vision", "--tower-dtype", "fp4")
    assert bad.returncode == 2 and "--tower-dtype" in bad.stderr
    bad = q35("speed", "-m", str(MODELS / "tiny-b"), "--tower-dtype", "bfp8")
    assert bad.returncode == 2 and "--tower-dtype goes with --vision" in bad.stderr
