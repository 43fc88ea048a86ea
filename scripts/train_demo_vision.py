#!/usr/bin/env python3
"""Train a small vision tower for the demo model: coloured shapes, in the chat template.

Usage (from the repository root, with the reference stack of scripts/requirements-reference.txt, from the
text-only demo that scripts/train_demo_model.py writes):

    # what models/qwen35-demo ships (models/README.md "Vision"): the text-only demo first (an hour), then
    # 15 minutes of training on 2 threads and a few of measuring
    python3 scripts/train_demo_model.py --steps 550 --stop-after 491 --out /tmp/demo-text \
        --eval-out /tmp/demo-text-eval.txt
    nice -n 5 python3 scripts/train_demo_vision.py --demo /tmp/demo-text --train-lm --distill --out /tmp/demo-vl \
        --min-exact 0.9 --pretrain-steps 4000 --batch 32 --steps 600 --text-weight 2 --held-out 100 \
        --threads 2 --upright 10 --min-pixels 3136 --engine build/qwen35
    cp /tmp/demo-vl/* models/qwen35-demo/
    python3 scripts/train_demo_vision.py --write-template tests/data/chat/demo_vision_chat_template.jinja

What it does, on a work copy of --demo:
  1. with --bound N, first measures what ANY tower could reach through the frozen model: N held-out images whose
     tower output is replaced by free vectors fitted to each image's answer (soft_prompt_bound), and whether the
     reply depends on the user's words at all (context_probe);
  2. replaces the vision stub by a fresh Qwen3.5 tower (transformers' own Qwen3_5VisionModel: TOWER below; the
     9B's structure: temporal patch 2, 2x2 spatial merge into the language model's 128 columns); with
     --pretrain-steps, trains it alone first, a linear probe naming colour and shape from its mean output token;
  3. trains on images drawn at random with PIL: one shape (circle, square, triangle, star; --upright: standing
     upright, turned by at most the given degrees) in one colour (red, green, blue, yellow, purple, orange) on a
     muted background, at a random size and place; the conversation is user: image + a question, assistant:
     "A red circle." in CHAT_TEMPLATE below, after the generation prompt with the empty think block (the
     server's enable_thinking=false; with --distill, half of them without it, as `qwen35 chat` sends); the loss
     is the answer's tokens (and <|im_end|>). The held-out measure asks with the think block.
     Without --train-lm only the tower trains (the language model, lm_head and MTP head stay byte for byte);
     with it, the language model and MTP head train too, and each step adds --text-weight times a text
     objective on --text-batch windows of --text-ctx tokens of the demo's training text (train_demo_model.py:
     the corpus without its held-out files, plus its chat conversations; models/qwen35-demo-eval.txt is never
     trained on): the demo's own (LM loss + 0.5 * MTP loss), or with --distill the KL divergence from the old
     model's main and MTP distributions, on those windows and on --chat-batch text-only chat conversations
     rendered both ways, so that the text model stays where it was and text questions keep text replies;
  4. writes the tower into model.safetensors as the 9B stores it (BF16, model.visual.*), config.json's
     vision_config, preprocessor_config.json (min/max pixels) and the chat template that renders image parts;
  5. measures greedy answers on held-out images (another seed; none equals a training image) with transformers
     (fp32 on the saved BF16 weights) and, with --engine, with `qwen35 run --image`; with --train-lm also the
     perplexity, MTP acceptance and KL divergence from --demo on the held-out text (transformers, and `qwen35
     eval` with --engine) and the `qwen35 chat` replies of both to a few text messages; writes the measures to
     --report and, only when the exact-answer accuracy reaches --min-exact, installs the checkpoint in --out
     with training_log.json's "vision" entry, and the first held-out images as test data (--test-images, with
     answers.json: each image's answer and transformers' reply).
--train-lm needs --out other than --demo (it changes the text model).
Deterministic for a given seed and --threads (with --max-minutes: for the step it stopped at, --stop-after).
"""

import argparse
import hashlib
import io
import json
import math
import os
import random
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_demo_model as tdm  # noqa: E402  (the chat template)

TOWER = dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=2, patch_size=8, temporal_patch_size=2,
             spatial_merge_size=2, num_position_embeddings=64, hidden_act="gelu_pytorch_tanh", in_channels=3,
             out_hidden_size=128, initializer_range=0.02)
PIXELS = dict(shortest_edge=1024, longest_edge=4096)  # min/max pixels (--min-pixels): 4 to about 20 merged tokens
PROC = dict(do_convert_rgb=True, do_normalize=True, do_rescale=True, do_resize=True,
            image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5], resample=3, rescale_factor=1 / 255,
            patch_size=TOWER["patch_size"], temporal_patch_size=TOWER["temporal_patch_size"],
            merge_size=TOWER["spatial_merge_size"], size=PIXELS,
            image_processor_type="Qwen2VLImageProcessor", processor_class="Qwen3VLProcessor")

COLOURS = {"red": (220, 30, 30), "green": (30, 170, 40), "blue": (30, 60, 220), "yellow": (240, 220, 30),
           "purple": (140, 40, 180), "orange": (250, 140, 20)}
SHAPES = ["circle", "square", "triangle", "star"]
SHAPE_RADIUS = (0.2, 0.4)  # of the canvas' shorter side
ROTATION = math.pi  # each shape turned by up to this much either way (pi: any angle)
UPRIGHT = False  # with a small ROTATION: triangles and stars point up, squares stand on a side
QUESTIONS = ["What is in the image?", "What do you see?", "Describe the image.", "What is this?"]
QUESTION = QUESTIONS[0]  # the one the held-out measure and the tests ask
FROZEN = ("model.language_model.", "lm_head.", "mtp.")

