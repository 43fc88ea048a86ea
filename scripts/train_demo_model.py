#!/usr/bin/env python3
"""Train the small Qwen3.5 demo model (main model plus MTP head) on the Python documentation.

Setup (Debian/Ubuntu; the corpus is the reST source of the Python documentation, PSF license):

    apt-get install python3.11-doc          # ships /usr/share/doc/python3.11/html/_sources/**/*.rst.txt
    pip install torch transformers tokenizers safetensors

Usage (from the repository root):

    python3 scripts/train_demo_model.py                       # full run, writes models/qwen35-demo/
    python3 scripts/train_demo_model.py --steps 3 --out /tmp/demo --eval-out /tmp/demo-eval.txt  # smoke test
    python3 scripts/train_demo_model.py --eval-only            # re-measure an existing checkpoint

What it does, in order:
  1. reads the corpus, strips reST markup, holds out a fixed list of files for evaluation;
  2. trains a byte-level BPE tokenizer with `tokenizers` (Qwen3.5 regex, NFC, ByteLevel), appends the
     33 Qwen3.5 added tokens in Qwen3.5's order and with its special flags, writes tokenizer.json,
     tokenizer_config.json (ChatML chat template) and chat_template.jinja;
  3. builds transformers' own Qwen3_5ForConditionalGeneration (Gated DeltaNet and gated attention
     layers, 3:1) and an MTP head with exactly the published `mtp.*` structure, and trains both jointly
     (loss = LM loss + mtp_weight * MTP loss);
  4. saves the checkpoint in the layout of the published Qwen3.5-9B (BF16, A_log and the gated norm
     in F32, untied lm_head, `mtp.*` added to model.safetensors);
  5. reloads it with transformers and measures held-out perplexity, MTP acceptance at temperature 0
     and greedy samples; writes them to <out>/training_log.json.

MTP semantics (vLLM's Qwen3_5MultiTokenPredictor): row p combines the main model's post-final-norm
hidden state h_p with the embedding of token x_{p+1}:
    u = fc([RMSNorm1p(E[x_{p+1}]) | RMSNorm1p(h_p)]); u = decoder_layer(u, RoPE position p);
    draft_logits_p = lm_head(RMSNorm1p(u)), a prediction of x_{p+2}.
The MTP layer attends causally over the MTP rows. Embedding and lm_head are shared with the main model.

The run is deterministic for a given seed (single thread, deterministic algorithms, fixed step count).
"""

import argparse
import copy
import glob
import hashlib
import json
import math
import os
import re
import sys
import time
import unicodedata

LIN, FULL = "linear_attention", "full_attention"
DEFAULT_CORPUS = "/usr/share/doc/python3.11/html/_sources"
F32_SUFFIXES = ("linear_attn.A_log", "linear_attn.norm.weight")

# Qwen3.5's pre-tokenizer regex, verbatim from its tokenizer.json.
QWEN35_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|"
                r" ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# The 33 Qwen3.5 added tokens in id order, with their `special` flag.
ADDED_TOKENS = [
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True),
    ("<|box_start|>", True), ("<|box_end|>", True),
    ("<|quad_start|>", True), ("<|quad_end|>", True),
    ("<|vision_start|>", True), ("<|vision_end|>", True),
    ("<|vision_pad|>", True), ("<|image_pad|>", True), ("<|video_pad|>", True),
    ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False),
    ("<tool_response>", False), ("</tool_response>", False),
    ("<think>", False), ("</think>", False),
    ("<|audio_start|>", True), ("<|audio_end|>", True),
    ("<tts_pad>", True), ("<tts_text_bos>", True), ("<tts_text_eod>", True), ("<tts_text_bos_single>", True),
    ("<|audio_pad|>", True),
]

