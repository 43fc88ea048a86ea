"""The deploy/ files: the Kubernetes manifests parse and carry what
docs/serving.md says they do (no cluster needed), and deploy/haproxy.cfg in
front of 3 replicas on loopback keeps conversations on their replica
(cached_tokens stay high), moves new requests off a replica that dies,
and takes a replica that drains after SIGTERM out of the pool on its
/health 503 with no client error. The HAProxy tests need Debian's haproxy
package (scripts/install-deps.sh installs it) and skip without it."""

import http.client
import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, os.path.dirname(__file__))
from serve_util import MODELS, Server, free_port  # noqa: E402

yaml = pytest.importorskip("yaml")


def manifests():
    out = {}
    for f in sorted((ROOT / "deploy" / "k8s").glob("*.yaml")):
        for doc in yaml.safe_load_all(f.read_text()):
            assert doc["apiVersion"] and doc["metadata"]["name"], f
            out[doc["kind"]] = doc
    return out


def test_k8s_manifests_parse_and_agree():
    m = manifests()
    assert set(m) == {"Deployment", "Service", "PodDisruptionBudget"}
    dep, svc, pdb = m["Deployment"], m["Service"], m["PodDisruptionBudget"]
    pod = dep["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert svc["spec"]["selector"].items() <= labels.items()
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert dep["spec"]["replicas"] >= 2 and pdb["spec"]["maxUnavailable"] == 1
    (c,) = pod["spec"]["containers"]
    args = c["args"]
    assert args[0] == "serve"
    port = int(args[args.index("--port") + 1])
    assert c["ports"][0]["containerPort"] == port and svc["spec"]["ports"][0]["targetPort"] == c["ports"][0]["name"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    # the pod outlives its drain
    assert pod["spec"]["terminationGracePeriodSeconds"] > int(args[args.index("--drain-timeout") + 1])
    assert args[args.index("--max-conns-per-client") + 1] == "0"
    assert c["resources"]["requests"]["memory"] and c["resources"]["limits"]["memory"]


def containerfile_stages():
    """The Debian packages each stage of the Containerfile installs."""
    stages = []
    for chunk in (ROOT / "Containerfile").read_text().split("\nFROM ")[1:]:
        pkgs = set()
        for cmd in re.findall(r"apt-get install ([^&]*)", chunk.replace("\\\n", " ")):
            pkgs |= {w for w in cmd.split() if not w.startswith("-")}
        stages.append(pkgs)
    return stages


def test_containerfile_installs_what_the_build_links():
    """The build stage has every -dev package scripts/install-deps.sh names
    (the link line needs them), and the runtime stage the package of each
    library the Makefile links, found as dpkg owns the .so the -dev package
    points to (so a library added to LDLIBS cannot be forgotten there)."""
    build, runtime = containerfile_stages()
    deps = re.search(r"APT_PKGS=\(([^)]*)\)", (ROOT / "scripts" / "install-deps.sh").read_text()).group(1).split()
    assert {"build-essential", "pkg-config"} <= build
    assert {p for p in deps if p.endswith("-dev")} <= build, {p for p in deps if p.endswith("-dev")} - build
    ldlibs = re.search(r"^LDLIBS\s*\+?=(.*)$", (ROOT / "Makefile").read_text(), re.M).group(1).split()
    libs = [f[2:] for f in ldlibs if f.startswith("-l") and f not in ("-lpthread", "-lm")]
    if shutil.which("dpkg") is None:
        pytest.skip("no dpkg here to map libraries to packages")
    for lib in libs:
        so = pathlib.Path(f"/usr/lib/x86_64-linux-gnu/lib{lib}.so")
        if not so.exists():
            pytest.skip(f"{so} missing (scripts/install-deps.sh)")
        owner = subprocess.run(["dpkg", "-S", str(so.resolve())], capture_output=True, text=True, check=True)
        pkg = owner.stdout.split(":")[0]
        assert pkg in runtime, f"-l{lib} is {pkg}, which the Containerfile's runtime stage lacks"


def ask(port, session, prompt, timeout=30, **extra):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    body = {"prompt": prompt, "max_tokens": 2, "temperature": 0, **extra}
    c.request("POST", "/v1/completions", body=json.dumps(body),
              headers={"Content-Type": "application/json", "X-Session-Id": session})
    r = c.getresponse()
    body = r.read()
    c.close()
    return r.status, (json.loads(body) if r.status == 200 else body)


def start_haproxy(tmp_path, replicas):
    """deploy/haproxy.cfg over the replicas, on a free port; (process, port) once it answers."""
    front = free_port()
    cfg = (ROOT / "deploy" / "haproxy.cfg").read_text()
    cfg = cfg.replace("bind 127.0.0.1:8080", f"bind 127.0.0.1:{front}")
    for i, r in enumerate(replicas):
        cfg = cfg.replace(f"127.0.0.1:{8001 + i} check", f"127.0.0.1:{r.port} check")
    (tmp_path / "haproxy.cfg").write_text(cfg)
    subprocess.run(["haproxy", "-c", "-f", str(tmp_path / "haproxy.cfg")], check=True, capture_output=True)
    proxy = subprocess.Popen(["haproxy", "-db", "-f", str(tmp_path / "haproxy.cfg")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 10
    while True:
        try:
            if ask(front, "warm", [1, 2, 3])[0] == 200:
                return proxy, front
        except OSError:
            pass
        assert time.monotonic() < deadline, "haproxy did not come up"
        time.sleep(0.1)


needs_haproxy = [
    pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy not installed (apt-get install haproxy)"),
    pytest.mark.skipif(os.environ.get("Q35_BACKEND", "cpu") != "cpu", reason="the load balancer, once, on the cpu backend"),
    pytest.mark.skipif(not (MODELS / "tiny-a" / "config.json").exists(), reason="tiny test models missing"),
]


def with_haproxy(f):
    for mark in needs_haproxy:
        f = mark(f)
    return f


@with_haproxy
def test_haproxy_affinity_and_failover(tmp_path):
    replicas = [Server("tiny-a", "--max-conns-per-client", "0") for _ in range(3)]
    for r in replicas:
        r.__enter__()
    proxy = None
    try:
        proxy, front = start_haproxy(tmp_path, replicas)

        # conversations: each turn extends the last; affinity keeps the prefix on one replica
        sessions = {f"conv-{i}": [7 + i, 100 + i] * 40 for i in range(9)}
        cached, prompt_total = 0, 0
        for turn in range(3):
            for sid, hist in sessions.items():
                status, r = ask(front, sid, hist)
                assert status == 200, r
                if turn:
                    cached += r["usage"]["prompt_tokens_details"]["cached_tokens"]
                    prompt_total += r["usage"]["prompt_tokens"]
                hist += [5, 6, 7, 8]
        assert cached / prompt_total > 0.8, (cached, prompt_total)
        served = [r.metrics()["vllm:prompt_tokens_total"] > 0 for r in replicas]
        assert sum(served) >= 2  # the sessions spread over the replicas

        # kill one replica mid-run: once the health check notices, nothing fails
        victim = replicas[0]
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait()
        time.sleep(3.5)  # fall 2 at inter 1s
        failures = []
        for turn in range(2):
            for sid, hist in sessions.items():
                status, r = ask(front, sid, hist)
                if status != 200:
                    failures.append((sid, status, r))
                else:
                    hist += [5, 6]
        assert not failures, failures[:3]
    finally:
        if proxy:
            proxy.send_signal(signal.SIGTERM)
            proxy.wait(timeout=10)
        for r in replicas:
            r.__exit__(None, None, None)


def served_by(replicas, before):
    """The replica whose finished-request count moved since `before`."""
    now = [r.metrics()["vllm:request_success_total"] for r in replicas]
    moved = [i for i, (a, b) in enumerate(zip(before, now)) if b > a]
    assert len(moved) == 1, moved
    return moved[0], now


@with_haproxy
def test_haproxy_drain_takes_a_replica_out_with_no_client_error(tmp_path):
    """SIGTERM to a replica with requests in flight through HAProxy (one
    running, more queued at --parallel 1): its /health turns 503, HAProxy
    takes it out of the pool on that check, the requests in flight finish
    there whole, new ones (its sessions' too) go to the other replicas, and
    no client sees an error (the few that reach it before the check are
    answered 503 and retried elsewhere: retry-on 503)."""
    import concurrent.futures as cf
    replicas = [Server("tiny-a", "--max-conns-per-client", "0", "--parallel", "1", "--drain-timeout", "60")
                for _ in range(3)]
    for r in replicas:
        r.__enter__()
    proxy = None
    try:
        proxy, front = start_haproxy(tmp_path, replicas)
        # which sessions hash to which replica
        home = {}
        counts = [r.metrics()["vllm:request_success_total"] for r in replicas]
        for i in range(24):
            assert ask(front, f"s{i}", [3, 4, 5])[0] == 200
            home[f"s{i}"], counts = served_by(replicas, counts)
        victim = max(range(3), key=lambda k: sum(v == k for v in home.values()))
        mine = [sid for sid, k in home.items() if k == victim]
        assert mine and len(mine) < len(home)

        long_tokens = 4000
        with cf.ThreadPoolExecutor(12) as ex:
            in_flight = [ex.submit(ask, front, mine[i % len(mine)], [9, 8, 7], 120, max_tokens=long_tokens,
                                   ignore_eos=True) for i in range(10)]
            deadline = time.monotonic() + 20
            while replicas[victim].metrics()["vllm:num_requests_waiting"] < 3:
                assert time.monotonic() < deadline, "the requests did not queue on their replica"
                time.sleep(0.05)
            replicas[victim].proc.send_signal(signal.SIGTERM)
            t_term = time.monotonic()
            failures, answered, moved = [], 0, 0
            while not all(f.done() for f in in_flight) or time.monotonic() - t_term < 4:
                assert time.monotonic() - t_term < 90
                for sid in home:
                    status, r = ask(front, sid, [1, 2, 3, 4])
                    answered += 1
                    if status != 200:
                        failures.append((sid, status, r))
                time.sleep(0.05)
            results = [f.result() for f in in_flight]
        assert not failures, failures[:3]
        for status, r in results:  # the requests in flight finished whole on the draining replica
            assert status == 200 and r["usage"]["completion_tokens"] == long_tokens, r
        assert replicas[victim].proc.wait(timeout=30) == 0
        # after the drain its sessions are served by the others
        counts = [r.metrics()["vllm:request_success_total"] for k, r in enumerate(replicas) if k != victim]
        for sid in mine:
            assert ask(front, sid, [1, 2])[0] == 200
        after = [r.metrics()["vllm:request_success_total"] for k, r in enumerate(replicas) if k != victim]
        assert sum(after) - sum(counts) == len(mine)
    finally:
        if proxy:
            proxy.send_signal(signal.SIGTERM)
            _, err = proxy.communicate(timeout=10)
        for r in replicas:
            r.__exit__(None, None, None)
    # it left the pool on its health check's 503, before the process was gone
    assert re.search(r"Server qwen35/r%d is DOWN, reason: Layer7 wrong status, code: 503" % (victim + 1), err), err
    print(f"drain through haproxy: {answered} requests during the drain, none failed; {len(results)} in flight finished")