# The demo's chat template (train_demo_model.CHAT_TEMPLATE) with image parts: a content part of type 'image' or
# 'image_url' renders as Qwen3.5's <|vision_start|><|image_pad|><|vision_end|> in place (after "Picture N: " when
# add_vision_id is set, N counting the conversation's images); other non-text parts render nothing, as before.
# Every conversation without image parts renders exactly as with the text template.
CHAT_TEMPLATE = tdm.CHAT_TEMPLATE.replace(
    "{%- for message in messages %}",
    "{%- set image_count = namespace(value=0) %}{%- for message in messages %}", 1).replace(
    "{%- set ns.text = ns.text ~ part.text %}{%- endif %}",
    "{%- set ns.text = ns.text ~ part.text %}"
    "{%- elif part.type == 'image' or part.type == 'image_url' %}"
    "{%- set image_count.value = image_count.value + 1 %}"
    "{%- if add_vision_id %}{%- set ns.text = ns.text ~ 'Picture ' ~ image_count.value ~ ': ' %}{%- endif %}"
    "{%- set ns.text = ns.text ~ '<|vision_start|><|image_pad|><|vision_end|>' %}"
    "{%- endif %}", 1)
assert CHAT_TEMPLATE.count("image_pad") == 1 and CHAT_TEMPLATE.count("image_count = namespace") == 1


def answer(colour, shape):
    return f"A {colour} {shape}."


# ----------------------------------------------------------------------------------------------------
# Images


def set_drawing(upright, rotation_degrees, radius):
    """How draw() places shapes: the globals below (--upright sets them; --eval-only takes the log's)."""
    global ROTATION, UPRIGHT, SHAPE_RADIUS
    ROTATION, UPRIGHT, SHAPE_RADIUS = math.radians(rotation_degrees), upright, tuple(radius)


def canvas(rng):
    """A random canvas size: any 40-128 x 40-128 (upright mode: 48-128 wide, at most 4:3 either way)."""
    if UPRIGHT:
        w = rng.randint(48, 128)
        return w, max(40, min(128, round(w * rng.uniform(0.75, 1.33))))
    return rng.randint(40, 128), rng.randint(40, 128)


def draw(rng, size=None):
    """One random image (PIL RGB) and its (colour, shape)."""
    from PIL import Image, ImageDraw
    w, h = size or canvas(rng)
    colour, shape = rng.choice(sorted(COLOURS)), rng.choice(SHAPES)
    g = rng.randint(60, 200)
    bg = tuple(max(0, min(255, g + rng.randint(-20, 20))) for _ in range(3))
    fg = tuple(max(0, min(255, c + rng.randint(-25, 25))) for c in COLOURS[colour])
    img = Image.new("RGB", (w, h), bg)
    d = ImageDraw.Draw(img)
    m = min(w, h)
    r = rng.uniform(*SHAPE_RADIUS) * m
    cx, cy = rng.uniform(r, w - r), rng.uniform(r, h - r)
    rot = rng.uniform(-ROTATION, ROTATION) + (-math.pi / 2 if UPRIGHT else 0)
    if shape == "circle":
        d.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fg)
    else:
        if shape == "square":
            rot += math.pi / 4 if UPRIGHT else 0
            pts = [(r * math.cos(rot + k * math.pi / 2), r * math.sin(rot + k * math.pi / 2)) for k in range(4)]
        elif shape == "triangle":
            pts = [(r * math.cos(rot + k * 2 * math.pi / 3), r * math.sin(rot + k * 2 * math.pi / 3)) for k in range(3)]
        else:
            pts = [((r if k % 2 == 0 else 0.45 * r) * math.cos(rot + k * math.pi / 5),
                    (r if k % 2 == 0 else 0.45 * r) * math.sin(rot + k * math.pi / 5)) for k in range(10)]
        d.polygon([(cx + x, cy + y) for x, y in pts], fill=fg)
    return img, colour, shape


def image_key(img):
    return hashlib.sha256(img.tobytes() + repr(img.size).encode()).hexdigest()


# ----------------------------------------------------------------------------------------------------
# Checkpoint


