#!/usr/bin/env python3
"""Build tiny random Qwen3.5 vision-language checkpoints and transformers' fp32 goldens for image prompts.

Usage (from the repository root, with the reference stack of scripts/requirements-reference.txt):

    python3 scripts/make_vl_models.py [--out tests/data]

Writes tests/data/models/vl-{a,b}/ and tests/data/golden-vl/. Each checkpoint is transformers' own
Qwen3_5ForConditionalGeneration (text model and vision tower, weights redrawn at random and stored in BF16;
vl-a also carries an MTP head, added to the safetensors file as make_test_models.py does), saved with a
tiny byte-level BPE tokenizer (tokenizer.json: 287 learned tokens and Qwen3.5's 33 added tokens after
them), Qwen3.5-0.8B's chat template (tests/data/chat/qwen35_chat_template.jinja) and a
preprocessor_config.json sized to the tiny tower (few patches per image). The two differ in depth, heads,
patch, merge, temporal patch and position-table size, rotary dims and mrope_section.

Per model and request (golden-vl/NAME.REQ.*): REQ.json is an OpenAI chat request (text and image_url parts,
images as paths relative to the request file); the golden renders it with the template
(add_generation_prompt), tokenizes, runs the image processor on the files (AutoImageProcessor of the
model directory, handed the paths), expands each <|image_pad|> to t*h*w/merge^2 copies, and records:
the expanded ids, image_grid_thw, the logits of every position of one forward
(Qwen3_5ForConditionalGeneration in float32, eager attention, pixel_values and mm_token_type_ids given:
get_rope_index computes the 3-axis positions) in NAME.REQ.prompt.f32 (rows x vocab, float32), and
generate(do_sample=False, max_new_tokens=GREEDY_LEN) ids. A seed is kept when every greedy step's top-1 logit
beats the runner-up by MIN_MARGIN (else the next seed is tried; the golden records the seed). Deterministic.
"""

import argparse
import importlib.util
import json
import os
import shutil
import sys

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import AutoImageProcessor, PreTrainedTokenizerFast, Qwen3_5Config, Qwen3_5ForConditionalGeneration

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_test_models as mtm  # noqa: E402  (the text weights' random draws and the MTP head)
import make_vision_goldens as mvg  # noqa: E402  (the vision tower's)

GREEDY_LEN = 12
MIN_MARGIN = 1e-3  # every greedy step's top-1 logit beats the runner-up by this much
VOCAB_LEARNED = 287  # 256 bytes + merges; Qwen3.5's 33 added tokens follow
LIN, FULL = "linear_attention", "full_attention"

MODELS = [
    dict(name="vl-a", seed=501, mtp=True, tied=True,
         text=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=4, layer_types=[LIN, FULL, LIN, FULL],
                   num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                   linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
                   rope_theta=10000.0, partial_rotary_factor=0.5, mrope_section=[2, 1, 1]),
         vision=dict(depth=2, hidden_size=16, intermediate_size=32, num_heads=2, patch_size=4,
                     temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=16),
         proc=dict(patch_size=4, temporal_patch_size=2, merge_size=2, size=dict(shortest_edge=256, longest_edge=1024))),
    dict(name="vl-b", seed=600, mtp=False, tied=False,
         text=dict(hidden_size=48, intermediate_size=96, num_hidden_layers=3, layer_types=[LIN, LIN, FULL],
                   num_attention_heads=4, num_key_value_heads=2, head_dim=12,
                   linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
                   rope_theta=1000000.0, partial_rotary_factor=1.0, mrope_section=[2, 2, 2]),
         vision=dict(depth=1, hidden_size=24, intermediate_size=40, num_heads=3, patch_size=2,
                     temporal_patch_size=1, spatial_merge_size=3, num_position_embeddings=36),
         proc=dict(patch_size=2, temporal_patch_size=1, merge_size=3, size=dict(shortest_edge=144, longest_edge=1296))),
]

REQUESTS = {
    "one": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "../images/rgb_37x53.jpg"}},
        {"type": "text", "text": "What is in this picture?"}]}],
    "two": [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": [
                {"type": "text", "text": "Compare"},
                {"type": "image_url", "image_url": {"url": "../images/exif6_40x24.jpg"}},
                {"type": "text", "text": "with"},
                {"type": "image_url", "image_url": {"url": "../images/lossy_70x50.webp"}},
                {"type": "text", "text": "please."}]}],
}