# A ChatML template in the shape of Qwen's (no tools, no vision): system first, then user/assistant turns,
# `<think>\n\n</think>\n\n` after the generation prompt only when enable_thinking is explicitly false.
CHAT_TEMPLATE = (
    "{%- if not messages %}{{- raise_exception('No messages provided.') }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and not loop.first %}"
    "{{- raise_exception('System message must be at the beginning.') }}"
    "{%- endif %}"
    "{%- if message.content is string %}{%- set content = message.content %}"
    "{%- elif message.content is none %}{%- set content = '' %}"
    "{%- else %}{%- set ns = namespace(text='') %}"
    "{%- for part in message.content %}{%- if part.type == 'text' %}"
    "{%- set ns.text = ns.text ~ part.text %}{%- endif %}{%- endfor %}"
    "{%- set content = ns.text %}{%- endif %}"
    "{{- '<|im_start|>' + message.role + '\\n' + content | trim + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)

# Files of the corpus kept out of training; their text is the held-out evaluation set.
HELD_OUT = [
    "tutorial/classes.rst.txt",
    "tutorial/errors.rst.txt",
    "howto/sorting.rst.txt",
    "howto/logging.rst.txt",
    "faq/design.rst.txt",
    "library/json.rst.txt",
    "library/pathlib.rst.txt",
    "reference/compound_stmts.rst.txt",
]

CHAT_PROMPTS = ["What is {}?", "Tell me about {}.", "Explain {}.", "Can you describe {}?",
                "What should I know about {}?", "How does {} work?"]


def fail(msg):
    sys.exit(f"train_demo_model.py: error: {msg}")


# ----------------------------------------------------------------------------------------------------
# Corpus


SKIP_DIRECTIVES = {
    "index", "toctree", "highlight", "sectionauthor", "moduleauthor", "testsetup", "testcleanup",
    "include", "literalinclude", "raw", "image", "figure", "tabularcolumns", "only", "productionlist",
    "audit-event", "audit-event-table", "availability", "impl-detail", "opcode", "c:type", "c:macro",
    "c:var", "c:member", "c:function", "c:struct", "c:enum", "c:enumerator", "csv-table", "list-table",
    "table", "pdb-command", "envvar", "cmdoption", "option", "program", "grammar-snippet", "limited-api-list",
    "autoclass", "automodule", "autofunction", "include", "code-block-caption", "doctest-ignore", "_",
}
ROLE_RE = re.compile(r":[\w:+.-]+:`([^`]*)`")
LITERAL_RE = re.compile(r"``([^`]*)``")
LINK_RE = re.compile(r"`([^`<]*?)\s*(?:<[^>`]*>)?`_{1,2}")
INTERP_RE = re.compile(r"`([^`]*)`")
ADORN_RE = re.compile(r"^([=\-~^*#\"+`'.:_])\1{3,}\s*$")
DIRECTIVE_RE = re.compile(r"^(\s*)\.\.\s+(?:(_)[^:]*:|\|[^|]*\|\s+)?([\w:-]*)(::)?\s*(.*)$")
OPTION_RE = re.compile(r"^\s+:[\w-]+:(\s.*)?$")


def _role_text(m):
    text = m.group(1)
    target = re.match(r"^(.*?)\s*<[^>]*>$", text, re.S)
    if target and target.group(1):
        text = target.group(1)
    return text.lstrip("~!")


def clean_rst(text):
    """Turn reST source into plain text: drop labels, index entries and markup, keep prose and code."""
    out = []
    skip_indent = None
    in_directive_header = False
    for line in text.splitlines():
        stripped = line.strip()
        indent = len(line) - len(line.lstrip(" "))
        if skip_indent is not None:
            if not stripped or indent > skip_indent:
                continue
            skip_indent = None
        if in_directive_header:
            if stripped and OPTION_RE.match(line):
                continue
            in_directive_header = False
        m = DIRECTIVE_RE.match(line)
        if m:
            label, name, has_colons, arg = m.group(2), m.group(3), m.group(4), m.group(5)
            if label or not has_colons or name in SKIP_DIRECTIVES:
                skip_indent = indent  # a label, a comment or a skipped directive: drop its body too
                continue
            in_directive_header = True
            if arg and name not in ("note", "warning", "seealso", "versionadded", "versionchanged",
                                    "deprecated", "code-block", "sourcecode", "code", "doctest"):
                out.append(" " * indent + arg)  # e.g. ".. function:: open(file)" -> "open(file)"
            continue
        if ADORN_RE.match(line):
            continue
        if stripped == "::":
            continue
        line = ROLE_RE.sub(_role_text, line)
        line = LITERAL_RE.sub(r"\1", line)
        line = LINK_RE.sub(r"\1", line)
        line = INTERP_RE.sub(r"\1", line)
        line = line.replace("**", "").replace("\\", "")
        if line.rstrip().endswith("::"):
            line = line.rstrip()[:-1]
        out.append(line.rstrip())
    text = "\n".join(out)
    text = re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"
    return unicodedata.normalize("NFC", text)


def chat_pairs(raw):
    """(heading, first paragraph) pairs of one reST file, for chat-formatted training samples."""
    lines = raw.splitlines()
    pairs = []
    for i in range(1, len(lines) - 1):
        if ADORN_RE.match(lines[i]) and lines[i - 1].strip() and not ADORN_RE.match(lines[i - 1]):
            heading = clean_rst(lines[i - 1]).strip()
            if not heading or len(heading) > 60 or len(lines[i].strip()) < len(lines[i - 1].strip()):
                continue
            body = clean_rst("\n".join(lines[i + 1:i + 40])).strip()
            paragraphs = [p for p in body.split("\n\n") if p and not p.startswith(" ") and len(p) > 80]
            if paragraphs:
                answer = paragraphs[0].replace("\n", " ")
                if len(answer) <= 600:
                    pairs.append((heading, answer))
    return pairs


def load_corpus(corpus_dir):
    if not os.path.isdir(corpus_dir):
        fail(f"corpus directory {corpus_dir} does not exist. Install it with `apt-get install python3.11-doc` "
             f"(Debian/Ubuntu) or pass --corpus DIR (a directory of *.rst.txt files)")
    files = sorted(glob.glob(os.path.join(corpus_dir, "**", "*.rst.txt"), recursive=True))
    if len(files) < 50:
        fail(f"corpus directory {corpus_dir} holds {len(files)} *.rst.txt files; expected the Python "
             f"documentation sources (about 500 files)")
    rel = [os.path.relpath(f, corpus_dir) for f in files]
    missing = [h for h in HELD_OUT if h not in rel]
    if missing:
        fail(f"held-out files missing from the corpus: {', '.join(missing)}")
    train, held, pairs = [], [], []
    for path, name in zip(files, rel):
        with open(path, encoding="utf-8") as f:
            raw = f.read()
        text = clean_rst(raw)
        if name in HELD_OUT:
            held.append(text)
        else:
            train.append(text)
            pairs.extend(chat_pairs(raw))
    return train, held, pairs, rel


def chat_documents(pairs):
    docs = []
    for i, (heading, answer) in enumerate(pairs):
        q = CHAT_PROMPTS[i % len(CHAT_PROMPTS)].format(heading)
        docs.append(f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n{answer}<|im_end|>\n")
    return docs


# ----------------------------------------------------------------------------------------------------
# Tokenizer


def train_tokenizer(texts, base_vocab, out_dir):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, \
        processors, trainers
    tok = Tokenizer(models.BPE(ignore_merges=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN35_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=base_vocab, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator(texts, trainer=trainer)
    if tok.get_vocab_size() != base_vocab:
        fail(f"the BPE trainer produced {tok.get_vocab_size()} tokens, wanted {base_vocab}")
    for content, special in ADDED_TOKENS:
        t = AddedToken(content, special=special, normalized=False, lstrip=False, rstrip=False, single_word=False)
        (tok.add_special_tokens if special else tok.add_tokens)([t])
    for i, (content, _) in enumerate(ADDED_TOKENS):
        assert tok.token_to_id(content) == base_vocab + i, content
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    write_tokenizer_config(out_dir, base_vocab)
    return tok


def write_tokenizer_config(out_dir, base_vocab):
    added = {str(base_vocab + i): dict(content=c, lstrip=False, normalized=False, rstrip=False,
                                       single_word=False, special=s) for i, (c, s) in enumerate(ADDED_TOKENS)}
    cfg = dict(
        add_bos_token=False, add_prefix_space=False, added_tokens_decoder=added,
        additional_special_tokens=[c for c, s in ADDED_TOKENS if s and c != "<|endoftext|>"],
        bos_token=None, chat_template=CHAT_TEMPLATE, clean_up_tokenization_spaces=False,
        eos_token="<|im_end|>", errors="replace", model_max_length=262144, pad_token="<|endoftext|>",
        split_special_tokens=False, tokenizer_class="Qwen2Tokenizer", unk_token=None,
    )
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
        f.write("\n")
    with open(os.path.join(out_dir, "chat_template.jinja"), "w") as f:
        f.write(CHAT_TEMPLATE)


def write_model_config(out_dir, tok):
    """Settle the config fields transformers leaves at the 9B defaults: token ids come from this tokenizer."""
    path = os.path.join(out_dir, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    ids = {k: tok.token_to_id(v) for k, v in (
        ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>"))}
    cfg.update(ids)
    eos = tok.token_to_id("<|endoftext|>")
    cfg["eos_token_id"] = cfg["text_config"]["eos_token_id"] = eos
    cfg["dtype"] = cfg["text_config"]["dtype"] = "bfloat16"
    cfg["text_config"]["partial_rotary_factor"] = cfg["text_config"]["rope_parameters"]["partial_rotary_factor"]
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


# ----------------------------------------------------------------------------------------------------
# Model


def build_config(a, vocab_size, eos_ids):
    from transformers import Qwen3_5Config
    layer_types = [FULL if (i + 1) % a.full_attention_interval == 0 else LIN for i in range(a.layers)]
    rotary = int(a.head_dim * a.partial_rotary_factor)
    half = rotary // 2
    mrope = [half - 2 * (half // 3), half // 3, half // 3]  # sums to rotary/2, like [11, 11, 10]
    mrope = sorted(mrope, reverse=True)
    text = dict(
        vocab_size=vocab_size, hidden_size=a.hidden, intermediate_size=a.intermediate,
        num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
        head_dim=a.head_dim, linear_num_key_heads=a.linear_k_heads, linear_num_value_heads=a.linear_v_heads,
        linear_key_head_dim=a.linear_head_dim, linear_value_head_dim=a.linear_head_dim,
        linear_conv_kernel_dim=4, layer_types=layer_types, full_attention_interval=a.full_attention_interval,
        rope_parameters=dict(rope_type="default", rope_theta=10000000.0,
                             partial_rotary_factor=a.partial_rotary_factor, mrope_section=mrope,
                             mrope_interleaved=True),
        hidden_act="silu", rms_norm_eps=1e-6, max_position_embeddings=262144, attention_bias=False,
        attn_output_gate=True, tie_word_embeddings=False, mtp_num_hidden_layers=1,
        mtp_use_dedicated_embeddings=False, eos_token_id=eos_ids[1], initializer_range=0.02,
        attention_dropout=0.0,
    )
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, patch_size=4,
                  temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=16,
                  out_hidden_size=a.hidden)
    return Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=False)


def make_mtp_module(model):
    """The MTP head: pre-fc norms, fc, one full-attention Qwen3.5 decoder layer, final norm."""
    import torch
    from torch import nn
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm

    tcfg = copy.deepcopy(model.config.text_config)
    tcfg.layer_types = [FULL] * tcfg.num_hidden_layers
    h = tcfg.hidden_size

    class MTP(nn.Module):
        def __init__(self):
            super().__init__()
            self.pre_fc_norm_embedding = Qwen3_5RMSNorm(h, eps=tcfg.rms_norm_eps)
            self.pre_fc_norm_hidden = Qwen3_5RMSNorm(h, eps=tcfg.rms_norm_eps)
            self.fc = nn.Linear(2 * h, h, bias=False)
            self.layers = nn.ModuleList([Qwen3_5DecoderLayer(tcfg, 0)])
            self.norm = Qwen3_5RMSNorm(h, eps=tcfg.rms_norm_eps)

        def forward(self, next_embeds, hidden, position_embeddings, mask):
            u = self.fc(torch.cat([self.pre_fc_norm_embedding(next_embeds), self.pre_fc_norm_hidden(hidden)], -1))
            for layer in self.layers:
                u = layer(u, position_embeddings=position_embeddings, attention_mask=mask)
            return self.norm(u)

    mtp = MTP()
    assert mtp.layers[0].block_type == FULL
    for m in mtp.modules():
        model._init_weights(m)  # transformers' own init: normal(0, 0.02) linears, zero (1 + w) norms
    return mtp


def causal_mask(t, dtype):
    import torch
    m = torch.full((t, t), float("-inf"), dtype=dtype).triu(1)
    return m[None, None]


class Trainer:
    def __init__(self, model, mtp):
        self.model, self.mtp = model, mtp
        self.text = model.model.language_model

    def forward(self, ids):
        """ids [B, T]: main logits for rows 0..T-1 and MTP logits for rows 0..T-2 (predicting x_{p+2})."""
        import torch
        b, t = ids.shape
        hidden = self.text(input_ids=ids, use_cache=False).last_hidden_state  # post final norm
        logits = self.model.lm_head(hidden)
        pos = torch.arange(t - 1)[None]
        pe = self.text.rotary_emb(hidden, pos)
        mask = causal_mask(t - 1, hidden.dtype)
        next_emb = self.text.embed_tokens(ids[:, 1:])
        d = self.mtp(next_emb, hidden[:, :-1], pe, mask)
        return logits, self.model.lm_head(d)

    def losses(self, ids):
        import torch.nn.functional as F
        logits, dlogits = self.forward(ids)
        v = logits.shape[-1]
        lm = F.cross_entropy(logits[:, :-1].reshape(-1, v), ids[:, 1:].reshape(-1))
        mtp = F.cross_entropy(dlogits[:, :-1].reshape(-1, v), ids[:, 2:].reshape(-1))
        return lm, mtp


# ----------------------------------------------------------------------------------------------------
# Save / load


def mtp_state(mtp):
    import torch
    return {"mtp." + k: v.detach().to(torch.bfloat16).contiguous() for k, v in mtp.state_dict().items()}


def save_checkpoint(model, mtp, out_dir, tok, eos_ids, pad_id):
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import GenerationConfig
    saved = copy.deepcopy(model)
    for name, p in saved.named_parameters():
        p.data = p.data.to(torch.float32 if name.endswith(F32_SUFFIXES) else torch.bfloat16)
    saved.config.dtype = torch.bfloat16
    saved.config.text_config.dtype = torch.bfloat16
    saved.generation_config = GenerationConfig(
        bos_token_id=eos_ids[1], eos_token_id=list(eos_ids), pad_token_id=pad_id, do_sample=True,
        temperature=0.7, top_k=20, top_p=0.8)
    saved.save_pretrained(out_dir, safe_serialization=True)
    path = os.path.join(out_dir, "model.safetensors")
    tensors = load_file(path)
    tensors.update(mtp_state(mtp))
    save_file(dict(sorted(tensors.items())), path, metadata={"format": "pt"})
    write_model_config(out_dir, tok)
    verify_checkpoint(out_dir, mtp)


def verify_checkpoint(out_dir, mtp):
    import struct
    with open(os.path.join(out_dir, "model.safetensors"), "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    for name, info in header.items():
        want = "F32" if name.endswith(F32_SUFFIXES) else "BF16"
        assert info["dtype"] == want, f"{name}: {info['dtype']}, want {want}"
    assert "lm_head.weight" in header and "model.language_model.embed_tokens.weight" in header
    for name, t in mtp_state(mtp).items():
        assert header[name]["shape"] == list(t.shape), name
    assert sum(1 for k in header if k.startswith("mtp.")) == 15


def load_checkpoint(out_dir, dtype):
    """transformers' model (it drops mtp.*) plus the MTP head read from the same file."""
    import torch
    from safetensors.torch import load_file
    from transformers import Qwen3_5ForConditionalGeneration
    model = Qwen3_5ForConditionalGeneration.from_pretrained(out_dir, dtype=dtype, attn_implementation="eager").eval()
    mtp = make_mtp_module(model).to(dtype).eval()
    tensors = load_file(os.path.join(out_dir, "model.safetensors"))
    state = {k[4:]: v.to(dtype) for k, v in tensors.items() if k.startswith("mtp.")}
    mtp.load_state_dict(state, strict=True)
    return model, mtp


# ----------------------------------------------------------------------------------------------------
# Evaluation


def evaluate(model, mtp, eval_ids, ctx, max_windows=None):
    """Held-out loss/perplexity of the main model and the MTP head, and MTP acceptance at temperature 0.

    The token stream is cut into consecutive windows of `ctx` tokens, each run from an empty state.
    In a window, row p's draft (from h_p and E[x_{p+1}]) is accepted when its argmax equals the main
    model's argmax at row p+1, i.e. the token greedy decoding would emit after x_{p+1}.
    """
    import torch
    import torch.nn.functional as F
    tr = Trainer(model, mtp)
    n = (len(eval_ids) // ctx)
    if max_windows:
        n = min(n, max_windows)
    nll = nll_mtp = 0.0
    count = count_mtp = accepted = drafts = 0
    mtp_top1_true = main_top1_true = 0
    with torch.no_grad():
        for w in range(n):
            ids = torch.tensor(eval_ids[w * ctx:(w + 1) * ctx])[None]
            logits, dlogits = tr.forward(ids)
            logits, dlogits = logits.float()[0], dlogits.float()[0]
            nll += F.cross_entropy(logits[:-1], ids[0, 1:], reduction="sum").item()
            count += ctx - 1
            nll_mtp += F.cross_entropy(dlogits[:-1], ids[0, 2:], reduction="sum").item()
            count_mtp += ctx - 2
            main_arg = logits.argmax(-1)
            draft_arg = dlogits.argmax(-1)  # row p predicts x_{p+2}
            accepted += (draft_arg == main_arg[1:]).sum().item()
            drafts += ctx - 1
            mtp_top1_true += (draft_arg[:-1] == ids[0, 2:]).sum().item()
            main_top1_true += (main_arg[:-1] == ids[0, 1:]).sum().item()
    return dict(windows=n, ctx=ctx, tokens=count, loss=nll / count, ppl=math.exp(nll / count),
                mtp_loss=nll_mtp / count_mtp, mtp_ppl=math.exp(nll_mtp / count_mtp),
                mtp_acceptance=accepted / drafts, main_top1=main_top1_true / count,
                mtp_top1=mtp_top1_true / count_mtp)


def self_acceptance(model, mtp, eval_ids, eos_ids, n_prompts=16, prompt_len=32, n_new=96):
    """MTP acceptance at temperature 0 on the model's own greedy continuations (what greedy serving sees).

    Prompt k is the first prompt_len tokens of held-out window k. After greedy generation the whole
    sequence is re-run in one forward; the draft at row p is accepted when it equals the main model's argmax
    at row p+1 (the token greedy decoding emits), for every row p >= prompt_len - 2 (the first is the draft
    made right after prefill). `greedy_vs_forward_mismatches` counts generated tokens that differ from the
    one-forward argmax (near-ties between transformers' recurrent and chunked paths).
    """
    import torch
    from transformers import GenerationConfig
    tr = Trainer(model, mtp)
    gcfg = GenerationConfig(do_sample=False, max_new_tokens=n_new, min_new_tokens=n_new, eos_token_id=None,
                            pad_token_id=eos_ids[1])
    accepted = drafts = mismatch = 0
    stride = len(eval_ids) // n_prompts
    with torch.no_grad():
        for k in range(n_prompts):
            ids = torch.tensor(eval_ids[k * stride:k * stride + prompt_len])[None]
            seq = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gcfg)
            logits, dlogits = tr.forward(seq)
            main_arg, draft_arg = logits[0].float().argmax(-1), dlogits[0].float().argmax(-1)
            mismatch += int((main_arg[prompt_len - 1:-1] != seq[0, prompt_len:]).sum())
            rows = torch.arange(prompt_len - 2, seq.shape[1] - 2)
            accepted += int((draft_arg[rows] == main_arg[rows + 1]).sum())
            drafts += len(rows)
    return dict(prompts=n_prompts, prompt_len=prompt_len, new_tokens=n_new, drafts=drafts,
                mtp_acceptance=accepted / drafts, greedy_vs_forward_mismatches=mismatch)


def samples(model, tok, prompts, n_new, chat_ids):
    import torch
    from transformers import GenerationConfig
    out = []
    gcfg = GenerationConfig(do_sample=False, max_new_tokens=n_new, eos_token_id=list(chat_ids),
                            pad_token_id=chat_ids[1])
    for prompt in prompts:
        ids = torch.tensor([tok.encode(prompt).ids])
        with torch.no_grad():
            seq = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gcfg)
        out.append(dict(prompt=prompt, completion=tok.decode(seq[0, ids.shape[1]:].tolist(),
                                                               skip_special_tokens=False)))
    return out


# ----------------------------------------------------------------------------------------------------


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default=DEFAULT_CORPUS, help="directory of *.rst.txt files (default: %(default)s)")
    ap.add_argument("--out", default="models/qwen35-demo", help="checkpoint directory (default: %(default)s)")
    ap.add_argument("--eval-out", default="models/qwen35-demo-eval.txt", help="held-out text (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--steps", type=int, default=700)
    ap.add_argument("--stop-after", type=int, default=0,
                    help="end training after this many steps of the --steps schedule (0: run all)")
    ap.add_argument("--max-minutes", type=float, default=0,
                    help="wall-clock cap on training; stopping early is logged (0: none)")
    ap.add_argument("--batch", type=int, default=8, help="sequences per step")
    ap.add_argument("--ctx", type=int, default=256, help="training context (tokens)")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--mtp-weight", type=float, default=0.5, help="lambda in LM loss + lambda * MTP loss")
    ap.add_argument("--vocab", type=int, default=4096, help="embedding rows (padded; >= base vocab + 33)")
    ap.add_argument("--base-vocab", type=int, default=4000, help="BPE vocabulary before the added tokens")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--intermediate", type=int, default=384)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--full-attention-interval", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--partial-rotary-factor", type=float, default=0.25)
    ap.add_argument("--linear-k-heads", type=int, default=2)
    ap.add_argument("--linear-v-heads", type=int, default=4)
    ap.add_argument("--linear-head-dim", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--eval-windows", type=int, default=0, help="windows for the final evaluation (0: all)")
    ap.add_argument("--eval-only", action="store_true", help="re-measure the checkpoint in --out")
    a = ap.parse_args()

    def need(cond, msg):
        if not cond:
            ap.error(msg)
    for k in ("steps", "batch", "ctx", "hidden", "intermediate", "layers", "heads", "kv_heads", "head_dim",
              "linear_k_heads", "linear_v_heads", "linear_head_dim", "threads", "full_attention_interval"):
        need(getattr(a, k) > 0, f"--{k.replace('_', '-')} must be positive")
    need(a.lr > 0 and a.warmup >= 0 and a.weight_decay >= 0 and a.mtp_weight >= 0,
         "--lr must be positive; --warmup, --weight-decay and --mtp-weight non-negative")
    need(a.ctx >= 8, "--ctx must be at least 8")
    need(0 <= a.stop_after <= a.steps and a.max_minutes >= 0,
         "--stop-after must be in [0, --steps] and --max-minutes non-negative")
    need(a.base_vocab >= 256 + 64, "--base-vocab must be at least 320 (256 bytes plus merges)")
    need(a.vocab >= a.base_vocab + len(ADDED_TOKENS),
         f"--vocab ({a.vocab}) must hold --base-vocab ({a.base_vocab}) plus the {len(ADDED_TOKENS)} added tokens")
    need(a.heads % a.kv_heads == 0, "--heads must be a multiple of --kv-heads")
    need(a.linear_v_heads % a.linear_k_heads == 0, "--linear-v-heads must be a multiple of --linear-k-heads")
    need(a.layers % a.full_attention_interval == 0,
         "--layers must be a multiple of --full-attention-interval (the 3:1 pattern ends on a full layer)")
    need(0 < a.partial_rotary_factor <= 1, "--partial-rotary-factor must be in (0, 1]")
    rot = int(a.head_dim * a.partial_rotary_factor)
    need(rot % 2 == 0 and rot >= 6, "head_dim * partial_rotary_factor must be even and at least 6")
    return a


def main():
    a = parse_args()
    t_start = time.time()
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    import transformers
    from tokenizers import Tokenizer

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()

    train_texts, held_texts, pairs, files = load_corpus(a.corpus)
    eval_text = "\n".join(held_texts)
    chats = chat_documents(pairs)
    log = dict(corpus=a.corpus, corpus_files=len(files), held_out_files=HELD_OUT,
               train_chars=sum(map(len, train_texts)), chat_pairs=len(chats),
               eval_chars=len(eval_text), args=vars(a))
    print(f"corpus: {len(files)} files, {log['train_chars']} training chars, {len(chats)} chat pairs, "
          f"{len(eval_text)} held-out chars", flush=True)

    if a.eval_only:
        if not os.path.exists(os.path.join(a.out, "model.safetensors")):
            fail(f"--eval-only: no checkpoint in {a.out}")
        tok = Tokenizer.from_file(os.path.join(a.out, "tokenizer.json"))
        with open(os.path.join(a.out, "training_log.json")) as f:
            old_log = json.load(f)
        if "vision" not in old_log:  # a checkpoint with the tower of train_demo_vision.py keeps its configs and template
            write_tokenizer_config(a.out, tok.get_vocab_size() - len(ADDED_TOKENS))
            write_model_config(a.out, tok)
    else:
        tok = train_tokenizer(train_texts + chats, a.base_vocab, a.out)
    eos_ids = (tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>"))
    os.makedirs(os.path.dirname(os.path.abspath(a.eval_out)), exist_ok=True)
    with open(a.eval_out, "w", encoding="utf-8") as f:
        f.write(eval_text)
    eval_ids = tok.encode(eval_text).ids

    if not a.eval_only:
        docs = train_texts + chats
        order = torch.randperm(len(docs), generator=torch.Generator().manual_seed(a.seed)).tolist()
        stream = []
        for i in order:
            stream.extend(tok.encode(docs[i]).ids)
            stream.append(eos_ids[1])  # <|endoftext|> between documents
        data = torch.tensor(stream, dtype=torch.long)
        log["train_tokens"] = len(stream)
        log["chars_per_token"] = log["train_chars"] / len(stream)
        print(f"tokens: {len(stream)} train, {len(eval_ids)} held-out", flush=True)

        from transformers import Qwen3_5ForConditionalGeneration
        cfg = build_config(a, a.vocab, eos_ids)
        model = Qwen3_5ForConditionalGeneration(cfg)
        model.config._attn_implementation = "sdpa"
        mtp = make_mtp_module(model)
        model.train()
        mtp.train()
        params = [p for n, p in model.named_parameters() if not n.startswith("model.visual.")] + list(mtp.parameters())
        n_main = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("model.visual."))
        n_mtp = sum(p.numel() for p in mtp.parameters())
        log.update(params_main=n_main, params_mtp=n_mtp,
                   params_main_non_embedding=n_main - 2 * a.vocab * a.hidden)
        print(f"parameters: main {n_main}, mtp {n_mtp}", flush=True)
        decay = [p for p in params if p.dim() == 2]
        no_decay = [p for p in params if p.dim() != 2]
        opt = torch.optim.AdamW([dict(params=decay, weight_decay=a.weight_decay),
                                 dict(params=no_decay, weight_decay=0.0)], lr=a.lr, betas=(0.9, 0.95), eps=1e-8)

        def lr_at(step):
            if step < a.warmup:
                return a.lr * (step + 1) / a.warmup
            frac = (step - a.warmup) / max(1, a.steps - a.warmup)
            return a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

        gen = torch.Generator().manual_seed(a.seed + 1)
        tr = Trainer(model, mtp)
        curve = []
        t0 = time.time()
        acc_lm = acc_mtp = 0.0
        acc_n = 0
        end = a.stop_after or a.steps
        log["stopped_early"] = None
        for step in range(end):
            if a.max_minutes and time.time() - t0 > 60 * a.max_minutes:
                log["stopped_early"] = f"stopped by --max-minutes after {step} of {a.steps} steps"
                print(log["stopped_early"], flush=True)
                end = step
                break
            starts = torch.randint(0, len(data) - a.ctx - 1, (a.batch,), generator=gen)
            ids = torch.stack([data[s:s + a.ctx] for s in starts.tolist()])
            for g in opt.param_groups:
                g["lr"] = lr_at(step)
            lm, mt = tr.losses(ids)
            loss = lm + a.mtp_weight * mt
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gnorm = torch.nn.utils.clip_grad_norm_(params, 1.0).item()
            opt.step()
            acc_lm += lm.item()
            acc_mtp += mt.item()
            acc_n += 1
            last = step == end - 1
            if (step + 1) % 25 == 0 or last or step == 0:
                el = time.time() - t0
                print(f"step {step + 1}/{a.steps} lm {acc_lm / acc_n:.4f} mtp {acc_mtp / acc_n:.4f} "
                      f"gnorm {gnorm:.2f} lr {lr_at(step):.2e} {el:.0f}s "
                      f"({(step + 1) * a.batch * a.ctx / el:.0f} tok/s)", flush=True)
                entry = dict(step=step + 1, train_lm_loss=acc_lm / acc_n, train_mtp_loss=acc_mtp / acc_n,
                             elapsed_s=round(el, 1))
                if (step + 1) % a.eval_every == 0 or last:
                    model.eval()
                    mtp.eval()
                    ev = evaluate(model, mtp, eval_ids, a.ctx, max_windows=8)
                    model.train()
                    mtp.train()
                    entry.update(heldout_lm_loss=ev["loss"], heldout_mtp_loss=ev["mtp_loss"],
                                 heldout_mtp_acceptance=ev["mtp_acceptance"])
                    print(f"  held-out (8 windows): lm {ev['loss']:.4f} ppl {ev['ppl']:.2f} "
                          f"mtp {ev['mtp_loss']:.4f} acceptance {ev['mtp_acceptance']:.3f}", flush=True)
                curve.append(entry)
                acc_lm = acc_mtp = 0.0
                acc_n = 0
        log["steps_run"] = end
        log["train_seconds"] = round(time.time() - t0, 1)
        log["curve"] = curve
        save_checkpoint(model, mtp, a.out, tok, eos_ids, eos_ids[1])
        print(f"saved {a.out}", flush=True)
    else:
        old = old_log
        for k in ("train_tokens", "chars_per_token", "params_main", "params_mtp", "params_main_non_embedding",
                  "stopped_early", "steps_run", "train_seconds", "curve", "args", "vision"):
            if k in old:
                log[k] = old[k]

    # Final measurements on the saved BF16 checkpoint as transformers loads it.
    results = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        model, mtp = load_checkpoint(a.out, dtype)
        ev = evaluate(model, mtp, eval_ids, a.ctx, max_windows=a.eval_windows or None)
        results[name] = ev
        print(f"final held-out ({name} compute on the BF16 weights, {ev['windows']} windows of {a.ctx}): "
              f"loss {ev['loss']:.4f} ppl {ev['ppl']:.2f} | mtp loss {ev['mtp_loss']:.4f} | "
              f"acceptance {ev['mtp_acceptance']:.4f} | main top-1 {ev['main_top1']:.3f} "
              f"mtp top-1 {ev['mtp_top1']:.3f}", flush=True)
    log["heldout"] = results
    model, mtp = load_checkpoint(a.out, torch.float32)
    log["self_generated"] = self_acceptance(model, mtp, eval_ids, eos_ids)
    print(f"MTP acceptance on the model's own greedy text: {log['self_generated']['mtp_acceptance']:.4f} "
          f"({log['self_generated']['drafts']} drafts)", flush=True)
    log["eval_tokens"] = len(eval_ids)
    model, _ = load_checkpoint(a.out, torch.float32)
    prompts = [
        "The Python interpreter",
        "A list is",
        "To open a file,",
        "<|im_start|>user\nWhat is a dictionary?<|im_end|>\n<|im_start|>assistant\n",
    ]
    log["samples"] = samples(model, tok, prompts, 60, eos_ids)
    for s in log["samples"]:
        print(f"--- {s['prompt']!r}\n{s['completion']}", flush=True)
    log["total_seconds"] = round(time.time() - t_start, 1)
    log["versions"] = dict(torch=torch.__version__, transformers=transformers.__version__)
    with open(os.path.join(a.out, "training_log.json"), "w") as f:
        json.dump(log, f, indent=1)
        f.write("\n")
    h = hashlib.sha256(open(os.path.join(a.out, "model.safetensors"), "rb").read()).hexdigest()
    print(f"model.safetensors sha256 {h}", flush=True)


if __name__ == "__main__":
    main()