def read_raw(path):
    """safetensors header and the raw bytes of every tensor."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    meta = header.pop("__metadata__", None)
    base = 8 + n
    raw = {k: blob[base + v["data_offsets"][0]:base + v["data_offsets"][1]] for k, v in header.items()}
    return header, raw, meta


def check_frozen(before, path):
    """Every language-model, lm_head and MTP tensor of `before` is in `path` with the same dtype, shape, bytes."""
    header, raw, _ = read_raw(path)
    want = {k for k in before[0] if k.startswith(FROZEN)}
    assert want == {k for k in header if k.startswith(FROZEN)}, "the frozen tensors' names changed"
    assert all(k.startswith(FROZEN + ("model.visual.",)) for k in header), "an unexpected tensor"
    for k in want:
        assert header[k]["dtype"] == before[0][k]["dtype"] and header[k]["shape"] == before[0][k]["shape"], k
        assert raw[k] == before[1][k], f"{k}: bytes changed"
    return len(want)


def build_model(demo, cfg_dict, seed):
    """transformers' model with the demo's text weights (fp32) and a fresh tower drawn from `seed`."""
    import torch
    from safetensors.torch import load_file
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration
    cfg = Qwen3_5Config(**{k: v for k, v in cfg_dict.items() if k not in ("architectures", "transformers_version")})
    torch.manual_seed(seed)
    model = Qwen3_5ForConditionalGeneration(cfg).float()
    tensors = load_file(os.path.join(demo, "model.safetensors"))
    state = {k: v.float() for k, v in tensors.items() if not k.startswith(("mtp.", "model.visual."))}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected, unexpected
    assert all(k.startswith("model.visual.") for k in missing), [k for k in missing if not k.startswith("model.visual.")]
    return model


def save_tower(model, demo, before):
    import torch
    from safetensors.torch import save_file
    from safetensors import safe_open
    path = os.path.join(demo, "model.safetensors")
    tensors = {}
    with safe_open(path, "pt") as f:
        for k in f.keys():
            if k.startswith(FROZEN):
                tensors[k] = f.get_tensor(k)
    for k, v in model.model.visual.state_dict().items():
        tensors["model.visual." + k] = v.detach().to(torch.bfloat16).contiguous()
    save_file(dict(sorted(tensors.items())), path, metadata=before[2])
    return check_frozen(before, path)


def write_files(demo, cfg_dict):
    with open(os.path.join(demo, "config.json"), "w") as f:
        json.dump(cfg_dict, f, indent=2, sort_keys=True)
        f.write("\n")
    with open(os.path.join(demo, "preprocessor_config.json"), "w") as f:
        json.dump(PROC, f, indent=2, sort_keys=True)
        f.write("\n")
    with open(os.path.join(demo, "chat_template.jinja"), "w") as f:
        f.write(CHAT_TEMPLATE)
    path = os.path.join(demo, "tokenizer_config.json")
    with open(path) as f:
        tc = json.load(f)
    tc["chat_template"] = CHAT_TEMPLATE
    with open(path, "w") as f:
        json.dump(tc, f, indent=2, ensure_ascii=False)
        f.write("\n")


# ----------------------------------------------------------------------------------------------------
# Data


class Prompts:
    def __init__(self, demo):
        from transformers import AutoImageProcessor, PreTrainedTokenizerFast
        self.tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(demo, "tokenizer.json"))
        self.proc = AutoImageProcessor.from_pretrained(demo)
        self.pad = self.tok.convert_tokens_to_ids("<|image_pad|>")
        self.end = self.tok.convert_tokens_to_ids("<|im_end|>")

    def render(self, question, think_block=True):
        """The prompt of one image and a question; think_block: with enable_thinking=False (an empty think block
        after the generation prompt, as the server's requests that say so get), else with it unset (`qwen35 chat`)."""
        msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
        kw = dict(enable_thinking=False) if think_block else {}
        return self.tok.apply_chat_template(msgs, chat_template=CHAT_TEMPLATE, tokenize=False,
                                            add_generation_prompt=True, **kw)

    def ids(self, text, grid):
        merge = TOWER["spatial_merge_size"]
        out = []
        for t in self.tok(text, add_special_tokens=False)["input_ids"]:
            out += [t] * (grid[0] * grid[1] * grid[2] // merge ** 2) if t == self.pad else [t]
        return out

    def batch(self, images, questions, answers, think_blocks=None):
        """input ids (right-padded), labels, pixel values and grids for one batch."""
        import torch
        im = self.proc(images=images, return_tensors="pt")
        grids = im["image_grid_thw"].tolist()
        seqs, labels = [], []
        for i, (q, a, g) in enumerate(zip(questions, answers, grids)):
            p = self.ids(self.render(q, think_blocks[i] if think_blocks else True), g)
            ans = self.tok(a, add_special_tokens=False)["input_ids"] + [self.end] if a is not None else []
            seqs.append(p + ans)
            labels.append([-100] * len(p) + ans)
        n = max(map(len, seqs))
        ids = torch.tensor([s + [self.end] * (n - len(s)) for s in seqs])
        lab = torch.tensor([s + [-100] * (n - len(s)) for s in labels])
        return ids, lab, im["pixel_values"], im["image_grid_thw"]


def forward(model, pr, ids, pixels, grids):
    return model(input_ids=ids, pixel_values=pixels, image_grid_thw=grids, mm_token_type_ids=(ids == pr.pad).int(),
                 attention_mask=None).logits


# ----------------------------------------------------------------------------------------------------
# Evaluation


def held_out(seed, n, train_keys):
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        img, c, s = draw(rng)
        if image_key(img) not in train_keys:
            out.append((img, c, s))
    return out


def score(said, colour, shape):
    s = said.strip()
    return dict(exact=s == answer(colour, shape), colour=f" {colour} " in f" {s.rstrip('.')} ",
                shape=s.rstrip(".").endswith(f" {shape}"))


def summary(results):
    n = len(results)
    return {k: round(sum(r[k] for r in results) / n, 4) for k in ("exact", "colour", "shape")} | {"n": n}


def eval_hf(demo, pr, items, max_new=16):
    import torch
    from transformers import Qwen3_5ForConditionalGeneration
    model = Qwen3_5ForConditionalGeneration.from_pretrained(demo, dtype=torch.float32,
                                                            attn_implementation="eager").eval()
    text = pr.render(QUESTION)
    out = []
    for img, c, s in items:
        im = pr.proc(images=[img], return_tensors="pt")
        ids = torch.tensor([pr.ids(text, im["image_grid_thw"][0].tolist())])
        if c:  # greedy says the answer when every answer position's argmax is the answer's next token
            want = pr.tok(answer(c, s), add_special_tokens=False)["input_ids"] + [pr.end]
            full = torch.cat([ids, torch.tensor([want[:-1]])], 1)
            with torch.no_grad():
                top = forward(model, pr, full, im["pixel_values"], im["image_grid_thw"])[0, ids.shape[1] - 1:].argmax(-1)
            if top.tolist() == want:
                out.append(dict(said=answer(c, s), **score(answer(c, s), c, s)))
                continue
        with torch.no_grad():
            g = model.generate(input_ids=ids, pixel_values=im["pixel_values"], image_grid_thw=im["image_grid_thw"],
                               mm_token_type_ids=(ids == pr.pad).int(), attention_mask=torch.ones_like(ids),
                               do_sample=False, max_new_tokens=max_new, eos_token_id=[pr.end])
        new = [t for t in g[0, ids.shape[1]:].tolist() if t != pr.end]
        said = pr.tok.decode(new)
        out.append(dict(said=said, **score(said, c, s)))
    return out


def soft_prompt_bound(model, pr, items, steps, lr):
    """What any tower could reach: each image's tower output replaced by free vectors, fitted by Adam to that
    image's answer through the frozen model; the share of answers greedy would then say, and the loss."""
    import torch
    ids, lab, pixels, grids = pr.batch([i for i, _, _ in items], [QUESTION] * len(items),
                                       [answer(c, s) for _, c, s in items])
    n = [int(g[0] * g[1] * g[2]) // TOWER["spatial_merge_size"] ** 2 for g in grids.tolist()]
    free = torch.nn.Parameter(torch.randn(sum(n), TOWER["out_hidden_size"], generator=torch.Generator().manual_seed(0)))
    real = model.model.get_image_features

    def features(*args, **kw):
        out = real(*args, **kw)
        out.pooler_output = list(free.split(n))
        return out
    model.model.get_image_features = features
    for p in model.parameters():
        p.requires_grad_(False)
    opt = torch.optim.Adam([free], lr=lr)
    try:
        for _ in range(steps):
            logits = forward(model, pr, ids, pixels, grids)
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), lab[:, 1:].flatten(), ignore_index=-100)
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            logits = forward(model, pr, ids, pixels, grids)[:, :-1]
    finally:
        model.model.get_image_features = real
    tgt = lab[:, 1:]
    hit = ((logits.argmax(-1) == tgt) | (tgt == -100)).all(1)
    first = [int(logits[b, (tgt[b] != -100).nonzero()[0, 0]].argmax()) for b in range(len(items))]
    return dict(images=len(items), steps=steps, lr=lr, loss_per_token=round(float(loss), 3),
                greedy_says_the_answer=int(hit.sum()), first_tokens=sorted({pr.tok.decode([t]) for t in first}))


def context_probe(model, pr):
    """Whether the language model's reply reads the user's words at all: the answer's per-token loss after the
    chat prompt when the user's message is the question, the answer itself, or the answer and the question."""
    import torch
    out = {}
    want = pr.tok(answer("red", "circle"), add_special_tokens=False)["input_ids"] + [pr.end]
    for text in (QUESTION, answer("red", "circle"), answer("red", "circle") + " " + QUESTION):
        msgs = [{"role": "user", "content": text}]
        p = pr.tok(pr.tok.apply_chat_template(msgs, chat_template=CHAT_TEMPLATE, tokenize=False, add_generation_prompt=True,
                                              enable_thinking=False), add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            lp = torch.log_softmax(model(input_ids=torch.tensor([p + want[:-1]])).logits[0, len(p) - 1:], -1)
        out[text] = round(float(-lp[torch.arange(len(want)), torch.tensor(want)].mean()), 3)
    return out


def eval_engine(engine, demo, pr, items, tmp):
    os.makedirs(tmp, exist_ok=True)
    text = pr.render(QUESTION)
    out = []
    for i, (img, c, s) in enumerate(items):
        path = os.path.join(tmp, f"{i}.png")
        img.save(path)
        r = subprocess.run([engine, "run", "-m", demo, "--image", path, "--prompt", text, "-n", "16", "-t", "1"],
                           capture_output=True, text=True, check=True)
        out.append(dict(said=r.stdout, **score(r.stdout, c, s)))
    return out


def jpeg(img, quality=85):
    """img as a JPEG file of that quality: its bytes (what write_test_images stores) and the image they decode to
    (what is measured)."""
    from PIL import Image
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=quality)
    return buf.getvalue(), Image.open(io.BytesIO(buf.getvalue())).convert("RGB")


def photo_like(seed):
    """An ordinary photo-like picture no training image resembles: a sky gradient, a green hill, a sun."""
    from PIL import Image, ImageDraw, ImageFilter
    rng = random.Random(seed)
    w, h = 320, 240
    img = Image.new("RGB", (w, h))
    px = img.load()
    for y in range(h):
        for x in range(w):
            t = y / h
            px[x, y] = (int(90 + 100 * t + rng.randint(-6, 6)), int(150 + 70 * t + rng.randint(-6, 6)),
                        int(235 - 30 * t + rng.randint(-6, 6)))
    d = ImageDraw.Draw(img)
    d.ellipse([-80, 150, 420, 420], fill=(70, 140, 60))
    d.rectangle([200, 120, 260, 175], fill=(150, 90, 60))
    d.polygon([(195, 122), (230, 95), (265, 122)], fill=(120, 40, 40))
    d.ellipse([40, 30, 80, 70], fill=(250, 240, 200))
    return img.filter(ImageFilter.GaussianBlur(1.2))


# ----------------------------------------------------------------------------------------------------


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--demo", default="models/qwen35-demo", help="the demo checkpoint read")
    ap.add_argument("--out", help="where the checkpoint with the tower goes (default: --demo), only when its held-out "
                    "exact-answer accuracy reaches --min-exact")
    ap.add_argument("--min-exact", type=float, default=0.9)
    ap.add_argument("--report", default="/tmp/demo-vision-report.json", help="the measures, written either way")
    ap.add_argument("--bound", type=int, default=0, metavar="N",
                    help="first measure what any tower could reach on N held-out images (soft_prompt_bound) and "
                         "whether the reply reads the user's words (context_probe)")
    ap.add_argument("--bound-only", action="store_true", help="measure --bound, write --report, train nothing")
    ap.add_argument("--bound-steps", type=int, default=150)
    ap.add_argument("--bound-lr", type=float, default=0.3)
    ap.add_argument("--seed", type=int, default=2024)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--held-out", type=int, default=300, help="held-out images for the accuracy")
    ap.add_argument("--engine", help="qwen35 binary: also measure the C engine (qwen35 run --image)")
    ap.add_argument("--test-images", default="tests/data/images/demo-vision",
                    help="where the first held-out images go as PNGs, with answers.json ('' skips)")
    ap.add_argument("--n-test-images", type=int, default=6)
    ap.add_argument("--eval-only", action="store_true", help="re-measure the saved tower")
    ap.add_argument("--write-template", metavar="PATH", help="only write CHAT_TEMPLATE to PATH")
    ap.add_argument("--train-lm", action="store_true", help="train the language model and MTP head too, on the "
                    "image task mixed with the demo's text objective (needs --out other than --demo)")
    ap.add_argument("--lm-lr", type=float, default=5e-4, help="peak learning rate of the language model and MTP head")
    ap.add_argument("--text-weight", type=float, default=1.0)
    ap.add_argument("--text-batch", type=int, default=4)
    ap.add_argument("--text-ctx", type=int, default=128)
    ap.add_argument("--corpus", default=tdm.DEFAULT_CORPUS)
    ap.add_argument("--eval-text", default="models/qwen35-demo-eval.txt", help="held-out text for the text measures")
    ap.add_argument("--distill", action="store_true", help="with --train-lm: the text objective is the KL divergence "
                    "from the old model (its main and MTP distributions) instead of cross-entropy on the text, so "
                    "the text model stays where it was; adds --chat-batch text-only chat conversations per step")
    ap.add_argument("--chat-batch", type=int, default=4, help="with --distill: text-only chat conversations per step")
    ap.add_argument("--pretrain-steps", type=int, default=0, help="first train the tower alone for this many steps "
                    "with a linear probe (colour and shape from its mean output), so that it resolves shapes before "
                    "the language model sees it")
    ap.add_argument("--pretrain-lr", type=float, default=2e-3)
    ap.add_argument("--tower-depth", type=int, default=TOWER["depth"])
    ap.add_argument("--tower-hidden", type=int, default=TOWER["hidden_size"], help="the tower's width (its MLP: 2x)")
    ap.add_argument("--upright", type=float, metavar="DEG", help="draw the shapes upright, turned by at most DEG "
                    "degrees (default: any angle), with radii 0.3-0.45 of the shorter side (default 0.2-0.4)")
    ap.add_argument("--heads", type=int, default=TOWER["num_heads"], help="the tower's attention heads")
    ap.add_argument("--patch", type=int, default=TOWER["patch_size"], help="the tower's patch size")
    ap.add_argument("--min-pixels", type=int, default=PIXELS["shortest_edge"],
                    help="the processor's min_pixels (max_pixels stays %d)" % PIXELS["longest_edge"])
    ap.add_argument("--max-minutes", type=float, default=0, help="stop training after this many minutes")
    ap.add_argument("--stop-after", type=int, default=0, help="stop training after this step (schedule kept)")
    a = ap.parse_args()
    if a.distill and not a.train_lm:
        ap.error("--distill is a text objective of --train-lm")
    if a.distill and a.chat_batch < 1:
        ap.error("--chat-batch must be positive")
    if a.bound_only and not a.bound:
        ap.error("--bound-only needs --bound N")
    if not 0 < a.min_pixels <= PIXELS["longest_edge"]:
        ap.error("--min-pixels must be in 1..%d" % PIXELS["longest_edge"])
    if a.heads < 1 or a.tower_hidden % a.heads or a.tower_depth < 1 or a.patch < 1:
        ap.error("--tower-hidden must be a multiple of --heads; --tower-depth, --heads and --patch positive")
    if a.upright is not None and not 0 <= a.upright <= 180:
        ap.error("--upright takes 0 to 180 degrees")
    if a.train_lm and (not a.out or os.path.realpath(a.out) == os.path.realpath(a.demo)):
        ap.error("--train-lm changes the text model: --out must name a directory other than --demo")
    if a.steps < 1 or a.batch < 1 or a.threads < 1 or a.held_out < 1 or a.lr <= 0:
        ap.error("--steps, --batch, --threads and --held-out must be positive, --lr too")
    TOWER.update(depth=a.tower_depth, hidden_size=a.tower_hidden, intermediate_size=2 * a.tower_hidden,
                 patch_size=a.patch, num_heads=a.heads)
    PROC["patch_size"] = a.patch
    if a.upright is not None:
        set_drawing(True, a.upright, (0.3, 0.45))
    PIXELS["shortest_edge"] = a.min_pixels
    return a


def text_stream(demo, corpus, seed):
    """The demo's training text as train_demo_model.py builds it (the corpus without its held-out files, plus its
    chat conversations), tokenized with the demo's tokenizer in a seeded document order, <|endoftext|> between."""
    import torch
    from tokenizers import Tokenizer
    train_texts, _, pairs, _ = tdm.load_corpus(corpus)
    tok = Tokenizer.from_file(os.path.join(demo, "tokenizer.json"))
    docs = train_texts + tdm.chat_documents(pairs)
    eot = tok.token_to_id("<|endoftext|>")
    stream = []
    for i in torch.randperm(len(docs), generator=torch.Generator().manual_seed(seed)).tolist():
        stream += tok.encode(docs[i]).ids + [eot]
    return torch.tensor(stream, dtype=torch.long)


def load_mtp(model, demo):
    """train_demo_model's MTP head (fp32) with the weights of demo's checkpoint."""
    from safetensors.torch import load_file
    mtp = tdm.make_mtp_module(model)
    tensors = load_file(os.path.join(demo, "model.safetensors"))
    mtp.load_state_dict({k[4:]: v.float() for k, v in tensors.items() if k.startswith("mtp.")}, strict=True)
    return mtp


def lr_scale(step, warmup, steps):
    """The learning rate's share of its peak at `step`: linear warm-up, then cosine down to 10% at `steps`."""
    return min(1.0, step / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps)))


