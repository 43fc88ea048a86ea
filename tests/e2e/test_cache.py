"""End-to-end tests of the weight cache commands: `qwen35 prepare` (with a
full disk, and with --download against a fake Hugging Face Hub on
127.0.0.1 that breaks transfers and serves a corrupted file), `verify`,
`info`, `eval`, and `-m CACHE_DIR` in the other commands."""

import hashlib
import http.server
import json
import os
import pathlib
import resource
import shutil
import signal
import subprocess
import threading

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = os.environ.get("Q35_BIN", str(ROOT / "build" / "qwen35"))
MODELS = ROOT / "tests" / "data" / "models"
GOLDEN = ROOT / "tests" / "data" / "golden"


def q35(*args, timeout=120, **kw):
    return subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=timeout, **kw)


def prompt_ids(name):
    return ",".join(map(str, json.loads((GOLDEN / (name + ".json")).read_text())["prompt_ids"]))


def test_prepare_verify_info_and_load(tmp_path):
    out = tmp_path / "cache"
    p = q35("prepare", "--checkpoint", MODELS / "tiny-b", "--out", out, "--policy", "bf16")
    assert p.returncode == 0, p.stderr
    for f in ["model.q35", "config.json", "manifest.json", "model-spec.json"]:
        assert (out / f).is_file(), f
    man = json.loads((out / "manifest.json").read_text())
    assert man["policy"] == "bf16" and man["qwen35_version"]
    for name, f in man["files"].items():
        data = (MODELS / "tiny-b" / name).read_bytes()
        assert f["size"] == len(data) and f["sha256"] == hashlib.sha256(data).hexdigest()
    assert man["config"]["text_config"]["vocab_size"] == 384
    spec = json.loads((out / "model-spec.json").read_text())
    assert spec["mtp"]["enabled"] and spec["concurrency"] == 1 and spec["max_context"] > 0

    ids = prompt_ids("tiny-b")
    a = q35("logits", "-m", MODELS / "tiny-b", "--prompt-ids", ids, "-o", tmp_path / "a.f32")
    b = q35("logits", "-m", out, "--prompt-ids", ids, "-o", tmp_path / "b.f32")
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert (tmp_path / "a.f32").read_bytes() == (tmp_path / "b.f32").read_bytes()

    v = q35("verify", out)
    assert v.returncode == 0 and "ok" in v.stdout, v.stderr
    i = q35("info", out)
    assert i.returncode == 0, i.stderr
    assert "policy bf16" in i.stdout and "bytes read per generated token" in i.stdout
    assert "Qwen3.5-9B" in i.stdout and "bfp4-all" in i.stdout

    # a flipped byte in a tensor: verify names it
    raw = bytearray((out / "model.q35").read_bytes())
    name = raw[128:256].split(b"\0")[0].decode()
    off = int.from_bytes(raw[128 + 208:128 + 216], "little")
    raw[off] ^= 0x40
    (out / "model.q35").write_bytes(raw)
    v = q35("verify", out)
    assert v.returncode == 1 and name in v.stderr and "SHA-256" in v.stderr


def test_a_cache_of_a_vision_model_serves_images_as_the_checkpoint(tmp_path):
    """vl-a's bf16 cache holds its vision tower as stored: `logits --chat` with two images gives the
    checkpoint's bytes (the processor read from the cache's copied preprocessor_config.json), `info` counts
    the tower apart from the bytes per token, and `verify` names a flipped byte in a tower tensor."""
    out = tmp_path / "cache"
    p = q35("prepare", "--checkpoint", MODELS / "vl-a", "--out", out, "--policy", "bf16")
    assert p.returncode == 0, p.stderr
    vl = ROOT / "tests" / "data" / "golden-vl"
    a = q35("logits", "-m", MODELS / "vl-a", "--chat", "vl-a.two.json", "-o", tmp_path / "a.f32", cwd=vl)
    b = q35("logits", "-m", out, "--chat", "vl-a.two.json", "-o", tmp_path / "b.f32", cwd=vl)
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert (tmp_path / "a.f32").stat().st_size > 0
    assert (tmp_path / "a.f32").read_bytes() == (tmp_path / "b.f32").read_bytes()

    def tower_and_per_token(path):
        i = q35("info", path)
        assert i.returncode == 0, i.stderr
        line = [x for x in i.stdout.splitlines() if x.startswith("vision tower: ")]
        return line, i.stdout.split("bytes read per generated token: ")[1].split()[0]

    assert tower_and_per_token(out) == tower_and_per_token(MODELS / "vl-a")
    assert tower_and_per_token(out)[0][0].startswith("vision tower: 33 tensors, ")

    raw = bytearray((out / "model.q35").read_bytes())
    n = int.from_bytes(raw[16:20], "little")
    for k in range(n):
        r = raw[128 + 256 * k:128 + 256 * (k + 1)]
        name = r[:128].split(b"\0")[0].decode()
        if name == "model.visual.merger.linear_fc2.weight":
            raw[int.from_bytes(r[208:216], "little")] ^= 0x40
            break
    else:
        raise AssertionError("no merger tensor in the cache")
    (out / "model.q35").write_bytes(raw)
    v = q35("verify", out)
    assert v.returncode == 1 and "model.visual.merger.linear_fc2.weight" in v.stderr, v.stderr


