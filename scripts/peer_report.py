#!/usr/bin/env python3
"""Collects the runs of scripts/bench-peer.sh into bench-data/peer.json and prints a table.

  peer_report.py quality --work DIR --formats F,.. --policies P,.. --text FILE --ctx N --seconds S
                         --version V --out FILE
  peer_report.py bench --runs DIR --gguf-dir DIR --formats Q4_0,Q4_K_M --threads 1,2 --rounds N
                       --prompt P --decode D --seconds S --version V --sha256 H --out FILE
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_flags():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                f = line.split(":", 1)[1].split()
                return [x for x in ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vnni", "avx512_bf16") if x in f]
    except OSError:
        pass
    return []


def rng(v):
    return {"min": min(v), "max": max(v), "median": statistics.median(v), "values": v}


def fmt_range(v, unit=""):
    lo, hi = min(v), max(v)
    return f"{lo:.2f}{unit}" if abs(hi - lo) < 0.005 else f"{lo:.2f}-{hi:.2f}{unit}"


def gguf_info(path):
    here = Path(__file__).resolve().parent
    out = subprocess.run([sys.executable, str(here / "peer_gguf.py"), "info", str(path)], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def load_at(p):
    try:
        return float(Path(str(p) + ".load").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def bench(a):
    runs = Path(a.runs)
    fmts = a.formats.split(",")
    threads = [int(t) for t in a.threads.split(",")]
    res = {"schema": "qwen35-bench-peer/1",
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "flags": cpu_flags(),
                       "loadavg_at_end": list(os.getloadavg())},
           "settings": {"threads": threads, "rounds": a.rounds, "prompt": a.prompt, "decode": a.decode,
                        "seconds": a.seconds, "isa": a.isa},
           "llama_cpp": {"source": a.version + " (PyPI sdist, vendored llama.cpp)", "sha256": a.sha256,
                         "cmake_flags": a.llama_flags},
           "files": {}, "runs": [], "summary": {}, "ratios": {}}
    q_cache = None
    for f in fmts:
        res["files"][f] = gguf_info(Path(a.gguf_dir) / f"qwen35-9b-random-{f}.gguf")
    series = {}   # (engine, threads, metric) -> [values]

    def add(engine, t, metric, v):
        series.setdefault((engine, t, metric), []).append(v)
    for r in range(1, a.rounds + 1):
        for t in threads:
            for f in fmts:
                p = runs / f"llama-{f}-t{t}-r{r}.json"
                rows = json.loads(p.read_text())
                for row in rows:
                    res["llama_cpp"]["build_commit"] = row.get("build_commit")
                    res["llama_cpp"]["model_type"] = res["llama_cpp"].get("model_type", {})
                    res["llama_cpp"]["model_type"][f] = row.get("model_type")
                    metric = "prompt" if row["n_prompt"] > 0 else "decode"
                    v = float(row["avg_ts"])
                    add("llama.cpp " + f, t, metric, v)
                    res["runs"].append({"round": r, "threads": t, "engine": "llama.cpp", "format": f,
                                        "metric": metric, "tok_s": v, "tokens": row["n_prompt"] or row["n_gen"],
                                        "time": row.get("test_time"), "repack": row.get("repack"),
                                        "flash_attn": row.get("flash_attn"), "loadavg_1min_before": load_at(p)})
            p = runs / f"qwen35-t{t}-r{r}.json"
            j = json.loads(p.read_text())
            q_cache = j.get("model")
            res["qwen35"] = {"model": j.get("model"), "kernels": j.get("kernels"),
                             "bytes_per_token": j.get("bytes_per_token")}
            d = next(x for x in j["decode"] if x["threads"] == t)
            pr = next(x for x in j["prompt"] if x["tokens"] == a.prompt)
            add("qwen35", t, "decode", d["tok_s"])
            add("qwen35", t, "prompt", pr["tok_s"])
            add("qwen35", t, "bandwidth", d["measured_bw_gb_s"])
            res["runs"].append({"round": r, "threads": t, "engine": "qwen35", "metric": "decode", "tok_s": d["tok_s"],
                                "gb_s": d["gb_s"], "measured_bw_gb_s": d["measured_bw_gb_s"], "pct_bw": d["pct_bw"],
                                "loadavg_1min_before": load_at(p)})
            res["runs"].append({"round": r, "threads": t, "engine": "qwen35", "metric": "prompt", "tok_s": pr["tok_s"],
                                "tokens": a.prompt})
    for (e, t, m), v in series.items():
        res["summary"].setdefault(e, {}).setdefault(str(t), {})[m] = rng(v)
    # ratios qwen35 / llama.cpp: per round (same round, same threads), and of the medians
    for f in fmts:
        e = "llama.cpp " + f
        for t in threads:
            for m in ("prompt", "decode"):
                q = series[("qwen35", t, m)]
                ll = series[(e, t, m)]
                per_round = [qq / lv for qq, lv in zip(q, ll)]
                res["ratios"].setdefault(f"qwen35 / {e}", {}).setdefault(str(t), {})[m] = {
                    "median_ratio": statistics.median(q) / statistics.median(ll), "per_round": per_round}
    for f in fmts:
        info = res["files"][f]
        for t in threads:
            dv = series[("llama.cpp " + f, t, "decode")]
            res["summary"]["llama.cpp " + f][str(t)]["decode_gb_s"] = rng([x * info["bytes_per_token"] / 1e9 for x in dv])
    Path(a.out).write_text(json.dumps(res, indent=1) + "\n")

    # the table
    m = res["machine"]
    print(f"\nbench-peer: {res['date']}, {m['cpu']}, {m['cores']} cores ({' '.join(m['flags'])}); "
          f"llama.cpp {res['llama_cpp'].get('build_commit')} from {a.version}; "
          f"{a.rounds} rounds, prompt {a.prompt}, decode {a.decode}; {a.seconds} s; instruction sets {a.isa} "
          f"(llama.cpp {a.llama_flags}, qwen35 {res['qwen35']['kernels']} kernels)")
    hdr = "| | " + " | ".join(f"{t} thread{'s' if t > 1 else ''}" for t in threads) + " |"
    print(hdr)
    print("|---" * (len(threads) + 1) + "|")
    for f in fmts:
        e = "llama.cpp " + f
        gb = res["files"][f]["bytes_per_token"] / 1e9
        for mname, label in (("prompt", f"prompt {a.prompt}"), ("decode", "decode")):
            print(f"| {e} ({gb:.2f} GB/token), {label} | " +
                  " | ".join(fmt_range(series[(e, t, mname)], " tok/s") for t in threads) + " |")
    qgb = (res["qwen35"]["bytes_per_token"] or 0) / 1e9
    for mname, label in (("prompt", f"prompt {a.prompt}"), ("decode", "decode")):
        print(f"| qwen35 ({qgb:.2f} GB/token), {label} | " +
              " | ".join(fmt_range(series[("qwen35", t, mname)], " tok/s") for t in threads) + " |")
    print("| read bandwidth measured by qwen35 speed | " +
          " | ".join(fmt_range(series[("qwen35", t, "bandwidth")], " GB/s") for t in threads) + " |")
    for f in fmts:
        e = "llama.cpp " + f
        for mname in ("prompt", "decode"):
            print(f"| qwen35 / {f}, {mname} (per round) | " + " | ".join(
                fmt_range(res["ratios"][f"qwen35 / {e}"][str(t)][mname]["per_round"], "x") for t in threads) + " |")
    print(f"wrote {a.out}")


def parse_llama_kld(log):
    import re
    t = Path(log).read_text(errors="replace")

    def num(pat):
        m = re.search(pat, t, re.M)
        if not m:
            raise SystemExit(f"peer_report: {log}: no '{pat}' in llama-perplexity's output")
        return float(m.group(1))
    return {"perplexity": num(r"^Mean PPL\(Q\)\s*:\s*([0-9.]+)"), "base_perplexity": num(r"^Mean PPL\(base\)\s*:\s*([0-9.]+)"),
            "kld_mean": num(r"^Mean\s+KLD:\s*([-0-9.]+)"), "kld_p99": num(r"^99\.0%\s+KLD:\s*([-0-9.]+)"),
            "kld_max": num(r"^Maximum KLD:\s*([-0-9.]+)"), "top1_agreement": num(r"^Same top p:\s*([0-9.]+)") / 100}


def decode_speeds():
    """decode tok/s at the 9B shapes: {engine/format: {threads: median}} from bench-data/peer.json and bench.json."""
    out = {}
    src = []
    p = Path("bench-data/peer.json")
    if p.exists():
        j = json.loads(p.read_text())
        src.append(f"bench-data/peer.json ({j['date']})")
        for e, per in j["summary"].items():
            key = "qwen35 default" if e == "qwen35" else e
            for t, m in per.items():
                if "decode" in m:
                    out.setdefault(key, {})[t] = m["decode"]["median"]
    b = Path("bench.json")
    if b.exists() and "qwen35 default" not in out:
        j = json.loads(b.read_text())
        if "9b-synthetic-default" in str(j.get("model", "")):
            src.append("bench.json")
            for d in j.get("decode", []):
                out.setdefault("qwen35 default", {})[str(d["threads"])] = d["tok_s"]
    return out, src


def quality(a):
    import re
    w = Path(a.work)
    fmts = a.formats.split(",")
    pols = a.policies.split(",")
    speeds, speed_src = decode_speeds()
    info16 = json.loads((w / "info-F16.json").read_text())
    nweights = info16["weights_per_token"]
    res = {"schema": "qwen35-quality-peer/1",
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "machine": {"cpu": cpu_name(), "cores": os.cpu_count()},
           "model": "models/qwen35-demo", "text": a.text, "ctx": a.ctx, "seconds": a.seconds,
           "llama_cpp": a.version, "windows": json.loads((w / "windows.json").read_text()),
           "f16_vs_bf16": json.loads((w / "check.json").read_text()),
           "weights_read_per_token": nweights, "speed_source": speed_src, "rows": []}
    base_log = (w / "F16.log").read_text(errors="replace") + (w / "F16.err").read_text(errors="replace")
    m = re.search(r"Final estimate: PPL = ([0-9.]+)", base_log)
    res["rows"].append({"engine": "llama.cpp", "format": "F16 (base)", "bits_per_weight": info16["bits_per_weight_read"],
                        "bytes_per_token": info16["bytes_per_token"], "perplexity": float(m.group(1)),
                        "kld_mean": 0.0, "kld_p99": 0.0, "top1_agreement": 1.0, "decode_9b": speeds.get("llama.cpp F16")})
    for f in fmts:
        info = json.loads((w / f"info-{f}.json").read_text())
        qlog = (w / f"quantize-{f}.log").read_text(errors="replace") if (w / f"quantize-{f}.log").exists() else ""
        fb = re.search(r"([0-9]+) of ([0-9]+) tensor\(s\) required fallback quantization", qlog)
        r = {"engine": "llama.cpp", "format": f, "bits_per_weight": info["bits_per_weight_read"],
             "bytes_per_token": info["bytes_per_token"], "tensor_types": info["tensor_types"],
             "fallback_tensors": int(fb.group(1)) if fb else 0,
             "decode_9b": speeds.get("llama.cpp " + f)}
        r.update(parse_llama_kld(w / f"{f}.log"))
        res["rows"].append(r)
    for p in pols:
        q = json.loads((w / f"q-{p}.json").read_text())
        ev = json.loads((w / f"qeval-{p}.json").read_text())
        txt = (w / f"qinfo-{p}.txt").read_text()
        mm = re.search(r"^bytes read per generated token: ([0-9]+)", txt, re.M)
        bpt = int(mm.group(1)) if mm else None
        # the two ways of measuring qwen35 must agree (same positions, same arithmetic up to rounding)
        for k in ("kld_mean", "perplexity", "top1_agreement"):
            if abs(q[k] - ev[k]) > 1e-4 * max(1.0, abs(q[k])) + 2e-6:
                raise SystemExit(f"peer_report: policy {p}: {k} from qwen35 logits {q[k]} and from qwen35 eval {ev[k]} differ")
        r = {"engine": "qwen35", "format": p if p != "bf16" else "bf16 (base)", "bits_per_weight": 8.0 * bpt / nweights if bpt else None,
             "bytes_per_token": bpt, "perplexity": q["perplexity"], "base_perplexity": q["base_perplexity"],
             "kld_mean": q["kld_mean"], "kld_p99": q["kld_p99"], "kld_max": q["kld_max"],
             "top1_agreement": q["top1_agreement"], "eval_kld_base": {k: ev[k] for k in ("perplexity", "kld_mean", "top1_agreement")},
             # a calibrated cache has its plain twin's dtypes, bytes and kernels: the same decode speed
             "decode_9b": speeds.get("qwen35 " + (p[:-5] if p.endswith("+gptq") else p))}
        res["rows"].append(r)
    Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    def sp(d):
        if not d:
            return "not measured"
        return " / ".join(f"{d[k]:.2f}" for k in sorted(d, key=int))
    ths = sorted({k for r in res["rows"] if r["decode_9b"] for k in r["decode_9b"]}, key=int)
    win = res["windows"]
    print(f"\nquality-peer: {res['date']}; models/qwen35-demo on {a.text}: {win['n_chunk']} windows of {a.ctx}, "
          f"positions {win['first_scored']}-{a.ctx - 2} of each scored ({win['n_chunk'] * win['scored_per_window']} positions); "
          f"llama.cpp F16 PPL {res['f16_vs_bf16']['llama_f16_ppl']:.4f} vs qwen35 BF16 {res['f16_vs_bf16']['qwen35_bf16_ppl']:.4f}")
    print("| engine | format | tensors | bits/weight read | PPL | mean KL | top-1 | KL p99 | decode at 9B, tok/s (" + " / ".join(f"{t} thr." for t in ths) + ") |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in res["rows"]:
        bpw = f"{r['bits_per_weight']:.2f}" if r["bits_per_weight"] else "?"
        tt = ", ".join(f"{v} {k}" for k, v in sorted((r.get("tensor_types") or {}).items(), key=lambda x: -x[1]) if k != "F32")
        if r.get("fallback_tensors"):
            tt += f" ({r['fallback_tensors']} fallback{'s' if r['fallback_tensors'] > 1 else ''})"
        print(f"| {r['engine']} | {r['format']} | {tt or '-'} | {bpw} | {r['perplexity']:.4f} | {r['kld_mean']:.5f} | "
              f"{100 * r['top1_agreement']:.2f}% | {r['kld_p99']:.4f} | {sp(r['decode_9b'])} |")
    print(f"wrote {a.out}")


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bench")
    for k in ("runs", "gguf-dir", "formats", "threads", "version", "sha256", "out"):
        b.add_argument("--" + k, required=True)
    for k in ("rounds", "prompt", "decode", "seconds"):
        b.add_argument("--" + k, type=int, required=True)
    b.add_argument("--isa", choices=("native", "avx2"), default="native")
    b.add_argument("--llama-flags", default="")
    q = sub.add_parser("quality")
    for k in ("work", "formats", "policies", "text", "version", "out"):
        q.add_argument("--" + k, required=True)
    for k in ("ctx", "seconds"):
        q.add_argument("--" + k, type=int, required=True)
    a = ap.parse_args()
    if a.cmd == "bench":
        bench(a)
    else:
        quality(a)


if __name__ == "__main__":
    main()