def pretrain_tower(a, model, pr, log, keys):
    """The tower alone, with a linear probe on its mean output token that names the colour and the shape (cross-
    entropy on both): a tower that already tells the shapes apart before the language model reads it. The probe
    is thrown away; images are drawn from their own seed, sizes vary within a batch."""
    import torch
    visual = model.model.visual
    probe = torch.nn.Linear(TOWER["out_hidden_size"], len(COLOURS) + len(SHAPES))
    params = list(visual.parameters()) + list(probe.parameters())
    opt = torch.optim.AdamW(params, lr=a.pretrain_lr, betas=(0.9, 0.95), weight_decay=0.01)
    rng = random.Random(a.seed + 5)
    colours = sorted(COLOURS)
    curve, run, hits, t0 = [], [], [], time.time()
    for step in range(1, a.pretrain_steps + 1):
        scale = lr_scale(step, a.warmup, a.pretrain_steps)
        for g in opt.param_groups:
            g["lr"] = a.pretrain_lr * scale
        items = [draw(rng) for _ in range(a.batch)]
        keys.update(image_key(i) for i, _, _ in items)
        im = pr.proc(images=[i for i, _, _ in items], return_tensors="pt")
        feats = model.model.get_image_features(im["pixel_values"], im["image_grid_thw"]).pooler_output
        out = probe(torch.stack([f.mean(0) for f in feats]))
        col = torch.tensor([colours.index(c) for _, c, _ in items])
        shp = torch.tensor([SHAPES.index(s) for _, _, s in items])
        loss = (torch.nn.functional.cross_entropy(out[:, :len(colours)], col)
                + torch.nn.functional.cross_entropy(out[:, len(colours):], shp))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        run.append(loss.item())
        hits.append(float((out[:, len(colours):].argmax(-1) == shp).float().mean()))
        if step % 25 == 0 or step == 1:
            e = dict(step=step, minutes=round((time.time() - t0) / 60, 2), loss=round(sum(run) / len(run), 4),
                     shape_acc=round(sum(hits) / len(hits), 3))
            curve.append(e)
            print(f"pretrain {e}", flush=True)
            run, hits = [], []
    log.update(pretrain=dict(steps=a.pretrain_steps, lr=a.pretrain_lr, seconds=round(time.time() - t0, 1),
                             curve=curve))