def test_unknown_policy_and_missing_options(tmp_path):
    p = q35("prepare", "--checkpoint", MODELS / "tiny-a", "--out", tmp_path / "c", "--policy", "int3")
    assert p.returncode == 2 and "int3" in p.stderr
    p = q35("prepare", "--out", tmp_path / "c")
    assert p.returncode == 2 and "--checkpoint" in p.stderr


def _no_big_files(limit):
    def pre():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return pre


def test_full_disk_leaves_no_complete_looking_file(tmp_path):
    out = tmp_path / "cache"
    p = q35("prepare", "--checkpoint", MODELS / "tiny-a", "--out", out, preexec_fn=_no_big_files(64 * 1024))
    assert p.returncode == 1
    assert "model.q35.partial" in p.stderr and "disk full" in p.stderr
    assert not (out / "model.q35").exists() and not (out / "manifest.json").exists()
    assert not (out / "model.q35.partial").exists()
    r = q35("run", "-m", out, "--prompt-ids", "1,2", "-n", "1")
    assert r.returncode == 1 and str(out) in r.stderr
    p = q35("prepare", "--checkpoint", MODELS / "tiny-a", "--out", out)
    assert p.returncode == 0, p.stderr


def test_eval_perplexity_and_kld(tmp_path):
    ids = tmp_path / "ids.txt"
    ids.write_text(" ".join(str((i * 37 + 11) % 320) for i in range(150)) + "\n")
    for policy in ["bf16", "bfp4-all"]:
        assert q35("prepare", "--checkpoint", MODELS / "tiny-a", "--out", tmp_path / policy, "--policy", policy).returncode == 0
    r = q35("eval", "-m", MODELS / "tiny-a", "--ids", ids, "--ctx", "64", "--json")
    assert r.returncode == 0, r.stderr
    base = json.loads(r.stdout)
    assert base["scored"] == 150 - 3 and base["perplexity"] > 1  # windows of 64, 64, 22 tokens
    r = q35("eval", "-m", tmp_path / "bf16", "--ids", ids, "--ctx", "64", "--kld-base", MODELS / "tiny-a", "--json")
    same = json.loads(r.stdout)
    assert same["kld_mean"] == 0 and same["top1_agreement"] == 1 and same["perplexity"] == base["perplexity"]
    r = q35("eval", "-m", tmp_path / "bfp4-all", "--ids", ids, "--ctx", "64", "--kld-base", MODELS / "tiny-a")
    assert r.returncode == 0, r.stderr
    assert "perplexity" in r.stdout and "KL divergence" in r.stdout and "top-1 agreement" in r.stdout
    bad = tmp_path / "bad.txt"
    bad.write_text("1, 2, x\n")
    r = q35("eval", "-m", MODELS / "tiny-a", "--ids", bad)
    assert r.returncode == 2 and "bad.txt" in r.stderr


