#!/usr/bin/env python3
"""Build tiny random Qwen3.5 vision towers and record transformers' fp32 outputs for the C tests.

Usage (from the repository root, with the reference stack of scripts/requirements-reference.txt):

    .venv-ref/bin/python scripts/make_vision_goldens.py [--out tests/data/vision]

Each tower is transformers' own Qwen3_5VisionModel (depth, heads, patch, temporal patch, merge and
position-table size vary), its weights redrawn at random and stored in BF16 as the published checkpoints
store them, saved as NAME/model.safetensors (model.visual.* names) beside a config.json whose vision_config
describes it (the text config is transformers' default; no text weights are saved). The goldens come from
reloading the BF16 weights into the model in float32 and running it on random pixel_values for two images
at once (two grids: attention stays within each image): NAME.pixels.f32 (input rows), NAME.out.f32 (the
merger's output, pooler_output) and NAME.json (grids, shapes). The tower of tests/data/models/tiny-a
(transformers' initialisation, as saved there) gets the same treatment as "tiny-a-visual". vt-a also
encodes two test image files as the processor prepares them (vt-a.images.*): bytes to embeddings.
Deterministic.
"""

import argparse
import json
import os

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import Qwen3_5Config
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5VisionModel

TOWERS = [
    dict(name="vt-a", seed=11, grids=[[1, 8, 6], [1, 4, 10]],
         vision=dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=4, patch_size=4,
                     temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=24, num_position_embeddings=16)),
    dict(name="vt-b", seed=12, grids=[[1, 6, 6], [1, 3, 9]],
         vision=dict(depth=3, hidden_size=16, intermediate_size=40, num_heads=2, patch_size=2,
                     temporal_patch_size=1, spatial_merge_size=3, out_hidden_size=40, num_position_embeddings=36)),
    dict(name="vt-c", seed=13, grids=[[1, 2, 2], [1, 10, 4]],
         vision=dict(depth=1, hidden_size=24, intermediate_size=40, num_heads=3, patch_size=3,
                     temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=16, num_position_embeddings=9)),
]
WEIGHT_STD = 0.15


def randomize(model, gen):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm1.weight") or name.endswith("norm2.weight") or name.endswith("norm.weight"):
                v = 1.0 + 0.2 * torch.randn(p.shape, generator=gen)
            elif name.endswith("bias"):
                v = 0.1 * torch.randn(p.shape, generator=gen)
            elif name.endswith("pos_embed.weight"):
                v = 0.5 * torch.randn(p.shape, generator=gen)
            else:
                v = WEIGHT_STD * torch.randn(p.shape, generator=gen)
            p.data = v.to(torch.bfloat16).float()  # the values a BF16 checkpoint holds


def run(model, grids, seed):
    gen = torch.Generator().manual_seed(seed + 100)
    cfg = model.config
    dim = cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size ** 2
    n = sum(t * h * w for t, h, w in grids)
    pixels = torch.randn(n, dim, generator=gen)
    with torch.no_grad():
        out = model(pixels, grid_thw=torch.tensor(grids)).pooler_output.float()
    return pixels, out


def record(out_dir, name, vcfg, grids, pixels, out):
    pixels.numpy().astype("<f4").tofile(os.path.join(out_dir, f"{name}.pixels.f32"))
    out.numpy().astype("<f4").tofile(os.path.join(out_dir, f"{name}.out.f32"))
    meta = dict(name=name, grids=grids, pixels_shape=list(pixels.shape), out_shape=list(out.shape),
                out_max_abs=float(out.abs().max()), vision_config=vcfg,
                transformers_version=transformers.__version__, torch_version=torch.__version__)
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    print(f"{name}: out {list(out.shape)}, max |out| {meta['out_max_abs']:.3g}")


IMAGE_FILES = ["rgb_37x53.jpg", "exif6_40x24.jpg"]


