"""Starts a real `qwen35 serve` process on a free 127.0.0.1 port for the
end-to-end tests, and small raw-HTTP helpers for what the openai client
cannot send (bad bodies, slow bodies, hang-ups)."""

import http.client
import json
import os
import pathlib
import re
import resource
import signal
import socket
import subprocess
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = os.environ.get("Q35_BIN", str(ROOT / "build" / "qwen35"))
MODELS = ROOT / "tests" / "data" / "models"


class Server:
    def __init__(self, model="tiny-a", *args):
        self.model_dir = MODELS / model
        # one engine thread: the tiny models gain nothing from more, and CI cores are shared
        threads = [] if "-t" in args else ["-t", "1"]
        self.args = [BIN, "serve", "-m", str(self.model_dir), "--port", "0", *threads, *args]
        self.proc = None
        self.port = None
        self.log = []

    def __enter__(self):
        self.proc = subprocess.Popen(self.args, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError("server exited: " + "".join(self.log))
            self.log.append(line)
            m = re.search(r"listening on http://[^:]+:(\d+)", line)
            if m:
                self.port = int(m.group(1))
            if "qwen35 serve: ready" in line:
                break
        else:
            raise RuntimeError("server did not start: " + "".join(self.log))
        # keep draining stderr so the server never blocks on a full pipe
        import threading
        threading.Thread(target=self._drain, daemon=True).start()
        return self

    def _drain(self):
        for line in self.proc.stderr:
            self.log.append(line)

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        time.sleep(0.1)  # the drain thread reads the last lines
        log = "".join(self.log)
        # under a sanitizer build (Q35_BIN=build-asan/qwen35), any report fails the test
        assert "AddressSanitizer" not in log and "runtime error:" not in log and "LeakSanitizer" not in log, log[-4000:]

    def wait_log(self, pred, timeout=10.0):
        """True once a line of the server's stderr satisfies pred: the lines
        are read on another thread, so a line written just before a response
        may reach self.log just after it."""
        deadline = time.monotonic() + timeout
        while True:
            if any(pred(line) for line in list(self.log)):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def alive(self):
        return self.proc.poll() is None

    def request(self, method, path, body=None, headers=None, timeout=30):
        """(status, headers, body bytes) for one raw request."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode()
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        conn.request(method, path, body=body, headers=h)
        r = conn.getresponse()
        data = r.read()
        conn.close()
        return r.status, dict(r.getheaders()), data

    def post(self, path, body, **kw):
        status, _, data = self.request("POST", path, body, **kw)
        try:
            return status, json.loads(data)
        except ValueError:
            return status, data

    def metrics(self):
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name, value = line.rsplit(" ", 1)
            name = re.sub(r"\{.*\}", "", name) if "_bucket" not in name else name
            out[name] = out.get(name, 0.0) + float(value)
        return out

    def raw_socket(self):
        return socket.create_connection(("127.0.0.1", self.port), timeout=10)


def free_port():
    """A loopback port nobody listens on (for a server that must keep its port)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def sse_events(raw):
    """The data: payloads of an SSE body, in order."""
    out = []
    for block in raw.decode().split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: "):
                out.append(line[6:])
    return out


def read_all(sock, timeout=30):
    """Everything the server sends until it closes (an OSError, such as a reset, propagates)."""
    sock.settimeout(timeout)
    raw = b""
    while True:
        part = sock.recv(65536)
        if not part:
            return raw
        raw += part


def recv_until(sock, marker, limit=1 << 20):
    """Reads from sock until marker has arrived; returns what was read."""
    raw = b""
    while marker not in raw and len(raw) < limit:
        part = sock.recv(4096)
        if not part:
            break
        raw += part
    return raw



def _tokenizer_files():
    """scripts/tokenizer-files.py, for its Qwen3.5 added tokens, split regex
    and byte-to-unicode table."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("tokenizer_files", ROOT / "scripts" / "tokenizer-files.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def make_text_model(dst, base="tiny-a"):
    """A model directory with a tiny checkpoint and a byte-level tokenizer
    small enough for its 320-token vocabulary: the 256 bytes (ids 0..255),
    no merges, and the Qwen3.5 added tokens from id 256 (<|im_end|> = 258,
    <think> = 280) and Qwen3.5-9B's chat template. Real text goes in and
    out; the weights are random."""
    dst = pathlib.Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    src = MODELS / base
    for name in ("config.json", "generation_config.json"):
        (dst / name).write_bytes((src / name).read_bytes())
    (dst / "model.safetensors").symlink_to(src / "model.safetensors")
    tf = _tokenizer_files()
    b2u = tf.bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    added = [{"id": 256 + i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": special} for i, (t, special) in enumerate(tf.ADDED)]
    regex = tf.QWEN35_PATTERN
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
           "normalizer": {"type": "NFC"},
           "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
               {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
               {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
           "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
           "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                     "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                     "vocab": vocab, "merges": []}}
    (dst / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    # the model stands in for Qwen3.5-9B: its chat template too
    (dst / "chat_template.jinja").write_bytes((ROOT / "tests" / "data" / "chat" / "qwen35_9b_chat_template.jinja").read_bytes())
    return dst


class SlowHeaders:
    """n connections from `source` that send a request head one header line
    per `period` seconds and never end it; a connection the server closes
    is opened again (the attack keeps its pressure). It runs in a process of
    its own, as an attacker would, so its work does not slow the measuring
    client's threads."""

    def __init__(self, port, source, n, period=1.0):
        import multiprocessing
        self.port, self.source, self.n, self.period = port, source, n, period
        self.socks, self.lines, self.reopened = [], [], 0
        self.stop = multiprocessing.Event()
        self.proc = multiprocessing.Process(target=self._main, daemon=True)

    def _open(self):
        try:
            s = socket.socket()
            s.settimeout(1)
            s.bind((self.source, 0))
            s.connect(("127.0.0.1", self.port))
            s.setblocking(False)
            return s
        except OSError:
            return None

    def __enter__(self):
        self.proc.start()
        return self

    def _main(self):
        raise_fd_limit(self.n + 256)
        self.socks = [self._open() for _ in range(self.n)]
        self.lines = [0] * self.n
        self._run()

    def _run(self):
        while not self.stop.is_set():
            for i, s in enumerate(self.socks):
                line = self.lines[i]
                try:
                    if s is None:
                        raise OSError
                    s.send(b"GET /v1/models HTTP/1.1\r\n" if line == 0 else b"X-Slow-%d: 1\r\n" % line)
                    self.lines[i] += 1
                except OSError:
                    if s is not None:
                        s.close()
                    self.socks[i] = self._open()  # a new connection starts with its request line
                    self.lines[i] = 0
                    self.reopened += 1
            self.stop.wait(self.period)

    def __exit__(self, *exc):
        self.stop.set()
        self.proc.join(timeout=10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


def raise_fd_limit(n):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(n, hard), hard))
