"""End-to-end tests of constrained decoding with speculation on the demo
model (whose MTP head drafts well): json_object, json_schema and forced
tool calls give, greedy, exactly the output of a server without drafts,
while the drafts are made and accepted (the /metrics counters), and every
document parses and validates."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from serve_util import ROOT, Server  # noqa: E402

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

DEMO_DIR = ROOT / "models" / "qwen35-demo"
DEMO = "../../../models/qwen35-demo"
pytestmark = pytest.mark.skipif(not (DEMO_DIR / "model.safetensors").exists(), reason="demo model missing")

NAME = "Qwen/Qwen3.5-9B"
PROMPTS = ["The json module can encode a dictionary such as ", "Example configuration:\n", "def parse(data):\n    return "]
SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40}, "count": {"type": "integer", "minimum": 0,
                                                                                           "maximum": 1000},
                                      "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z_]{1,12}$"}, "maxItems": 4}},
     "required": ["name", "count", "tags"]},
    {"type": "array", "items": {"type": "object", "properties": {"key": {"type": "string", "maxLength": 20},
                                                                  "value": {"anyOf": [{"type": "number", "minimum": -100, "maximum": 100}, {"type": "null"}]}},
                                "required": ["key", "value"]}, "minItems": 1, "maxItems": 3},
]
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"module": {"type": "string", "maxLength": 20}, "depth": {"type": "integer", "minimum": 1, "maximum": 5},
                                     "names": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3},
                                     "opts": {"type": "object", "properties": {"deep": {"type": "boolean"}, "lang": {"enum": ["en", "fr"]}},
                                              "required": ["deep", "lang"]},
                                     "unused": {"type": "string"}},
    "required": ["module", "depth", "names", "opts"]}}}]


@pytest.fixture(scope="module")
def servers():
    with Server(DEMO, "--parallel", "2", "--spec-k", "2") as spec, Server(DEMO, "--parallel", "2", "--spec-k", "0") as plain:
        yield spec, plain


def counters(srv):
    m = srv.metrics()
    return m["vllm:spec_decode_num_draft_tokens_total"], m["vllm:spec_decode_num_accepted_tokens_total"]


def both(servers, path, body):
    out = []
    for srv in servers:
        status, r = srv.post(path, body)
        assert status == 200, r
        out.append(r["choices"][0])
    return out


def test_json_object_and_json_schema_speculate_and_equal_the_plain_output(servers):
    spec, _ = servers
    d0, a0 = counters(spec)
    formats = [{"type": "json_object"}] + [{"type": "json_schema", "json_schema": {"name": "o", "schema": sc}} for sc in SCHEMAS]
    for rf, schema in zip(formats, [None] + SCHEMAS):
        for prompt in PROMPTS:
            body = {"model": NAME, "prompt": prompt, "max_tokens": 400, "temperature": 0, "response_format": rf}
            a, b = both(servers, "/v1/completions", body)
            assert a["text"] == b["text"] and a["finish_reason"] == b["finish_reason"], (rf, prompt, a, b)
            if a["finish_reason"] == "stop":
                doc = json.loads(a["text"])
                if schema:
                    jsonschema.validate(doc, schema)
                else:
                    assert isinstance(doc, dict)
            else:
                assert schema is None  # only json_object has unbounded strings
    d1, a1 = counters(spec)
    assert d1 - d0 > 50 and a1 - a0 > 0, (d1 - d0, a1 - a0)


def test_forced_tool_calls_speculate_and_satisfy_the_parameters(servers):
    spec, _ = servers
    d0, _ = counters(spec)
    params = TOOLS[0]["function"]["parameters"]
    for choice in ("required", {"type": "function", "function": {"name": "lookup"}}):
        body = {"model": NAME, "messages": [{"role": "user", "content": "Look up the json module."}], "tools": TOOLS,
                "tool_choice": choice, "max_tokens": 300, "temperature": 0}
        a, b = both(servers, "/v1/chat/completions", body)
        assert a["message"] == b["message"] or a["message"]["tool_calls"][0]["function"] == b["message"]["tool_calls"][0]["function"]
        assert a["finish_reason"] == "tool_calls", a
        (call,) = a["message"]["tool_calls"]
        args = json.loads(call["function"]["arguments"])
        jsonschema.validate(args, params)
        assert set(params["required"]) <= set(args)
    assert counters(spec)[0] > d0