def from_files(model, out_dir, v):
    """Two test image files through AutoImageProcessor (Qwen3.5's processor with this tower's patch sizes)
    and the tower: image bytes to merged embeddings, as one pipeline."""
    import tempfile
    from transformers import AutoImageProcessor
    d = tempfile.mkdtemp()
    Qwen3_5Config().save_pretrained(d)
    pre = dict(patch_size=v["patch_size"], temporal_patch_size=v["temporal_patch_size"],
               merge_size=v["spatial_merge_size"], image_mean=[0.5] * 3, image_std=[0.5] * 3,
               size={"shortest_edge": 256, "longest_edge": 40 * 40})
    with open(os.path.join(d, "preprocessor_config.json"), "w") as f:
        json.dump(pre, f)
    proc = AutoImageProcessor.from_pretrained(d)
    images = os.path.join(os.path.dirname(out_dir), "images")
    res = proc(images=[os.path.join(images, n) for n in IMAGE_FILES], return_tensors="pt")
    grids = res["image_grid_thw"].tolist()
    with torch.no_grad():
        out = model(res["pixel_values"], grid_thw=res["image_grid_thw"]).pooler_output.float()
    out.numpy().astype("<f4").tofile(os.path.join(out_dir, "vt-a.images.out.f32"))
    meta = dict(files=IMAGE_FILES, preprocessor_config=pre, grids=grids, out_shape=list(out.shape),
                out_max_abs=float(out.abs().max()), processor_class=type(proc).__name__)
    with open(os.path.join(out_dir, "vt-a.images.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    print(f"vt-a from image files: grids {grids}, out {list(out.shape)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    root = os.path.join(os.path.dirname(__file__), "..", "tests", "data")
    ap.add_argument("--out", default=os.path.join(root, "vision"))
    args = ap.parse_args()
    out_dir = os.path.normpath(args.out)
    os.makedirs(out_dir, exist_ok=True)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    for spec in TOWERS:
        torch.manual_seed(spec["seed"])
        cfg = Qwen3_5Config(vision_config=spec["vision"])
        vcfg = cfg.vision_config
        vcfg._attn_implementation = "eager"
        model = Qwen3_5VisionModel(vcfg).eval()
        randomize(model, torch.Generator().manual_seed(spec["seed"]))
        ck = os.path.join(out_dir, spec["name"])
        os.makedirs(ck, exist_ok=True)
        tensors = {"model.visual." + k: v.to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
        save_file(tensors, os.path.join(ck, "model.safetensors"), metadata={"format": "pt"})
        cfg.save_pretrained(ck)
        cfg_path = os.path.join(ck, "config.json")
        with open(cfg_path) as f:
            saved = json.load(f)
        with open(cfg_path, "w") as f:
            json.dump(saved, f, indent=2, sort_keys=True)
            f.write("\n")
        # reload from the saved BF16 file into float32, as the goldens of the text model do
        state = {k[len("model.visual."):]: v.float() for k, v in load_file(os.path.join(ck, "model.safetensors")).items()}
        model.load_state_dict(state)
        pixels, out = run(model, spec["grids"], spec["seed"])
        record(out_dir, spec["name"], saved["vision_config"], spec["grids"], pixels, out)
        if spec["name"] == "vt-a":
            from_files(model, out_dir, spec["vision"])

    # the tower saved in tiny-a, as it is there
    tiny = os.path.join(root, "models", "tiny-a")
    cfg = Qwen3_5Config.from_pretrained(tiny)
    vcfg = cfg.vision_config
    vcfg._attn_implementation = "eager"
    model = Qwen3_5VisionModel(vcfg).eval()
    state = {k[len("model.visual."):]: v.float() for k, v in load_file(os.path.join(tiny, "model.safetensors")).items()
             if k.startswith("model.visual.")}
    model.load_state_dict(state)
    pixels, out = run(model, [[1, 4, 6], [1, 2, 2]], 7)
    with open(os.path.join(tiny, "config.json")) as f:
        record(out_dir, "tiny-a-visual", json.load(f)["vision_config"], [[1, 4, 6], [1, 2, 2]], pixels, out)


if __name__ == "__main__":
    main()
