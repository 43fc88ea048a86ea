#!/usr/bin/env python3
"""A bounded soak of `qwen35 serve` with faults, on loopback only (see
scripts/stress.sh and docs/serving.md).

16 concurrent clients send a mix of requests (streaming and not, chat and
completions, greedy and seeded sampling with and without top-p / min-p /
top-k cuts, json_object responses, n > 1) for SECONDS, while 500
slow-header connections from 127.0.0.1 and 200 from 127.0.0.2 keep up their
pressure, a fault thread injects disconnects mid-stream, slow headers,
non-reading streams, oversized and malformed bodies, and the server goes
through one SIGTERM-restart cycle halfway; /health must answer within a
second throughout. It checks that every greedy (and seeded)
repeat is byte-identical, that no response ends without its end or an error,
that RSS stays within the prefix-cache cap plus a fixed margin, and that the
server never crashes. Prints a summary and writes it as JSON (--out)."""

import argparse
import http.client
import json
import os
import pathlib
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
from serve_util import BIN, SlowHeaders, free_port, make_text_model, raise_fd_limit, sse_events  # noqa: E402

CACHE = 16 << 20


class Soak:
    def __init__(self, args, model):
        self.args, self.model = args, model
        self.port = free_port()
        self.proc = None
        self.lock = threading.Lock()
        self.latency, self.errors, self.refused, self.expected = [], [], 0, {}
        self.tokens = self.requests = self.faults = self.restarts = 0
        self.rss = []
        self.counters, self.kinds = {}, {}
        self.health_worst = 0.0
        self.restarting = threading.Event()
        self.epoch = 0
        self.log = open(args.log, "w") if args.log else subprocess.DEVNULL

    # ---- the server ----
    def start(self):
        self.proc = subprocess.Popen([BIN, "serve", "-m", str(self.model), "--port", str(self.port), "-t", "1",
                                      "--parallel", "4", "--max-queue", "64", "--prefix-cache-bytes", str(CACHE),
                                      "--request-timeout", "3", "--write-timeout", "4", "--drain-timeout", "10",
                                      "--max-body", "65536"], stderr=self.log, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if self.get("/health")[0] == 200:
                    return
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise SystemExit(f"stress: the server exited with {self.proc.returncode} at start-up")
            time.sleep(0.05)
        raise SystemExit("stress: the server did not become ready")

    def stop(self):
        try:  # what the watchdog did, summed over the server's lives
            _, body = self.get("/metrics")
            for line in body.decode().splitlines():
                name = line.split("{")[0].split(" ")[0]
                if name in ("qwen35:streams_stalled_total", "qwen35:connections_timed_out_total",
                            "qwen35:prefix_cache_evictions_total", "qwen35:prefix_cache_lookup_hits_total"):
                    self.counters[name] = self.counters.get(name, 0) + float(line.split()[-1])
        except OSError:
            pass
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=30)
        if rc != 0:
            self.error(f"server exit status {rc} after SIGTERM")

    def restart(self):
        self.restarting.set()
        self.epoch += 1
        self.stop()
        self.start()
        self.restarts += 1
        self.epoch += 1
        self.restarting.clear()

    def window(self):
        """Taken when a request starts; overlaps() then says whether any
        part of it fell inside a restart (begun before, answered after, or
        both), where refusals and 503s are the expected answers."""
        return self.epoch, self.restarting.is_set()

    def overlaps(self, w):
        return w[1] or self.restarting.is_set() or self.epoch != w[0]

    # ---- HTTP ----
    def conn(self, timeout=30, source="127.0.0.3"):
        # each client its own loopback address, as separate hosts are (--max-conns-per-client)
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout, source_address=(source, 0))

    def get(self, path):
        c = self.conn(5)
        c.request("GET", path)
        r = c.getresponse()
        out = r.status, r.read()
        c.close()
        return out

    def error(self, msg):
        with self.lock:
            self.errors.append(msg)

    # ---- clients ----
    def request_body(self, rng):
        chat = rng.random() < 0.5
        key_prompt = rng.randrange(6)
        text = "request %d: " % key_prompt + "abc " * (1 + key_prompt * 7)
        greedy = rng.random() < 0.5
        body = {"model": "Qwen/Qwen3.5-9B", "max_tokens": rng.choice([4, 16, 32]), "temperature": 0 if greedy else 0.8,
                "stream": rng.random() < 0.5, "n": rng.choice([1, 1, 1, 2])}
        if not greedy:
            body["seed"] = rng.randrange(3)
            body.update(rng.choice([{}, {"top_p": 0.9}, {"min_p": 0.05}, {"top_k": 20, "top_p": 0.95}]))
        if chat:
            body["messages"] = [{"role": "user", "content": text}]
            if rng.random() < 0.25:
                body["response_format"] = {"type": "json_object"}
        else:
            body["prompt"] = text
        key = json.dumps({k: v for k, v in body.items() if k != "stream"}, sort_keys=True)
        return ("/v1/chat/completions" if chat else "/v1/completions"), body, key

    def one(self, rng, source):
        path, body, key = self.request_body(rng)
        t0 = time.monotonic()
        w = self.window()
        c = self.conn(source=source)
        try:
            c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
            r = c.getresponse()
            raw = r.read()
        except (OSError, http.client.HTTPException) as e:
            if self.overlaps(w):
                with self.lock:
                    self.refused += 1
                return
            self.error(f"{path}: {e!r}")
            return
        finally:
            c.close()
        dt = time.monotonic() - t0
        if r.status == 503 and self.overlaps(w):
            with self.lock:
                self.refused += 1
            return
        if r.status != 200:
            self.error(f"{path}: status {r.status}: {raw[:200]!r}")
            return
        texts, n_tok = self.parse(path, body, raw, w)
        if texts is None:
            return
        with self.lock:
            self.requests += 1
            self.latency.append(dt)
            self.tokens += n_tok
            if key in self.expected and self.expected[key] != texts:
                self.errors.append(f"a repeat differs: {key}: {self.expected[key]!r} != {texts!r}")
            self.expected.setdefault(key, texts)

    def parse(self, path, body, raw, w):
        chat = path.endswith("chat/completions")
        texts = [""] * body["n"]
        n_tok = 0
        if body["stream"]:
            events = sse_events(raw)
            if not events or events[-1] != "[DONE]":
                self.error(f"a stream ended without [DONE]: {raw[-200:]!r}")
                return None, 0
            finished = 0
            for e in events[:-1]:
                j = json.loads(e)
                if "error" in j:
                    if self.overlaps(w):
                        return None, 0
                    self.error(f"a stream ended with an error: {e[:200]}")
                    return None, 0
                for ch in j["choices"]:
                    part = ch["delta"].get("content") or "" if chat else ch["text"]
                    texts[ch["index"]] += part
                    finished += ch.get("finish_reason") is not None
                    n_tok += 1
            if finished != body["n"]:
                self.error(f"a stream lost a choice's end: {finished} of {body['n']}")
                return None, 0
        else:
            j = json.loads(raw)
            for ch in j["choices"]:
                if ch.get("finish_reason") is None:
                    self.error(f"a choice without finish_reason: {raw[:200]!r}")
                    return None, 0
                texts[ch["index"]] = ch["message"]["content"] or "" if chat else ch["text"]
            n_tok = j["usage"]["completion_tokens"]
        return texts, n_tok

    def client(self, i, t_end):
        rng = random.Random(i)
        while time.monotonic() < t_end:
            self.one(rng, f"127.0.0.{10 + i}")

    # ---- faults ----
    def fault(self, rng):
        kind = rng.choice(["disconnect", "slow_headers", "non_reading", "oversized", "malformed"])
        self.faults += 1
        self.kinds[kind] = self.kinds.get(kind, 0) + 1
        try:
            s = socket.create_connection(("127.0.0.1", self.port), timeout=5, source_address=("127.0.0.4", 0))
        except OSError:
            return
        w = self.window()
        try:
            stream = json.dumps({"prompt": "abc " * 10, "max_tokens": 2000, "stream": True, "ignore_eos": True}).encode()
            head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            if kind == "disconnect":
                s.sendall(head % len(stream) + stream)
                s.recv(100)
            elif kind == "slow_headers":
                s.sendall(b"GET /health HTTP/1.1\r\n")
                for i in range(8):  # past --request-timeout
                    time.sleep(0.5)
                    s.sendall(b"X-Slow: %d\r\n" % i)
            elif kind == "non_reading":
                s.sendall(head % len(stream) + stream)
                time.sleep(5)  # past --write-timeout
            elif kind in ("oversized", "malformed"):
                body = b'{"prompt": "' + b"x" * 100000 + b'"}' if kind == "oversized" else b'{"prompt": [1, 2,'
                s.sendall(head % len(body) + body)
                status = s.recv(4096).split(b"\r\n", 1)[0]
                want = b"413" if kind == "oversized" else b"400"
                if want not in status and not self.overlaps(w):
                    self.error(f"{kind} body: {status!r}")
        except OSError:
            pass
        finally:
            s.close()

    def faulter(self, t_end):
        rng = random.Random(99)
        while time.monotonic() < t_end:
            self.fault(rng)
            time.sleep(rng.uniform(0.1, 0.5))

    # ---- memory, and /health under the flood ----
    def sampler(self, t_end, t0):
        while time.monotonic() < t_end:
            try:
                t1, w = time.monotonic(), self.window()
                status, _ = self.get("/health")
                dt = time.monotonic() - t1
                if not self.overlaps(w):
                    self.health_worst = max(self.health_worst, dt)
                    if status != 200 or dt > 1:
                        self.error(f"/health answered {status} in {dt:.2f} s")
                _, body = self.get("/metrics")
                for line in body.decode().splitlines():
                    if line.startswith("process_resident_memory_bytes"):
                        self.rss.append((round(time.monotonic() - t0, 1), float(line.split()[-1])))
            except OSError:
                pass
            time.sleep(1)

    def run(self):
        self.start()
        t0 = time.monotonic()
        t_end = t0 + self.args.seconds
        threads = [threading.Thread(target=self.client, args=(i, t_end)) for i in range(16)]
        threads += [threading.Thread(target=self.faulter, args=(t_end,)),
                    threading.Thread(target=self.sampler, args=(t_end, t0))]
        flood = [SlowHeaders(self.port, "127.0.0.1", self.args.flood[0]), SlowHeaders(self.port, "127.0.0.2", self.args.flood[1])]
        for f in flood:
            f.__enter__()
        for t in threads:
            t.start()
        time.sleep(self.args.seconds / 2)
        if self.proc.poll() is not None:
            self.error(f"the server died with {self.proc.returncode}")
            self.start()
        self.restart()
        for t in threads:
            t.join()
        for f in flood:
            f.__exit__(None, None, None)
        if self.proc.poll() is not None:
            self.error(f"the server died with {self.proc.returncode}")
        else:
            self.stop()
        return self.report(time.monotonic() - t0)

    def report(self, wall):
        lat = sorted(self.latency)
        q = (lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] if lat else 0)
        base = self.rss[0][1] if self.rss else 0
        peak = max((r for _, r in self.rss), default=0)
        margin = int(self.args.rss_margin) << 20
        if peak > base + CACHE + margin:
            self.errors.append(f"RSS {peak / 2**20:.0f} MiB passed the start's {base / 2**20:.0f} MiB + "
                               f"the cache cap {CACHE >> 20} MiB + {margin >> 20} MiB")
        out = {"seconds": round(wall, 1), "requests": self.requests, "errors": len(self.errors),
               "refused_during_restart": self.refused, "faults": self.faults, "restarts": self.restarts,
               "distinct_repeated_requests": len(self.expected), "p50_s": round(q(0.5), 3), "p99_s": round(q(0.99), 3),
               "tokens_per_s": round(self.tokens / wall, 1),
               "faults_by_kind": self.kinds, "rss_mib": [(t, round(r / 2**20, 1)) for t, r in self.rss],
               "health_worst_s": round(self.health_worst, 3), "server_counters": self.counters, "first_errors": self.errors[:5]}
        return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--out", help="write the summary as JSON here")
    ap.add_argument("--log", help="the server's stderr goes here")
    ap.add_argument("--flood", type=int, nargs=2, default=[500, 200], metavar=("N1", "N2"),
                    help="slow-header connections from 127.0.0.1 and from 127.0.0.2 for the whole run")
    ap.add_argument("--rss-margin", type=int, default=96,
                    help="MiB that RSS may pass its start-up figure plus the cache budget by (a sanitizer build needs more)")
    args = ap.parse_args()
    raise_fd_limit(4096)
    with tempfile.TemporaryDirectory() as tmp:
        out = Soak(args, make_text_model(pathlib.Path(tmp) / "m")).run()
    rss = out["rss_mib"]
    print(f"stress: {out['requests']} requests in {out['seconds']} s, {out['errors']} errors, "
          f"{out['refused_during_restart']} refused during the restart, {out['faults']} faults; "
          f"latency p50 {out['p50_s']} s, p99 {out['p99_s']} s; {out['tokens_per_s']} tokens/s; "
          f"RSS {rss[0][1] if rss else 0} -> {max((r for _, r in rss), default=0)} MiB (peak); "
          f"worst /health {out['health_worst_s']} s under {args.flood[0]} + {args.flood[1]} slow-header connections")
    for e in out["first_errors"]:
        print("  error:", e)
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 1 if out["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
