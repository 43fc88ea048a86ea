"""End-to-end tests of response_format json_schema: constrained decoding
through the official openai client on the tiny random model with a
byte-level tokenizer (serve_util.make_text_model). Its output is random, so
what is checked is that every document parses and validates against its
schema (the jsonschema package), greedy and sampled, with speculation on
and off. The schemas bound every string and array, so each document closes
well within max_tokens."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from serve_util import MODELS, Server, make_text_model  # noqa: E402

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

pytestmark = pytest.mark.skipif(not (MODELS / "tiny-a" / "config.json").exists(), reason="tiny test models missing")

NAME = "Qwen/Qwen3.5-9B"
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}
MAX_TOKENS = 1500


def s(n=6, lo=0):
    return {"type": "string", "maxLength": n, **({"minLength": lo} if lo else {})}


def obj(props, req=None, extra=None):
    o = {"type": "object", "properties": props, "required": list(props) if req is None else req}
    if extra is not None:
        o["additionalProperties"] = extra
    return o


def arr(items, hi=3, lo=0):
    return {"type": "array", "items": items, "maxItems": hi, **({"minItems": lo} if lo else {})}


INT, NUM, BOOL, NULL = {"type": "integer"}, {"type": "number"}, {"type": "boolean"}, {"type": "null"}

SCHEMAS = [
    obj({"a": s()}),
    obj({"n": INT}),
    obj({"x": NUM}),
    obj({"ok": BOOL}),
    obj({"z": NULL}),
    obj({"name": s(8), "age": INT}),
    obj({"name": s(8), "age": INT, "ok": BOOL}, req=["name"]),
    obj({"a": s(), "b": s(), "c": s()}, req=[]),
    obj({"a": s(3)}, extra=False),
    obj({"a": s(3)}, extra=True),
    obj({"color": {"enum": ["red", "green", "blue"]}}),
    obj({"v": {"const": "fixed"}}),
    obj({"v": {"const": 42}}),
    obj({"mixed": {"enum": [1, "two", None, True, 3.5]}}),
    obj({"id": {"anyOf": [INT, NULL]}}),
    obj({"id": {"anyOf": [s(4), INT, BOOL]}}),
    obj({"t": {"type": ["string", "null"], "maxLength": 4}}),
    obj({"t": {"type": ["integer", "boolean"]}}),
    obj({"tags": arr(s(4))}),
    obj({"tags": arr(s(4), hi=4, lo=2)}),
    obj({"nums": arr(INT, hi=5)}),
    obj({"grid": arr(arr(INT, hi=2), hi=2)}),
    obj({"pts": arr(obj({"x": NUM, "y": NUM}), hi=2)}),
    obj({"inner": obj({"a": INT, "b": s(3)})}),
    obj({"l1": obj({"l2": obj({"l3": obj({"v": BOOL})})})}),
    obj({"user": obj({"name": s(5), "roles": arr({"enum": ["admin", "dev", "ops"]}, hi=3)}), "active": BOOL}),
    obj({"k": s(2, lo=2)}),
    obj({"empty": {"type": "object"}}),
    obj({"e": arr(INT, hi=0)}),
    obj({"any": {"anyOf": [obj({"kind": {"const": "a"}, "x": INT}), obj({"kind": {"const": "b"}, "y": s(3)})]}}),
    obj({"a b": s(3), "quote\"d": INT, "uni\u00e9": BOOL}),
    obj({"opt1": INT, "req": s(3), "opt2": BOOL}, req=["req"]),
    obj({"matrix": arr(arr(NUM, hi=2, lo=1), hi=2, lo=1)}),
    obj({"event": obj({"when": s(10), "where": obj({"lat": NUM, "lon": NUM}), "who": arr(s(4), hi=2)})}),
    obj({"status": {"enum": ["ok", "error"]}, "code": INT, "detail": {"anyOf": [s(6), NULL]}}),
    obj({"flags": arr(BOOL, hi=4, lo=1)}),
    obj({"nulls": arr(NULL, hi=2)}),
    obj({"choice": {"enum": [[1, 2], {"a": 1}, "x"]}}),
    obj({"deep": arr(obj({"k": arr(obj({"v": INT}), hi=2)}), hi=2)}),
    obj({"title": s(6), "items": arr(obj({"sku": s(4), "qty": INT, "price": NUM}, req=["sku", "qty"]), hi=2)}),
    {"type": "array", "items": INT, "maxItems": 4},
    {"type": "array", "items": obj({"a": BOOL}), "maxItems": 2, "minItems": 1},
    {"type": "string", "maxLength": 10},
    {"type": "integer"},
    {"type": "number"},
    {"type": "boolean"},
    {"type": "null"},
    {"enum": ["alpha", "beta", "gamma"]},
    {"anyOf": [obj({"a": INT}), arr(INT, hi=2), s(3)]},
    {"type": "object", "properties": {"p": {"type": "string", "maxLength": 5, "description": "a p", "title": "P"}},
     "required": ["p"], "title": "T", "description": "annotated"},
    obj({"a": obj({"b": arr(obj({"c": {"anyOf": [INT, s(2), NULL]}}), hi=2)}, req=[])}),
    obj({"r": {"type": ["array", "null"], "items": s(2), "maxItems": 2}}),
    obj({"when": {"type": "string", "maxLength": 3}, "num": {"type": "number"}, "int": {"type": "integer"},
         "enum": {"enum": [0, -1, 10]}}),
    obj({"x": {"anyOf": [{"anyOf": [INT, BOOL]}, NULL]}}),
]

# pattern, format, numeric bounds, oneOf, allOf, $ref (recursive too), prefixItems, uniqueItems
PT = {"type": "object", "properties": {"x": {"type": "integer", "minimum": -9, "maximum": 9}, "y": INT}, "required": ["x", "y"]}
NEW_SCHEMAS = [
    obj({"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"}}),
    obj({"slug": {"type": "string", "pattern": "^[a-z0-9]+(-[a-z0-9]+)*$", "maxLength": 12}}),
    obj({"hex": {"type": "string", "pattern": "^#[0-9a-fA-F]{6}$"}, "tag": {"type": "string", "pattern": "go", "maxLength": 8}}),
    obj({"when": {"type": "string", "format": "date"}, "at": {"type": "string", "format": "time"}}),
    obj({"ts": {"type": "string", "format": "date-time"}, "id": {"type": "string", "format": "uuid"}}),
    obj({"mail": {"type": "string", "format": "email", "maxLength": 24}, "ip": {"type": "string", "format": "ipv4"}}),
    obj({"age": {"type": "integer", "minimum": 0, "maximum": 120}, "score": {"type": "integer", "exclusiveMinimum": -5, "exclusiveMaximum": 5}}),
    obj({"p": {"type": "number", "minimum": 0, "maximum": 1}, "t": {"type": "number", "minimum": -40.5, "maximum": 60}}),
    obj({"big": {"type": "integer", "minimum": 1000000}, "neg": {"type": "integer", "maximum": -10}, "f": {"type": "number", "exclusiveMinimum": 2}}),
    {"oneOf": [obj({"kind": {"const": "circle"}, "r": {"type": "number", "minimum": 0, "maximum": 10}}),
               obj({"kind": {"const": "rect"}, "w": {"type": "integer", "minimum": 1, "maximum": 50}, "h": INT})]},
    obj({"v": {"oneOf": [s(4), {"type": "integer", "minimum": 0, "maximum": 99}, NULL]}}),
    {"allOf": [obj({"id": {"type": "integer", "minimum": 1}}), obj({"name": s(6)})]},
    {"type": "object", "allOf": [{"properties": {"n": {"type": "integer", "minimum": 0}}, "required": ["n"]},
                                 {"properties": {"n": {"maximum": 50}}}]},
    {"$defs": {"pt": PT}, "type": "object", "properties": {"a": {"$ref": "#/$defs/pt"}, "b": {"$ref": "#/$defs/pt"}}, "required": ["a", "b"]},
    {"definitions": {"tag": {"type": "string", "pattern": "^[a-z]{2,5}$"}}, "type": "array", "items": {"$ref": "#/definitions/tag"}, "maxItems": 3},
    {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer", "minimum": 0, "maximum": 9},
                                                         "next": {"$ref": "#/$defs/node"}}, "required": ["v"]}},
     "$ref": "#/$defs/node"},
    {"type": "object", "properties": {"name": s(3), "kids": {"type": "array", "items": {"$ref": "#"}, "maxItems": 1}}, "required": ["name", "kids"]},
    {"type": "array", "prefixItems": [{"type": "string", "format": "date"}, {"type": "integer", "minimum": 0, "maximum": 23}, BOOL],
     "items": False},
    obj({"row": {"type": "array", "prefixItems": [s(3), INT], "items": {"type": "number", "minimum": 0, "maximum": 5}, "maxItems": 4}}),
    {"$defs": {"base": obj({"id": {"type": "string", "format": "uuid"}})}, "type": "object",
     "properties": {"user": {"allOf": [{"$ref": "#/$defs/base"}, obj({"email": {"type": "string", "format": "email", "maxLength": 20}})]},
                    "ips": {"type": "array", "items": {"type": "string", "format": "ipv4"}, "maxItems": 2}},
     "required": ["user", "ips"]},
    obj({"one": {"type": "array", "items": INT, "uniqueItems": True, "maxItems": 1}}),
]
SCHEMAS += NEW_SCHEMAS
# 2020-12's checkers (date, email, ipv4, uuid, ...), and time and date-time by the standard library
# (jsonschema checks those only with rfc3339-validator installed)
CHECK_FORMATS = jsonschema.FormatChecker()
CHECK_FORMATS.checkers = dict(jsonschema.Draft202012Validator.FORMAT_CHECKER.checkers)
for _name, _parse in (("time", "time"), ("date-time", "datetime")):
    CHECK_FORMATS.checks(_name, raises=ValueError)(
        lambda v, p=_parse: not isinstance(v, str) or bool(getattr(__import__("datetime"), p).fromisoformat(v)))


def validate(doc, schema):
    jsonschema.validate(doc, schema, format_checker=CHECK_FORMATS)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_text_model(tmp_path_factory.mktemp("schemamodel"))


@pytest.fixture(scope="module", params=["2", "0"], ids=["spec", "nospec"])
def srv(request, model):
    with Server(model, "--parallel", "2", "--spec-k", request.param) as sv:
        sv.spec_k = int(request.param)
        yield sv


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def fmt(schema, name="out", **kw):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, **kw}}


def ask(client, schema, **kw):
    r = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Reply in JSON."}],
                                       max_tokens=MAX_TOKENS, response_format=fmt(schema, strict=True),
                                       extra_body=NO_THINK, **kw)
    return r.choices[0]


def test_at_least_fifty_schemas():
    assert len(SCHEMAS) >= 50 and len(NEW_SCHEMAS) >= 15
    for sc in SCHEMAS:
        jsonschema.Draft202012Validator.check_schema(sc)


@pytest.mark.parametrize("i", range(len(SCHEMAS)))
def test_every_output_validates(client, i):
    schema = SCHEMAS[i]
    for kw in ({"temperature": 0}, {"temperature": 1, "seed": 100 + i}):
        c = ask(client, schema, **kw)
        assert c.finish_reason == "stop", (kw, c.message.content)
        doc = json.loads(c.message.content)
        validate(doc, schema)


def test_speculation_stays_on_with_a_schema(srv, client):
    before = srv.metrics()["vllm:spec_decode_num_draft_tokens_total"]
    for seed in range(3):
        c = ask(client, obj({"a": arr(obj({"b": s(8), "c": INT}), hi=3)}), temperature=0, seed=seed)
        validate(json.loads(c.message.content), obj({"a": arr(obj({"b": s(8), "c": INT}), hi=3)}))
    drafts = srv.metrics()["vllm:spec_decode_num_draft_tokens_total"] - before
    assert drafts > 0 if srv.spec_k else drafts == 0


def test_streamed_output_validates(client):
    schema = obj({"name": s(6), "vals": arr(INT, hi=3)})
    stream = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "JSON"}], stream=True,
                                            max_tokens=MAX_TOKENS, temperature=1, seed=7, response_format=fmt(schema),
                                            extra_body=NO_THINK)
    text, finish = "", None
    for ev in stream:
        if ev.choices:
            text += ev.choices[0].delta.content or ""
            finish = ev.choices[0].finish_reason or finish
    assert finish == "stop"
    validate(json.loads(text), schema)


def test_completions_endpoint_and_n(client):
    schema = obj({"a": INT, "b": BOOL})
    r = client.completions.create(model=NAME, prompt="JSON:", max_tokens=MAX_TOKENS, temperature=1, seed=3, n=3,
                                  extra_body={"response_format": fmt(schema)})
    assert len(r.choices) == 3
    for c in r.choices:
        assert c.finish_reason == "stop"
        validate(json.loads(c.text), schema)


def test_max_tokens_mid_document_is_length(client):
    r = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "JSON"}], max_tokens=5,
                                       temperature=0, response_format=fmt(obj({"a": s(50, lo=50)})), extra_body=NO_THINK)
    c = r.choices[0]
    assert c.finish_reason == "length" and c.message.content.startswith('{"a"')


def test_with_thinking_only_the_answer_is_constrained(client):
    schema = obj({"a": INT})
    done = 0
    for seed in range(1, 5):
        r = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "JSON"}], max_tokens=400,
                                           temperature=1, seed=seed, response_format=fmt(schema))
        m, c = r.choices[0].message, r.choices[0]
        assert m.reasoning_content
        if c.finish_reason == "stop" and m.content:
            done += 1
            validate(json.loads(m.content), schema)
    print(f"{done} of 4 reasoned to </think> and answered")


BAD = [
    ({"type": "json_schema"}, "response_format"),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "response_format.json_schema.schema"),
    (fmt({"type": "string", "pattern": "(?=a)"}), "response_format.json_schema.schema.pattern"),
    (fmt(obj({"a": {"type": "string", "format": "email", "minLength": 3}})), "response_format.json_schema.schema.properties.a.format"),
    (fmt({"type": "array", "uniqueItems": True}), "response_format.json_schema.schema.uniqueItems"),
    (fmt({"allOf": [INT, s(3)]}), "response_format.json_schema.schema.allOf"),
    (fmt({"type": "integer", "minimum": 5, "maximum": 1}), "response_format.json_schema.schema"),
    (fmt({"type": "strung"}), "response_format.json_schema.schema.type"),
    (fmt({"type": "array", "minItems": 3, "maxItems": 1}), "response_format.json_schema.schema.minItems"),
    (fmt({"type": "string", "maxLength": -1}), "response_format.json_schema.schema.maxLength"),
    (fmt({"enum": []}), "response_format.json_schema.schema.enum"),
    (fmt({"type": "object", "properties": {"a": {"$ref": "#/x"}}}), "response_format.json_schema.schema.properties.a.$ref"),
    (fmt({"anyOf": "no"}), "response_format.json_schema.schema.anyOf"),
    (fmt({"oneOf": [INT, NUM]}), "response_format.json_schema.schema.oneOf"),
    (fmt("not a schema"), "response_format.json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"schema": INT, "strict": "yes"}}, "response_format.json_schema.strict"),
]


@pytest.mark.parametrize("rf,param", BAD)
def test_bad_schemas_are_400_naming_the_field(srv, rf, param):
    status, body = srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "response_format": rf})
    assert status == 400, body
    assert body["error"]["param"] == param and param in body["error"]["message"], body


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city", "parameters": obj(
        {"city": s(8), "days": INT, "unit": {"type": "string", "enum": ["c", "f"]}, "hourly": BOOL}, req=["city", "days", "unit"])}},
    {"type": "function", "function": {"name": "search", "parameters": obj(
        {"query": s(6, lo=1), "filters": obj({"lang": {"enum": ["en", "fr"]}, "max": INT}), "tags": arr(s(3), hi=2),
         "score": NUM, "opt": {"type": "string"}}, req=["query", "filters", "tags", "score"])}},
    {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}},
    # pydantic's shape for nested models: $defs and $refs, and bounds
    {"type": "function", "function": {"name": "book", "parameters": {
        "$defs": {"Addr": obj({"city": s(6), "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}),
                  "Unit": {"type": "string", "enum": ["room", "suite"]}},
        "type": "object", "properties": {"to": {"$ref": "#/$defs/Addr"}, "unit": {"$ref": "#/$defs/Unit"},
                                         "nights": {"type": "integer", "minimum": 1, "maximum": 14},
                                         "when": {"type": "string", "maxLength": 10}},
        "required": ["to", "unit", "nights", "when"]}}},
]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def forced(client, choice, **kw):
    r = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Call a tool."}], tools=TOOLS,
                                       tool_choice=choice, max_tokens=MAX_TOKENS, extra_body=NO_THINK, **kw)
    return r.choices[0]


@pytest.mark.parametrize("name", [None, "get_weather", "search", "now", "book"])
def test_tool_choice_forces_a_valid_tool_call(client, name):
    choice = "required" if name is None else {"type": "function", "function": {"name": name}}
    for kw in ({"temperature": 0}, {"temperature": 1, "seed": 5}, {"temperature": 1, "seed": 6}):
        c = forced(client, choice, **kw)
        assert c.finish_reason == "tool_calls", c.message
        calls = c.message.tool_calls
        assert len(calls) == 1 and (name is None or calls[0].function.name == name)
        args = json.loads(calls[0].function.arguments)
        validate(args, PARAMS[calls[0].function.name])
        assert set(PARAMS[calls[0].function.name].get("required", [])) <= set(args)


def test_tool_choice_errors_name_the_field(srv):
    bad = [{"type": "function", "function": {"name": "f", "parameters": obj({"a": {"anyOf": [INT, NULL]}})}}]
    status, body = srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": bad,
                                                     "tool_choice": "required"})
    assert status == 400 and body["error"]["param"] == "tools[0].function.parameters.properties.a.type", body
    status, body = srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": TOOLS,
                                                     "tool_choice": "required", "response_format": fmt(INT)})
    assert status == 400 and body["error"]["param"] == "tool_choice", body