def kl_rows(teacher_logits, student_logits):
    """Mean over rows of KL(teacher || student) of the softmax distributions."""
    import torch.nn.functional as F
    v = teacher_logits.shape[-1]
    t = F.log_softmax(teacher_logits.reshape(-1, v).float(), -1)
    s = F.log_softmax(student_logits.reshape(-1, v).float(), -1)
    return (t.exp() * (t - s)).sum(-1).mean()


def chat_stream(pr, corpus, seed):
    """The demo's text-only chat conversations (train_demo_model.chat_documents: the training files' headings as
    questions), token ids each, in a seeded order."""
    import torch
    _, _, pairs, _ = tdm.load_corpus(corpus)
    out = []
    for i in torch.randperm(len(pairs), generator=torch.Generator().manual_seed(seed + 6)).tolist():
        heading, reply = pairs[i]
        msgs = [{"role": "user", "content": tdm.CHAT_PROMPTS[i % len(tdm.CHAT_PROMPTS)].format(heading)}]
        kw = dict(enable_thinking=False) if i % 2 else {}  # both prompts the engine sends (see Prompts.render)
        text = pr.tok.apply_chat_template(msgs, chat_template=CHAT_TEMPLATE, tokenize=False, add_generation_prompt=True,
                                          **kw) + reply + "<|im_end|>\n"
        out.append(pr.tok(text, add_special_tokens=False)["input_ids"][:192])
    return out


