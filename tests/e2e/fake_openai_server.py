"""A minimal OpenAI-compatible streaming server that stands in for vLLM and
llama-server in the tests of `qwen35 bench`.

It serves /v1/models, /metrics (vLLM-style speculative-decoding counters and a
resident-memory gauge) and a streaming /v1/completions that emits one SSE
event per generated "token", in chunked transfer encoding, the way vLLM does.
A mode makes it misbehave in one chosen way:

  normal        well-behaved; the completion depends only on the prompt
  unauthorized  401 unless the request carries "Authorization: Bearer secret"
  nonstream     ignores stream=true and answers one JSON completion
  malformed     the second event is not JSON
  hang          sends the headers, then nothing
  die:N[:K]     the first N completion requests are fine; the next one stops
                after K events (default 3) and closes the connection
  nousage       never sends the usage chunk
  llama         no /metrics; speculation counters in the final chunk's
                "timings" (draft_n, draft_n_accepted), as llama-server does
  varying       the completion differs from one request to the next

Run it by hand with: python3 fake_openai_server.py [--port P] [--mode M].
"""

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

API_KEY = "secret"
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


class FakeState:
    def __init__(self, mode):
        self.mode = mode
        self.requests = []  # the JSON bodies of /v1/completions requests
        self.completions = 0
        self.drafts = 0
        self.draft_tokens = 0
        self.accepted_tokens = 0
        self.stop = threading.Event()
        self.lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state = None  # set by FakeServer

    def log_message(self, fmt, *args):
        pass

    def handle(self):
        try:
            super().handle()
        except (BrokenPipeError, ConnectionResetError):
            pass  # bench hung up first, as it does on a malformed event

    def send_json(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def send_chunk(self, data: bytes):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def send_event(self, obj):
        text = obj if isinstance(obj, str) else json.dumps(obj)
        self.send_chunk(("data: %s\n\n" % text).encode())

    def do_GET(self):
        st = self.state
        if self.path == "/v1/models":
            self.send_json(200, {"object": "list", "data": [{"id": "fake-qwen", "object": "model"}]})
        elif self.path == "/metrics" and st.mode != "llama":
            with st.lock:
                lines = [
                    "# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.",
                    "# TYPE vllm:spec_decode_num_drafts_total counter",
                    'vllm:spec_decode_num_drafts_total{engine="0",model_name="fake-qwen"} %.1f' % st.drafts,
                    'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="fake-qwen"} %.1f' % st.draft_tokens,
                    'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="fake-qwen"} %.1f'
                    % st.accepted_tokens,
                    'vllm:spec_decode_num_drafts_created{engine="0",model_name="fake-qwen"} 1.7e9',
                    "# TYPE process_resident_memory_bytes gauge",
                    "process_resident_memory_bytes %.1f" % (1.0e9 + 1.0e6 * st.completions),
                ]
            body = ("\n".join(lines) + "\n").encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self.send_json(404, {"error": {"message": "not found", "type": "NotFoundError", "code": 404}})

    def do_POST(self):
        st = self.state
        length = int(self.headers.get("Content-Length", "0"))
        req = json.loads(self.rfile.read(length) or b"{}")
        if self.path != "/v1/completions":
            self.send_json(404, {"error": {"message": "not found", "code": 404}})
            return
        if st.mode == "unauthorized" and self.headers.get("Authorization") != "Bearer " + API_KEY:
            self.send_json(401, {"error": {"code": 401, "message": "Invalid API Key",
                                           "type": "authentication_error"}})
            return
        with st.lock:
            st.requests.append(req)
            seq = st.completions
            st.completions += 1
        max_tokens = int(req.get("max_tokens", 16))
        prompt = req.get("prompt", "")
        seed = len(prompt) + (seq if st.mode == "varying" else 0)
        tokens = [" " + WORDS[(seed + i) % len(WORDS)] for i in range(max_tokens)]

        if st.mode == "nonstream":
            self.send_json(200, {"id": "cmpl-1", "object": "text_completion", "model": req.get("model"),
                                 "choices": [{"index": 0, "text": "".join(tokens), "finish_reason": "length"}],
                                 "usage": {"prompt_tokens": 5, "completion_tokens": max_tokens,
                                           "total_tokens": 5 + max_tokens}})
            return

        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if st.mode == "hang":
            st.stop.wait(60)
            return
        time.sleep(0.01)  # "prefill"
        for i, tok in enumerate(tokens):
            if st.mode == "malformed" and i == 1:
                self.send_chunk(b'data: {"choices": [{"text": "oops"\n\n')
                self.send_event("[DONE]")
                self.send_chunk(b"")
                return
            if st.mode.startswith("die:") and seq >= int(st.mode.split(":")[1]) and \
                    i == int((st.mode.split(":") + ["3"])[2]):
                self.wfile.flush()
                self.connection.shutdown(2)
                self.close_connection = True
                return
            last = i == len(tokens) - 1
            self.send_event({"id": "cmpl-%d" % seq, "object": "text_completion", "created": 0,
                             "model": req.get("model"),
                             "choices": [{"index": 0, "text": tok, "logprobs": None,
                                          "finish_reason": "length" if last else None}]})
            time.sleep(0.001)
        drafts = max_tokens // 2
        accepted = (drafts * 5) // 6
        with st.lock:
            st.drafts += drafts
            st.draft_tokens += drafts
            st.accepted_tokens += accepted
        if st.mode != "nousage":
            final = {"id": "cmpl-%d" % seq, "object": "text_completion", "created": 0, "model": req.get("model"),
                     "choices": [],
                     "usage": {"prompt_tokens": len(prompt.split()), "completion_tokens": max_tokens,
                               "total_tokens": len(prompt.split()) + max_tokens}}
            if st.mode == "llama":
                final["timings"] = {"draft_n": drafts, "draft_n_accepted": accepted}
            self.send_event(final)
        self.send_event("[DONE]")
        self.send_chunk(b"")


class FakeServer:
    """Serves on 127.0.0.1 in a background thread; use as a context manager."""

    def __init__(self, mode="normal", port=0):
        self.state = FakeState(mode)
        handler = type("BoundHandler", (Handler,), {"state": self.state})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self.httpd.daemon_threads = True
        self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.state.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--mode", default="normal")
    args = ap.parse_args()
    with FakeServer(args.mode, args.port) as srv:
        print("fake OpenAI server (%s) on %s" % (args.mode, srv.url), flush=True)
        try:
            srv.thread.join()
        except KeyboardInterrupt:
            pass