PROC_BASE = dict(do_convert_rgb=True, do_normalize=True, do_rescale=True, do_resize=True,
                 image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5], resample=3, rescale_factor=1 / 255,
                 image_processor_type="Qwen2VLImageProcessor", processor_class="Qwen3VLProcessor")


class SeedRejected(Exception):
    pass


def make_tokenizer(repo, path):
    """A byte-level BPE with the Qwen3.5 pipeline of tests/data/tokenizer/toy35 and a tiny vocabulary."""
    from tokenizers import Tokenizer, models, trainers, pre_tokenizers
    toy = Tokenizer.from_file(os.path.join(repo, "tests/data/tokenizer/toy35/tokenizer.json"))
    specials = [a["content"] for a in json.load(open(os.path.join(repo, "tests/data/tokenizer/toy35/tokenizer.json")))["added_tokens"]]
    tok = Tokenizer(models.BPE())
    tok.normalizer, tok.pre_tokenizer, tok.decoder = toy.normalizer, toy.pre_tokenizer, toy.decoder
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_LEARNED, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    corpus = ["user assistant system What is in this picture? Compare with please. Be brief.\n"] * 4 + [
        open(os.path.join(repo, "tests/data/chat/qwen35_chat_template.jinja")).read()]  # a fixed text
    tok.train_from_iterator(corpus, trainer)
    assert tok.get_vocab_size() == VOCAB_LEARNED, tok.get_vocab_size()
    tok.add_special_tokens(specials)
    tok.save(path)
    return {s: tok.token_to_id(s) for s in specials}


def build(spec, repo, out_dir, seed):
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    ids = make_tokenizer(repo, os.path.join(out_dir, "tokenizer.json"))
    vocab = VOCAB_LEARNED + len(ids)
    t = dict(spec["text"])
    rope = dict(rope_type="default", rope_theta=t.pop("rope_theta"), partial_rotary_factor=t.pop("partial_rotary_factor"),
                mrope_section=t.pop("mrope_section"), mrope_interleaved=True)
    text = dict(t, vocab_size=vocab, rope_parameters=rope, hidden_act="silu", rms_norm_eps=1e-6,
                max_position_embeddings=2048, linear_conv_kernel_dim=4, attention_bias=False,
                tie_word_embeddings=spec["tied"], mtp_num_hidden_layers=1 if spec["mtp"] else 0,
                eos_token_id=ids["<|im_end|>"], initializer_range=mtm.WEIGHT_STD)
    cfg = Qwen3_5Config(text_config=text, vision_config=dict(spec["vision"], out_hidden_size=t["hidden_size"]),
                        tie_word_embeddings=spec["tied"], image_token_id=ids["<|image_pad|>"],
                        video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
                        vision_end_token_id=ids["<|vision_end|>"])
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = Qwen3_5ForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.startswith("model.visual."):
                v = mtm.randomize_(name, p, gen)
                p.data = v.to(torch.float32 if name.endswith(mtm.F32_SUFFIXES) else torch.bfloat16)
        mvg.randomize(model.model.visual, gen)  # the draws of make_vision_goldens.py's towers
        for p in model.model.visual.parameters():
            p.data = p.data.to(torch.bfloat16)
    model.save_pretrained(out_dir, safe_serialization=True)
    if spec["mtp"]:
        path = os.path.join(out_dir, "model.safetensors")
        tensors = load_file(path)
        tensors.update(mtm.make_mtp(cfg, gen))
        save_file(tensors, path, metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json")) as f:
        c = json.load(f)
    c["dtype"] = c["text_config"]["dtype"] = "bfloat16"
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)
        f.write("\n")
    shutil.copy(os.path.join(repo, "tests/data/chat/qwen35_chat_template.jinja"),
                os.path.join(out_dir, "chat_template.jinja"))
    with open(os.path.join(out_dir, "preprocessor_config.json"), "w") as f:
        json.dump(dict(PROC_BASE, **spec["proc"]), f, indent=2, sort_keys=True)
        f.write("\n")
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(dict(tokenizer_class="PreTrainedTokenizerFast", eos_token="<|im_end|>", pad_token="<|endoftext|>",
                       model_max_length=2048), f, indent=2, sort_keys=True)
        f.write("\n")
    return ids


def hf_messages(messages, req_dir):
    """The request's messages as transformers' template reads them, and the image paths in order."""
    out, paths = [], []
    for m in messages:
        if isinstance(m["content"], str):
            out.append(m)
            continue
        parts = []
        for p in m["content"]:
            if p["type"] == "text":
                parts.append(p)
            else:
                paths.append(os.path.normpath(os.path.join(req_dir, p["image_url"]["url"])))
                parts.append({"type": "image"})
        out.append(dict(m, content=parts))
    return out, paths