def test_eval_sweep_equals_evals_of_the_prepared_caches(tmp_path):
    """--sweep swaps tensors in memory; each row must equal `prepare --set` of the same tensors and an eval."""
    ids = tmp_path / "ids.txt"
    ids.write_text(" ".join(str((i * 37 + 11) % 320) for i in range(150)) + "\n")
    src = MODELS / "tiny-a"
    common = ["--ids", ids, "--ctx", "64", "--kld-base", src, "--json", "-t", "1"]

    def eval_cache(name, *prep):
        out = tmp_path / name
        r = q35("prepare", "--checkpoint", src, "--out", out, *prep)
        assert r.returncode == 0, r.stderr
        r = q35("eval", "-m", out, *common)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout), q35("info", out).stdout

    def bytes_per_token(info):
        return int(info.split("bytes read per generated token: ")[1].split()[0])

    # every matrix alone at BFP4, the rest BF16 (one row checked against its cache), and the default cache
    # raised to BFP8 kind by kind (a group of several tensors)
    r = q35("eval", "-m", src, *common, "--sweep", "bfp4")
    assert r.returncode == 0, r.stderr
    sweep4 = json.loads(r.stdout)
    rows = {row["group"]: row for row in sweep4["rows"]}
    names = [g for g in rows if g != "(as loaded)"]
    assert rows["(as loaded)"]["kld_mean"] == 0 and len(names) == len(set(names)) >= 20
    assert "lm_head.weight" in rows and not any(g.startswith("mtp.") for g in names)
    down = "model.language_model.layers.1.mlp.down_proj.weight"
    want, info = eval_cache("down4", "--policy", "bf16", "--set", down + "=bfp4")
    for k in ["kld_mean", "kld_max", "top1_agreement", "perplexity"]:
        assert rows[down][k] == want[k], k
    assert rows[down]["bytes_per_token"] == bytes_per_token(info) and rows[down]["bytes_per_token_delta"] < 0

    default, _ = eval_cache("default", "--policy", "default")
    r = q35("eval", "-m", tmp_path / "default", *common, "--sweep", "bfp8", "--group", "kind")
    assert r.returncode == 0, r.stderr
    rows = {row["group"]: row for row in json.loads(r.stdout)["rows"]}
    assert rows["(as loaded)"]["kld_mean"] == default["kld_mean"]
    assert "lm_head.weight" not in rows  # already BFP8: nothing to measure
    kind = "model.language_model.layers.*.mlp.up_proj.weight"
    ups = rows[kind]["tensors"]
    assert len(ups) > 1 and all(t.endswith("mlp.up_proj.weight") for t in ups)
    sets = [a for t in ups for a in ("--set", t + "=bfp8")]
    want, info = eval_cache("up8", "--policy", "default", *sets)
    for k in ["kld_mean", "kld_max", "top1_agreement", "perplexity"]:
        assert rows[kind][k] == want[k], k
    assert rows[kind]["bytes_per_token"] == bytes_per_token(info)

    # the same figures whatever the thread count; the table names the groups, most affected first
    r = q35("eval", "-m", src, *common[:-2], "-t", "2", "--sweep", "bfp4")
    assert json.loads(r.stdout) == sweep4
    r = q35("eval", "-m", src, "--ids", ids, "--ctx", "64", "--kld-base", src, "--sweep", "bfp4", "--group", "layer")
    assert r.returncode == 0 and "| model.language_model.layers.0 |" in r.stdout and "| (as loaded) |" in r.stdout

    r = q35("eval", "-m", tmp_path / "default", "--ids", ids, "--kld-base", tmp_path / "default", "--sweep", "bfp8")
    assert r.returncode == 1 and "encodes from a checkpoint" in r.stderr and "BFP4" in r.stderr, r.stderr
    for bad, why in [(["--sweep", "bfp4"], "--kld-base"), (["--kld-base", src, "--sweep", "q4"], "bf16, bfp8 or bfp4"),
                     (["--kld-base", src, "--sweep", "bfp4", "--group", "row"], "--group")]:
        r = q35("eval", "-m", src, "--ids", ids, *bad)
        assert r.returncode == 2 and why in r.stderr, r.stderr


# ---- a fake Hugging Face Hub ----

class FakeHub(http.server.ThreadingHTTPServer):
    def __init__(self, files, rev):
        super().__init__(("127.0.0.1", 0), HubHandler)
        self.files, self.rev = files, rev
        self.corrupt = set()      # names served with one byte flipped
        self.cut_once = set()     # names whose first full transfer breaks halfway
        self.ranges = []          # (name, Range header) of each request


class HubHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_GET(self):
        hub = self.server
        prefix = "/org/tiny/resolve/%s/" % hub.rev
        if self.path == "/api/models/org/tiny/tree/%s?recursive=true" % hub.rev:
            listing = []
            for name, data in hub.files.items():
                e = {"type": "file", "path": name, "size": len(data),
                     "oid": hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()}
                if name.endswith(".safetensors"):
                    e["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
                listing.append(e)
            listing.append({"type": "file", "path": "README.md", "size": 3, "oid": "0" * 40})
            return self._send(200, json.dumps(listing).encode())
        if not self.path.startswith(prefix) or self.path[len(prefix):] not in hub.files:
            return self._send(404, b"not found")
        name = self.path[len(prefix):]
        data = bytearray(hub.files[name])
        if name in hub.corrupt:
            data[len(data) // 3] ^= 1
        rng = self.headers.get("Range")
        hub.ranges.append((name, rng))
        start = int(rng[len("bytes="):].split("-")[0]) if rng else 0
        body = bytes(data[start:])
        self.send_response(206 if rng else 200)
        self.send_header("Content-Length", str(len(body)))
        if rng:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, len(data) - 1, len(data)))
        self.end_headers()
        if name in hub.cut_once and not rng:
            hub.cut_once.discard(name)
            self.wfile.write(body[:len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(body)

    def _send(self, code, body):
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def start_hub(model="tiny-b", rev="0123abcd"):
    files = {p.name: p.read_bytes() for p in (MODELS / model).iterdir()}
    hub = FakeHub(files, rev)
    threading.Thread(target=hub.serve_forever, daemon=True).start()
    return hub, "http://127.0.0.1:%d" % hub.server_address[1]


def download(url, dest, out, rev="0123abcd"):
    return q35("prepare", "--download", "org/tiny", "--revision", rev, "--hub-url", url, "--checkpoint", dest,
               "--out", out)


def test_download_resumes_an_interrupted_transfer(tmp_path):
    hub, url = start_hub()
    shard = "model.safetensors-00002-of-00003.safetensors"
    hub.cut_once.add(shard)
    # and a transfer broken in an earlier run, left as .partial
    other = "model.safetensors-00001-of-00003.safetensors"
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / (other + ".partial")).write_bytes(hub.files[other][:1000])
    try:
        p = download(url, tmp_path / "src", tmp_path / "cache")
        assert p.returncode == 0, p.stderr
        for name, data in hub.files.items():
            assert (tmp_path / "src" / name).read_bytes() == data
        assert (shard, None) in hub.ranges and any(n == shard and r for n, r in hub.ranges)
        assert (other, "bytes=1000-") in hub.ranges
        assert not any(n == "README.md" for n, _ in hub.ranges)
        assert q35("verify", tmp_path / "cache").returncode == 0
        # a second run finds everything in place and the same cache: nothing fetched
        n = len(hub.ranges)
        p = download(url, tmp_path / "src", tmp_path / "cache")
        assert p.returncode == 0, p.stderr
        assert len(hub.ranges) == n
    finally:
        hub.shutdown()


def test_download_refuses_a_corrupted_file(tmp_path):
    hub, url = start_hub()
    shard = "model.safetensors-00003-of-00003.safetensors"
    hub.corrupt.add(shard)
    try:
        p = download(url, tmp_path / "src", tmp_path / "cache")
        assert p.returncode == 1
        assert shard in p.stderr and "SHA-256" in p.stderr
        assert not (tmp_path / "src" / shard).exists() and not (tmp_path / "src" / (shard + ".partial")).exists()
        assert not (tmp_path / "cache" / "model.q35").exists()
        p = download(url.replace("http://127.0.0.1", "http://example.com"), tmp_path / "src", tmp_path / "cache")
        assert p.returncode == 1 and "https" in p.stderr
    finally:
        hub.shutdown()


def test_expect_refuses_a_source_with_the_wrong_hash(tmp_path):
    expect = tmp_path / "expect.json"
    data = (MODELS / "tiny-a" / "model.safetensors").read_bytes()
    expect.write_text(json.dumps({"files": {"model.safetensors": {"size": len(data), "sha256": "ab" * 32}}}))
    p = q35("prepare", "--checkpoint", MODELS / "tiny-a", "--out", tmp_path / "c", "--expect", expect)
    assert p.returncode == 1 and "model.safetensors" in p.stderr and "SHA-256" in p.stderr
    expect.write_text(json.dumps({"files": {"model.safetensors": {"size": len(data),
                                                                  "sha256": hashlib.sha256(data).hexdigest()}}}))
    p = q35("prepare", "--checkpoint", MODELS / "tiny-a", "--out", tmp_path / "c", "--expect", expect)
    assert p.returncode == 0, p.stderr


def test_eval_text_uses_the_tokenizer_copied_into_the_cache(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(MODELS / "tiny-a", src)
    for f in (ROOT / "tests" / "data" / "tokenizer" / "toy35").iterdir():
        shutil.copy(f, src / f.name)
    assert q35("prepare", "--checkpoint", src, "--out", tmp_path / "cache").returncode == 0
    assert (tmp_path / "cache" / "tokenizer.json").read_bytes() == (src / "tokenizer.json").read_bytes()
    text = tmp_path / "digits.txt"  # digits and spaces: toy35 ids below tiny-a's vocabulary of 320
    text.write_text(" ".join(str((i * 7919) % 100000) for i in range(60)) + "\n")
    t = q35("tokenize", "-m", tmp_path / "cache", "--file", text, "--ids-only")
    assert t.returncode == 0, t.stderr
    ids = tmp_path / "ids.txt"
    ids.write_text(t.stdout)
    by_text = q35("eval", "-m", tmp_path / "cache", "--text", text, "--kld-base", src, "--json")
    by_ids = q35("eval", "-m", tmp_path / "cache", "--ids", ids, "--kld-base", src, "--json")
    assert by_text.returncode == 0 and by_ids.returncode == 0, by_text.stderr + by_ids.stderr
    assert json.loads(by_text.stdout)["perplexity"] == json.loads(by_ids.stdout)["perplexity"]
    r = q35("eval", "-m", MODELS / "tiny-a", "--text", text)  # no tokenizer there
    assert r.returncode == 2 and "tiny-a" in r.stderr and "tokenizer.json" in r.stderr


DEMO = ROOT / "models" / "qwen35-demo"


def test_calibrated_prepare_is_gptq_deterministic_and_better(tmp_path):
    """--calibrate: the demo model reads one part of its held-out text; the cache it writes holds the same
    dtypes and bytes per token as the plain default, marks its calibrated tensors, gives the same bytes on
    1 and 2 threads and read in one pass or three, and diverges less from the checkpoint on another part of
    the text than the plain cache does."""
    text = (ROOT / "models" / "qwen35-demo-eval.txt").read_text()
    calib, held = tmp_path / "calib.txt", tmp_path / "held.txt"
    calib.write_text(text[:12000])
    held.write_text(text[100000:108000])

    def prepare(name, *extra):
        r = q35("prepare", "--checkpoint", DEMO, "--out", tmp_path / name, *extra, timeout=300)
        assert r.returncode == 0, r.stderr
        return r

    r = prepare("cal1", "--calibrate", calib, "--calib-ctx", "256", "-t", "1")
    assert "calibrated on" in r.stderr
    prepare("cal2", "--calibrate", calib, "--calib-ctx", "256", "-t", "2")
    r = prepare("cal3", "--calibrate", calib, "--calib-ctx", "256", "-t", "1", "--calib-layers", "3")
    assert "(3 passes)" in r.stderr  # the demo's 8 layers, 3 at a time
    prepare("plain")
    a, b = (tmp_path / "cal1" / "model.q35").read_bytes(), (tmp_path / "cal2" / "model.q35").read_bytes()
    assert a == b, "the calibrated cache depends on the thread count"
    assert a == (tmp_path / "cal3" / "model.q35").read_bytes(), "the calibrated cache depends on --calib-layers"
    assert a != (tmp_path / "plain" / "model.q35").read_bytes()

    man = json.loads((tmp_path / "cal1" / "manifest.json").read_text())
    plain = json.loads((tmp_path / "plain" / "manifest.json").read_text())
    sha = hashlib.sha256(calib.read_bytes()).hexdigest()
    assert man["calibration"] == f"gptq damp=0.01 text-sha256={sha} ctx=256" and man["cache_id"] != plain["cache_id"]
    for name, t in man["tensors"].items():
        assert t["dtype"] == plain["tensors"][name]["dtype"] and t["bytes"] == plain["tensors"][name]["bytes"]
        calibrated = t["dtype"] in ("BFP4", "BFP8") and t["source_dtype"] != t["dtype"] and len(t["shape"]) == 2 \
            and "embed_tokens" not in name
        # every matrix ran, the MTP head's too (the calibration speculates); the embedding is a lookup
        assert (t.get("encoder") == "gptq") == calibrated, name
    assert sum(t.get("encoder") == "gptq" for n, t in man["tensors"].items() if n.startswith("mtp.")) == 8
    assert sum(t.get("encoder") == "gptq" for t in man["tensors"].values()) >= 50
    assert q35("verify", tmp_path / "cal1").returncode == 0
    # the same calibration again: the directory is up to date, nothing is read
    r = prepare("cal1", "--calibrate", calib, "--calib-ctx", "256")
    assert "calibrated on" not in r.stderr

    def kld(name):
        r = q35("eval", "-m", tmp_path / name, "--kld-base", DEMO, "--text", held, "--json", timeout=300)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)["kld_mean"]

    k_cal, k_plain = kld("cal1"), kld("plain")
    # measured 0.00288 vs 0.00461 on these positions (demo model, 12k characters of calibration)
    assert k_cal < 0.8 * k_plain, (k_cal, k_plain)


def test_calibrate_refuses_what_it_cannot_use(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    r = q35("prepare", "--checkpoint", DEMO, "--out", tmp_path / "c", "--calibrate", empty)
    assert r.returncode == 1 and "too few to calibrate" in r.stderr
    assert not (tmp_path / "c" / "manifest.json").exists()
    r = q35("prepare", "--checkpoint", DEMO, "--out", tmp_path / "c", "--calibrate", tmp_path / "missing.txt")
    assert r.returncode == 2 and "missing.txt" in r.stderr
    r = q35("prepare", "--synthetic", MODELS / "tiny-a" / "config.json", "--out", tmp_path / "s", "--calibrate", empty)
    assert r.returncode == 2 and "--calibrate needs --checkpoint" in r.stderr
    r = q35("prepare", "--checkpoint", DEMO, "--out", tmp_path / "c", "--calibrate", empty, "--calib-ctx", "1")
    assert r.returncode == 2 and "bad --calib-ctx" in r.stderr
    r = q35("prepare", "--checkpoint", DEMO, "--out", tmp_path / "c", "--calibrate", empty, "--calib-layers", "0")
    assert r.returncode == 2 and "bad --calib-layers" in r.stderr
    r = q35("prepare", "--checkpoint", DEMO, "--out", tmp_path / "c", "--calib-layers", "2")
    assert r.returncode == 2 and "go with --calibrate" in r.stderr
    r = q35("eval", "-m", DEMO, "--text", empty, "--calib-ctx", "64")
    assert r.returncode == 2 and "--calib-ctx goes with --calibrate" in r.stderr


def test_calibrated_sweep_rows_equal_calibrated_caches(tmp_path):
    """eval --sweep --calibrate codes each swept matrix as prepare --calibrate does: a row equals the eval of
    the cache prepared with the same --set and calibration, bit for bit, and calibration lowers its KL."""
    text = (ROOT / "models" / "qwen35-demo-eval.txt").read_text()
    calib, held = tmp_path / "calib.txt", tmp_path / "held.txt"
    calib.write_text(text[:4000])
    held.write_text(text[100000:102000])
    common = ["--kld-base", DEMO, "--text", held, "--ctx", "256", "--json", "--group", "kind"]
    r = q35("eval", "-m", DEMO, *common, "--sweep", "bfp4", "--calibrate", calib, "--calib-ctx", "256", timeout=300)
    assert r.returncode == 0, r.stderr
    assert "calibrated on" in r.stderr
    cal = {row["group"]: row for row in json.loads(r.stdout)["rows"]}
    kind = "model.language_model.layers.*.mlp.down_proj.weight"
    sets = [a for t in cal[kind]["tensors"] for a in ("--set", t + "=bfp4")]

    def eval_cache(name, *extra):
        out = tmp_path / name
        r = q35("prepare", "--checkpoint", DEMO, "--out", out, "--policy", "bf16", *sets, *extra, timeout=300)
        assert r.returncode == 0, r.stderr
        r = q35("eval", "-m", out, "--kld-base", DEMO, "--text", held, "--ctx", "256", "--json", timeout=300)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    want = eval_cache("down4-cal", "--calibrate", calib, "--calib-ctx", "256")
    for k in ["kld_mean", "kld_max", "top1_agreement", "perplexity"]:
        assert cal[kind][k] == want[k], k
    assert want["kld_mean"] < eval_cache("down4-plain")["kld_mean"]
    r = q35("eval", "-m", DEMO, "--text", held, "--calibrate", calib)
    assert r.returncode == 2 and "--calibrate goes with --sweep" in r.stderr