def train(a, demo, cfg_dict, pr, log):
    import copy
    import torch
    model = build_model(demo, cfg_dict, a.seed)
    mtp = None
    keys = set()  # every training image, kept out of the held-out set
    if a.pretrain_steps:
        model.train()
        pretrain_tower(a, model, pr, log, keys)
    for name, p in model.named_parameters():
        p.requires_grad_(a.train_lm or name.startswith("model.visual."))
    groups = [dict(params=[p for n, p in model.named_parameters() if n.startswith("model.visual.")], peak=a.lr)]
    log["tower_params"] = sum(p.numel() for p in groups[0]["params"])
    if a.train_lm:
        mtp = load_mtp(model, demo)
        mtp.train()
        text = tdm.Trainer(model, mtp)
        data = text_stream(demo, a.corpus, a.seed)
        tgen = torch.Generator().manual_seed(a.seed + 4)
        if a.distill:  # the old text model, frozen: what the text objective keeps the new one close to
            teacher = tdm.Trainer(copy.deepcopy(model).eval(), copy.deepcopy(mtp).eval())
            for p in list(teacher.model.parameters()) + list(teacher.mtp.parameters()):
                p.requires_grad_(False)
            chats, chat_at = chat_stream(pr, a.corpus, a.seed), 0
            log.update(distill=True, chat_batch=a.chat_batch, chat_conversations=len(chats))
        groups.append(dict(params=[p for n, p in model.named_parameters() if not n.startswith("model.visual.")]
                           + list(mtp.parameters()), peak=a.lm_lr))
        log.update(train_lm=True, lm_lr=a.lm_lr, text_weight=a.text_weight, text_batch=a.text_batch,
                   text_ctx=a.text_ctx, text_stream_tokens=len(data))
    params = [p for g in groups for p in g["params"]]
    opt = torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, 0.95), weight_decay=0.01)
    rng = random.Random(a.seed)
    curve, t0, run, run_text = [], time.time(), [], []
    model.train()
    end = a.stop_after or a.steps
    for step in range(1, end + 1):
        if a.max_minutes and time.time() - t0 > 60 * a.max_minutes:
            log["stopped_early"] = f"--max-minutes stopped training after {step - 1} of {a.steps} steps"
            print(log["stopped_early"], flush=True)
            break
        scale = lr_scale(step, a.warmup, a.steps)
        for g in opt.param_groups:
            g["lr"] = g["peak"] * scale
        size = canvas(rng)  # one canvas per step: prompts of one length
        items = [draw(rng, size) for _ in range(a.batch)]
        keys.update(image_key(i) for i, _, _ in items)
        qs = [rng.choice(QUESTIONS) for _ in items]
        thinks = [rng.random() < 0.5 for _ in items] if a.distill else None
        ids, lab, pixels, grids = pr.batch([i for i, _, _ in items], qs, [answer(c, s) for _, c, s in items], thinks)
        logits = forward(model, pr, ids, pixels, grids)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), lab[:, 1:].flatten(), ignore_index=-100)
        run.append(loss.item())
        if a.train_lm:
            starts = torch.randint(0, len(data) - a.text_ctx - 1, (a.text_batch,), generator=tgen).tolist()
            ids_t = torch.stack([data[s:s + a.text_ctx] for s in starts])
            if a.distill:
                with torch.no_grad():
                    tl, td = teacher.forward(ids_t)
                sl, sd = text.forward(ids_t)
                lm, mt = kl_rows(tl, sl), kl_rows(td[:, :-1], sd[:, :-1])
                batch_c = [chats[(chat_at + i) % len(chats)] for i in range(a.chat_batch)]
                chat_at += a.chat_batch
                n = max(map(len, batch_c))
                ids_c = torch.tensor([c + [pr.end] * (n - len(c)) for c in batch_c])
                keep = torch.tensor([[i < len(c) for i in range(n)] for c in batch_c])
                with torch.no_grad():
                    tl, td = teacher.forward(ids_c)
                sl, sd = text.forward(ids_c)
                lm = lm + kl_rows(tl[keep], sl[keep])
                mt = mt + kl_rows(td[keep[:, 1:]], sd[keep[:, 1:]])
            else:
                lm, mt = text.losses(ids_t)
            run_text.append((lm.item(), mt.item()))
            loss = loss + a.text_weight * (lm + 0.5 * mt)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 10 == 0 or step == 1:
            e = dict(step=step, minutes=round((time.time() - t0) / 60, 2), loss=round(sum(run) / len(run), 4))
            if run_text:
                e.update(text_lm=round(sum(x for x, _ in run_text) / len(run_text), 4),
                         text_mtp=round(sum(y for _, y in run_text) / len(run_text), 4))
            curve.append(e)
            print(f"step {step} {e} lr {scale:.3f} x peak", flush=True)
            run, run_text = [], []
    log.update(train_seconds=round(time.time() - t0, 1), train_images=len(keys), curve=curve)
    return model, mtp, keys