def goldens(spec, model_dir, gold_dir, ids, repo, seed):
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(model_dir, "tokenizer.json"))
    template = open(os.path.join(model_dir, "chat_template.jinja")).read()
    proc = AutoImageProcessor.from_pretrained(model_dir)
    model = Qwen3_5ForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32,
                                                            attn_implementation="eager").eval()
    pad, merge = ids["<|image_pad|>"], spec["vision"]["spatial_merge_size"]
    report = {}
    for req, messages in REQUESTS.items():
        base = os.path.join(gold_dir, f"{spec['name']}.{req}")
        with open(base + ".json", "w") as f:
            json.dump({"messages": messages}, f, indent=1)
            f.write("\n")
        msgs, paths = hf_messages(messages, os.path.join(repo, "tests/data/golden-vl"))  # where the requests live
        text = tok.apply_chat_template(msgs, chat_template=template, tokenize=False, add_generation_prompt=True)
        raw = tok(text, add_special_tokens=False)["input_ids"]
        im = proc(images=paths, return_tensors="pt")
        grids = im["image_grid_thw"].tolist()
        expanded, k = [], 0
        for t in raw:
            if t == pad:
                g = grids[k]
                expanded += [pad] * (g[0] * g[1] * g[2] // merge ** 2)
                k += 1
            else:
                expanded.append(t)
        assert k == len(paths)
        input_ids = torch.tensor([expanded])
        kw = dict(pixel_values=im["pixel_values"], image_grid_thw=im["image_grid_thw"],
                  mm_token_type_ids=(input_ids == pad).int(), attention_mask=torch.ones_like(input_ids))
        with torch.no_grad():
            logits = model(input_ids=input_ids, **kw).logits[0].float()
            out = model.generate(input_ids=input_ids, **kw, do_sample=False, max_new_tokens=GREEDY_LEN,
                                 min_new_tokens=GREEDY_LEN, output_scores=True, return_dict_in_generate=True)
        greedy = out.sequences[0, len(expanded):].tolist()
        scores = torch.stack(out.scores)[:, 0].float()
        top = torch.topk(scores, 2, dim=-1).values
        margin = float((top[:, 0] - top[:, 1]).min())
        if margin < MIN_MARGIN:
            raise SeedRejected(f"{base}: greedy margin {margin:.2g}")
        assert len(greedy) == GREEDY_LEN
        logits.numpy().astype("<f4").tofile(base + ".prompt.f32")
        meta = dict(model=spec["name"], request=os.path.basename(base) + ".json", rendered=text, prompt_ids=raw,
                    expanded_ids=expanded, image_grid_thw=grids, image_files=[os.path.basename(p) for p in paths],
                    n_rows=len(expanded), vocab_size=int(logits.shape[1]), greedy_ids=greedy,
                    greedy_min_margin=margin, seed=seed, max_abs_logit=float(logits.abs().max()),
                    transformers_version=transformers.__version__, torch_version=torch.__version__)
        with open(base + ".golden.json", "w") as f:
            json.dump(meta, f, indent=1)
            f.write("\n")
        report[req] = (len(expanded), grids, margin)
    return report


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/data")
    a = ap.parse_args()
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    torch.set_num_threads(1)
    for pkg in ("fla", "causal_conv1d", "kernels"):
        assert importlib.util.find_spec(pkg) is None, f"{pkg} is installed: the goldens need the torch path"
    gold_dir = os.path.join(a.out, "golden-vl")
    os.makedirs(gold_dir, exist_ok=True)
    for spec in MODELS:
        model_dir = os.path.join(a.out, "models", spec["name"])
        for seed in range(spec["seed"], spec["seed"] + 50):  # the first seed whose goldens have clear margins
            ids = build(spec, repo, model_dir, seed)
            try:
                rep = goldens(spec, model_dir, gold_dir, ids, repo, seed)
                break
            except SeedRejected as e:
                print(f"seed {seed} rejected: {e}")
        else:
            raise SystemExit(f"{spec['name']}: no seed gave clear margins")
        size = sum(os.path.getsize(os.path.join(model_dir, f)) for f in os.listdir(model_dir))
        print(f"{spec['name']}: {size // 1024} KB; " +
              ", ".join(f"{k}: {n} rows, grids {g}, margin {m:.2g}" for k, (n, g, m) in rep.items()))


if __name__ == "__main__":
    main()