def save_all(model, mtp, demo, before):
    """Every tensor of the checkpoint from the trained model (in its stored dtype), the tower as save_tower
    writes it; the names, shapes and dtypes of the text tensors checked against `before`. Returns how many of
    them changed."""
    import torch
    from safetensors.torch import save_file
    path = os.path.join(demo, "model.safetensors")
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("model.visual.")}
    state.update({"mtp." + k: v for k, v in mtp.state_dict().items()})
    dtypes = dict(BF16=torch.bfloat16, F32=torch.float32)
    text_keys = {k for k in before[0] if k.startswith(FROZEN)}
    assert text_keys == set(state), sorted(text_keys ^ set(state))
    tensors = {k: state[k].detach().to(dtypes[before[0][k]["dtype"]]).contiguous() for k in text_keys}
    for k, v in model.model.visual.state_dict().items():
        tensors["model.visual." + k] = v.detach().to(torch.bfloat16).contiguous()
    save_file(dict(sorted(tensors.items())), path, metadata=before[2])
    header, raw, _ = read_raw(path)
    for k in text_keys:
        assert header[k]["dtype"] == before[0][k]["dtype"] and header[k]["shape"] == before[0][k]["shape"], k
    return sum(raw[k] != before[1][k] for k in text_keys)


def text_measures(old_dir, new_dir, eval_path, ctx=256):
    """On the held-out text (consecutive windows of ctx tokens, each from an empty state, as train_demo_model's
    evaluate): each model's loss, perplexity and MTP acceptance at temperature 0, and the mean KL divergence
    KL(old || new) of the next-token distributions and their top-1 agreement."""
    import torch
    import torch.nn.functional as F
    from tokenizers import Tokenizer
    with open(eval_path, encoding="utf-8") as f:
        eval_ids = Tokenizer.from_file(os.path.join(old_dir, "tokenizer.json")).encode(f.read()).ids
    trs = [tdm.Trainer(*tdm.load_checkpoint(d, torch.float32)) for d in (old_dir, new_dir)]
    nll, acc, kl, agree, n = [0.0, 0.0], [0, 0], 0.0, 0, 0
    with torch.no_grad():
        for w in range(len(eval_ids) // ctx):
            ids = torch.tensor(eval_ids[w * ctx:(w + 1) * ctx])[None]
            lps = []
            for i, tr in enumerate(trs):
                logits, dlogits = tr.forward(ids)
                lp = torch.log_softmax(logits[0, :-1].float(), -1)
                nll[i] += float(-lp.gather(1, ids[0, 1:, None]).sum())
                acc[i] += int((dlogits[0].argmax(-1) == logits[0, 1:].argmax(-1)).sum())
                lps.append(lp)
            kl += float((lps[0].exp() * (lps[0] - lps[1])).sum())
            agree += int((lps[0].argmax(-1) == lps[1].argmax(-1)).sum())
            n += ctx - 1
    out = {name: dict(loss=round(nll[i] / n, 4), ppl=round(math.exp(nll[i] / n), 2), mtp_acceptance=round(acc[i] / n, 4))
           for i, name in enumerate(("old", "new"))}
    return out | dict(tokens=n, ctx=ctx, kl_old_new=round(kl / n, 4), top1_agreement=round(agree / n, 4))


CHAT_MESSAGES = ["What is a dictionary?", "How do I open a file?", "hello"]


def engine_text(engine, old_dir, new_dir, eval_path):
    """`qwen35 eval` of the new model against the old on the held-out text, and `qwen35 chat` replies of both."""
    r = subprocess.run([engine, "eval", "-m", new_dir, "--text", eval_path, "--kld-base", old_dir, "--ctx", "256",
                        "-t", "1", "--json"], capture_output=True, text=True, check=True)
    out = dict(eval=json.loads(r.stdout), chat={})
    for name, d in (("old", old_dir), ("new", new_dir)):
        r = subprocess.run([engine, "chat", "-m", d, "--temp", "0", "-n", "40", "-t", "1"],
                           input="\n".join(CHAT_MESSAGES) + "\n/quit\n", capture_output=True, text=True, check=True)
        out["chat"][name] = r.stdout
    return out


INSTALLED = ("config.json", "model.safetensors", "preprocessor_config.json", "chat_template.jinja",
             "tokenizer_config.json", "training_log.json")


def main():
    a = parse_args()
    if a.write_template:
        with open(a.write_template, "w") as f:
            f.write(CHAT_TEMPLATE)
        return
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import shutil
    import tempfile
    import torch
    import transformers
    torch.set_num_threads(a.threads)
    torch.use_deterministic_algorithms(True)
    out = a.out or a.demo
    demo = tempfile.mkdtemp(prefix="demo-vision-")  # the work copy: `out` changes only when the tower passes
    for name in os.listdir(a.demo):
        shutil.copy(os.path.join(a.demo, name), demo)
    st_path = os.path.join(demo, "model.safetensors")
    log_path = os.path.join(demo, "training_log.json")
    with open(log_path) as f:
        full_log = json.load(f)
    if a.eval_only:
        log = full_log["vision"]
        keys = None
        if "drawing" in log:  # the held-out images are drawn as in training
            set_drawing(**log["drawing"])
    else:
        before = read_raw(st_path)
        with open(os.path.join(demo, "config.json")) as f:
            cfg_dict = json.load(f)
        cfg_dict["vision_config"] = dict(TOWER, model_type="qwen3_5_vision",
                                         rope_parameters={"rope_theta": 10000.0, "rope_type": "axial"})
        write_files(demo, cfg_dict)  # the processor's sizes are read back by Prompts
        pr = Prompts(demo)
        log = dict(tower=TOWER, pixels=PIXELS, colours=sorted(COLOURS), shapes=SHAPES, questions=QUESTIONS,
                   drawing=dict(upright=UPRIGHT, rotation_degrees=round(math.degrees(ROTATION), 3),
                                radius=list(SHAPE_RADIUS)),
                   seed=a.seed, steps=a.steps, batch=a.batch, lr=a.lr, warmup=a.warmup, threads=a.threads,
                   versions=dict(torch=torch.__version__, transformers=transformers.__version__))
        if a.bound:
            lm = build_model(a.demo, cfg_dict, a.seed).eval()
            log["context_probe"] = context_probe(lm, pr)
            log["soft_prompt_bound"] = soft_prompt_bound(lm, pr, held_out(a.seed + 3, a.bound, set()), a.bound_steps,
                                                         a.bound_lr)
            print("context probe:", log["context_probe"], "\nsoft-prompt bound:", log["soft_prompt_bound"], flush=True)
            del lm
            if a.bound_only:
                with open(a.report, "w") as f:
                    json.dump(log, f, indent=1)
                    f.write("\n")
                shutil.rmtree(demo)
                return
        model, mtp, keys = train(a, demo, cfg_dict, pr, log)
        if a.train_lm:
            log["text_tensors_changed"] = save_all(model, mtp, demo, before)
        else:
            log["frozen_tensors_unchanged"] = save_tower(model, demo, before)
        _, raw, _ = read_raw(st_path)
        log["tower_bytes"] = sum(len(v) for k, v in raw.items() if k.startswith("model.visual."))
    pr = Prompts(demo)
    items = held_out(a.seed + 1, a.held_out, keys or set())
    log["prompt"] = pr.render(QUESTION)
    hf = eval_hf(demo, pr, items)
    log["held_out_transformers"] = summary(hf)
    print("transformers:", log["held_out_transformers"], flush=True)
    photo_jpeg, photo = jpeg(photo_like(a.seed + 2))  # measured as the test data stores it
    log["photo_like_transformers"] = eval_hf(demo, pr, [(photo, "", "")])[0]["said"]
    log["held_out_samples"] = [dict(want=answer(c, s), said=r["said"]) for (_, c, s), r in zip(items[:12], hf)]
    if a.engine:
        tmp = os.path.join(demo, "images")
        c = eval_engine(a.engine, demo, pr, items, tmp)
        log["held_out_engine"] = summary(c)
        log["engine_equals_transformers"] = sum(x["said"].strip() == y["said"].strip() for x, y in zip(c, hf))
        log["photo_like_engine"] = eval_engine(a.engine, demo, pr, [(photo, "", "")], tmp)[0]["said"]
        print("engine:", log["held_out_engine"], "same answers:", log["engine_equals_transformers"], flush=True)
        shutil.rmtree(tmp)
    if a.train_lm and not a.eval_only:  # against the model it was trained from (an --eval-only run has none)
        log["text"] = text_measures(a.demo, demo, a.eval_text)
        print("text:", log["text"], flush=True)
        if a.engine:
            log["text_engine"] = engine_text(a.engine, a.demo, demo, a.eval_text)
            print("engine text:", json.dumps(log["text_engine"], indent=1), flush=True)
    full_log["vision"] = log
    with open(log_path, "w") as f:
        json.dump(full_log, f, indent=1)
        f.write("\n")
    with open(a.report, "w") as f:
        json.dump(log, f, indent=1)
        f.write("\n")
    exact = log["held_out_transformers"]["exact"]
    if exact < a.min_exact:
        shutil.rmtree(demo)
        raise SystemExit(f"held-out exact-answer accuracy {exact:.3f} < --min-exact {a.min_exact}: {out} is left "
                         f"as it was (the measures are in {a.report})")
    os.makedirs(out, exist_ok=True)
    for name in os.listdir(demo) if log.get("train_lm") else INSTALLED:
        shutil.copy(os.path.join(demo, name), os.path.join(out, name))
    shutil.rmtree(demo)
    if a.test_images:
        write_test_images(a, items, hf, photo_jpeg, log["photo_like_transformers"], log["prompt"])


def write_test_images(a, items, hf, photo_jpeg, photo_said, prompt):
    """The first held-out images as PNGs (and the photo-like picture as a JPEG), with answers.json: each image's
    true answer and the reply transformers gave (greedy, fp32 on the saved weights), the engine's golden."""
    os.makedirs(a.test_images, exist_ok=True)
    for name in os.listdir(a.test_images):  # a re-run replaces the set
        if name.endswith(".png"):
            os.remove(os.path.join(a.test_images, name))
    answers, replies = {}, {}
    for i, ((img, c, s), r) in enumerate(zip(items[:a.n_test_images], hf)):
        name = f"{i}-{c}-{s}.png"
        buf = io.BytesIO()
        img.save(buf, format="PNG", optimize=True)
        with open(os.path.join(a.test_images, name), "wb") as f:
            f.write(buf.getvalue())
        answers[name], replies[name] = answer(c, s), r["said"]
    with open(os.path.join(a.test_images, "photo-like.jpg"), "wb") as f:
        f.write(photo_jpeg)
    replies["photo-like.jpg"] = photo_said
    with open(os.path.join(a.test_images, "answers.json"), "w") as f:
        json.dump(dict(question=QUESTION, prompt=prompt, answers=answers, transformers=replies), f, indent=1,
                  sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
