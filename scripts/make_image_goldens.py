#!/usr/bin/env python3
"""Make the test images and the image-processor goldens the C tests compare against.

Usage (from the repository root, with the reference stack of scripts/requirements-reference.txt):

    .venv-ref/bin/python scripts/make_image_goldens.py [--out tests/data/images]

Writes small test images (odd sizes, extreme aspect ratios, tiny and large, grey, palette, alpha, 16-bit,
interlaced, EXIF-rotated; JPEG, PNG, WebP, GIF) and, for each, what transformers' image processor for Qwen3.5
makes of it. The processor is the class AutoProcessor gives for model_type qwen3_5
(Qwen2VLImageProcessor, the torchvision backend, the default), with the values of Qwen3.5's
preprocessor_config.json (patch 16, temporal patch 2, merge 2, size 65536..16777216 pixels, mean and std
0.5), given the image as a file path as a chat request gives it: it decodes the file itself
(load_image_as_tensor: torchvision's decode_image in RGB mode with the EXIF orientation applied).

Per image, golden.json records the grid (image_grid_thw), the pixel_values shape and checksums, the
SHA-256 of the decoded RGB bytes the processor starts from (and, for the smaller images, those bytes as a
lossless PNG, NAME.decoded.png), and NAME.resized.png (the
resized uint8 image, recovered exactly from pixel_values: the script checks that every value is
(v - 127.5) / 127.5 for an integer v and that the temporal copies are equal, so the PNG and
pixel_values say the same thing). One small case with patch 4 keeps its whole pixel_values
(layout.f32) to pin the patch order. The script is deterministic.
"""

import argparse
import hashlib
import io
import json
import os

import numpy as np
import PIL
import torch
import torchvision
import transformers
from PIL import Image, ImageDraw
from transformers import AutoImageProcessor, Qwen3_5Config

QWEN35 = dict(patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5, 0.5, 0.5],
              image_std=[0.5, 0.5, 0.5], size={"shortest_edge": 65536, "longest_edge": 16777216})


def scene(w, h, seed, mode="RGB"):
    """A smooth picture with a few hard edges: compresses well, and asymmetric so that any flip shows."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    r = 127 + 120 * np.sin(x / max(w, 1) * 3.1 + seed)
    g = 127 + 120 * np.cos(y / max(h, 1) * 2.3 + seed * 0.5)
    b = 255 * (x + 2 * y) / max(w + 2 * h, 1)
    img = Image.fromarray(np.stack([r, g, b], -1).clip(0, 255).astype(np.uint8), "RGB")
    d = ImageDraw.Draw(img)
    for _ in range(3):
        x0, y0 = int(rng.integers(0, max(w - 1, 1))), int(rng.integers(0, max(h - 1, 1)))
        x1, y1 = x0 + int(rng.integers(1, max(w // 3, 2))), y0 + int(rng.integers(1, max(h // 3, 2)))
        d.rectangle([x0, y0, x1, y1], fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
    d.line([0, 0, w // 2, h - 1], fill=(255, 255, 255), width=1)
    return img.convert(mode) if mode != "RGB" else img


def with_alpha(img, seed):
    w, h = img.size
    y, x = np.mgrid[0:h, 0:w]
    a = ((x * 255) // max(w - 1, 1)).astype(np.uint8)
    a[: h // 3] = 0  # fully transparent band: what colour lies under it matters
    rgba = img.convert("RGBA")
    rgba.putalpha(Image.fromarray(a, "L"))
    return rgba


def exif_bytes(orientation):
    ex = Image.Exif()
    ex[0x0112] = orientation
    return ex.tobytes()


def png16(w, h, seed, grey):
    """A 16-bit PNG written with raw bytes (Pillow cannot write 16-bit RGB)."""
    import struct
    import zlib
    rng = np.random.default_rng(seed)
    ch = 1 if grey else 3
    y, x = np.mgrid[0:h, 0:w]
    base = (x * 65535 // max(w - 1, 1) + y * 977) % 65536
    data = np.stack([(base + 20000 * c + rng.integers(0, 300, base.shape)) % 65536 for c in range(ch)], -1)
    raw = b"".join(b"\0" + data[r].astype(">u2").tobytes() for r in range(h))

    def chunk(t, b):
        return struct.pack(">I", len(b)) + t + b + struct.pack(">I", zlib.crc32(t + b) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", w, h, 16, 0 if grey else 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def exif_after_idat(img, orientation):
    """A PNG whose eXIf chunk follows the image data (Pillow writes it before)."""
    import struct
    import zlib
    a = np.asarray(img.convert("RGB"))
    h, w, _ = a.shape
    raw = b"".join(b"\0" + a[r].tobytes() for r in range(h))
    exif = exif_bytes(orientation)
    exif = exif[6:] if exif.startswith(b"Exif\0\0") else exif

    def chunk(t, b):
        return struct.pack(">I", len(b)) + t + b + struct.pack(">I", zlib.crc32(t + b) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"eXIf", exif) + chunk(b"IEND", b""))


def encode(img, fmt, **kw):
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def cases():
    """(name, file bytes, processor overrides)"""
    out = []
    small = dict(size={"shortest_edge": 1024, "longest_edge": 96 * 96})
    out.append(("rgb_37x53.jpg", encode(scene(37, 53, 1), "JPEG", quality=90), {}))
    out.append(("grey_61x23.jpg", encode(scene(61, 23, 2, "L"), "JPEG", quality=85), {}))
    out.append(("rgb_420_83x47.jpg", encode(scene(83, 47, 3), "JPEG", quality=80, subsampling=2), small))
    out.append(("progressive_50x50.jpg", encode(scene(50, 50, 4), "JPEG", quality=75, progressive=True), small))
    out.append(("tiny_1x1.png", encode(scene(1, 1, 5), "PNG"), {}))
    out.append(("tiny_3x2.png", encode(scene(3, 2, 6), "PNG"), small))
    out.append(("wide_400x3.png", encode(scene(400, 3, 7), "PNG"), small))
    out.append(("tall_9x700.png", encode(scene(9, 700, 8), "PNG"), small))
    out.append(("rgba_64x40.png", encode(with_alpha(scene(64, 40, 9), 9), "PNG"), small))
    out.append(("la_30x30.png", encode(with_alpha(scene(30, 30, 10), 10).convert("LA"), "PNG"), small))
    pal = scene(50, 30, 11).quantize(16)
    out.append(("palette_trns_50x30.png", encode(pal, "PNG", transparency=3), small))
    out.append(("grey2bit_33x17.png", encode(scene(33, 17, 12, "L").quantize(4).convert("L"), "PNG", bits=2),
                small))
    out.append(("mono_40x20.png", encode(scene(40, 20, 13, "1"), "PNG"), small))
    out.append(("interlaced_45x45.png", interlaced_png(scene(45, 45, 14)), small))
    out.append(("rgb16_20x20.png", png16(20, 20, 15, grey=False), small))
    out.append(("lossy_70x50.webp", encode(scene(70, 50, 16), "WEBP", quality=80), small))
    out.append(("lossless_alpha_31x29.webp",
                encode(with_alpha(scene(31, 29, 17), 17), "WEBP", lossless=True, exact=True), small))
    out.append(("lossy_alpha_26x34.webp", encode(with_alpha(scene(26, 34, 18), 18), "WEBP", quality=70), small))
    for o in (2, 3, 5, 6, 7, 8):
        out.append((f"exif{o}_40x24.jpg", encode(scene(40, 24, 20 + o), "JPEG", quality=90, exif=exif_bytes(o)),
                    small))
    out.append(("exif6_36x20.png", encode(scene(36, 20, 30), "PNG", exif=exif_bytes(6)), small))
    out.append(("exif6_after_idat_36x20.png", exif_after_idat(scene(36, 20, 32), 6), small))
    out.append(("exif8_36x20.webp", encode(scene(36, 20, 31), "WEBP", lossless=True, exif=exif_bytes(8)), small))
    # GIF: one frame; transparent pixels show the background colour; Pillow interlaces from 16 pixels up
    gif = scene(50, 36, 43).quantize(32)
    out.append(("interlaced_trns_50x36.gif", encode(gif, "GIF", transparency=3, background=7), small))
    out.append(("small_12x9.gif", encode(scene(12, 9, 44).quantize(8), "GIF"), small))
    out.append(("grey_40x30.gif", encode(scene(40, 30, 45, "L"), "GIF", interlace=False), small))
    # large inputs, shrunk by max_pixels: the antialiased (downscaling) filter
    out.append(("large_1500x1100.jpg", encode(scene(1500, 1100, 40), "JPEG", quality=70),
                dict(size={"shortest_edge": 1024, "longest_edge": 160 * 120})))
    out.append(("large_900x1300.png", encode(scene(900, 1300, 41).quantize(64), "PNG"),
                dict(size={"shortest_edge": 1024, "longest_edge": 128 * 128})))
    # the Qwen3.5 defaults on a mid-size image (upscaled to the 65536-pixel floor)
    out.append(("mid_190x150.webp", encode(scene(190, 150, 42), "WEBP", quality=85), {}))
    return out


def interlaced_png(img):
    """Pillow cannot write Adam7; build it from the raw passes."""
    import struct
    import zlib
    a = np.asarray(img.convert("RGB"))
    h, w, _ = a.shape
    passes = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]
    raw = b""
    for x0, y0, dx, dy in passes:
        sub = a[y0::dy, x0::dx]
        if sub.size == 0:
            continue
        raw += b"".join(b"\0" + sub[r].tobytes() for r in range(sub.shape[0]))

    def chunk(t, b):
        return struct.pack(">I", len(b)) + t + b + struct.pack(">I", zlib.crc32(t + b) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 1)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def bombs():
    """Small files that declare huge images (decompression bombs): the decoder must refuse them at the
    header; and an animated GIF (refused as unsupported). Not given to the processor."""
    import struct
    import zlib

    def chunk(t, b):
        return struct.pack(">I", len(b)) + t + b + struct.pack(">I", zlib.crc32(t + b) & 0xFFFFFFFF)

    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 60000, 60000, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(b"\0" * 1000)) + chunk(b"IEND", b""))
    jpg = bytearray(encode(scene(16, 16, 50), "JPEG", quality=50))
    sof = jpg.index(b"\xff\xc0")
    jpg[sof + 5:sof + 9] = struct.pack(">HH", 65000, 65000)  # height, width
    webp = bytearray(encode(scene(16, 16, 51), "WEBP", lossless=True))
    assert webp[12:16] == b"VP8L"
    bits = (16383 - 1) | (16383 - 1) << 14  # 14-bit width-1 and height-1 after the 0x2f signature
    webp[21:25] = struct.pack("<I", bits | (struct.unpack("<I", bytes(webp[21:25]))[0] & 0xF0000000))
    gif = bytearray(encode(scene(16, 16, 52).quantize(8), "GIF"))
    gif[6:10] = struct.pack("<HH", 65000, 65000)  # the logical screen
    two = [scene(20, 14, 53).quantize(8), scene(20, 14, 54).quantize(8)]
    anim = io.BytesIO()
    two[0].save(anim, "GIF", save_all=True, append_images=two[1:])
    return [("bomb_60000x60000.png", png), ("bomb_65000x65000.jpg", bytes(jpg)), ("bomb_16383x16383.webp", bytes(webp)),
            ("bomb_65000x65000.gif", bytes(gif)), ("animated_20x14.gif", anim.getvalue())]


def processor(overrides, _dir={}):
    """AutoImageProcessor on a checkpoint directory that holds only Qwen3.5's config.json and
    preprocessor_config.json: the class and backend it picks by default are the ones a user gets."""
    import tempfile
    d = tempfile.mkdtemp()
    Qwen3_5Config().save_pretrained(d)
    with open(os.path.join(d, "preprocessor_config.json"), "w") as f:
        json.dump(dict(QWEN35, **overrides), f)
    return AutoImageProcessor.from_pretrained(d)


def save_png(arr, path):
    Image.fromarray(arr, "RGB").save(path, "PNG", optimize=True)


def unpatchify(pv, grid, p):
    """pixel_values -> the resized image as uint8 HWC, checking that nothing is lost on the way."""
    ps, m, tp = p.patch_size, p.merge_size, p.temporal_patch_size
    t, gh, gw = grid
    assert t == 1
    x = pv.reshape(gh // m, gw // m, m, m, 3, tp, ps, ps)
    for k in range(1, tp):
        assert torch.equal(x[:, :, :, :, :, k], x[:, :, :, :, :, 0]), "temporal copies differ"
    x = x[:, :, :, :, :, 0]  # (bh, bw, mh, mw, c, py, px)
    img = x.permute(0, 2, 5, 1, 3, 6, 4).reshape(gh * ps, gw * ps, 3)
    v = torch.round(img * 127.5 + 127.5)
    assert v.min() >= 0 and v.max() <= 255
    back = (v.float() - 127.5) / 127.5
    assert torch.equal(back, img), "pixel_values are not (v - 127.5) / 127.5 of integers"
    return v.to(torch.uint8).numpy()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data", "images"))
    args = ap.parse_args()
    out = os.path.normpath(args.out)
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    all_cases = cases()
    golden = dict(transformers_version=transformers.__version__, torch_version=torch.__version__,
                  torchvision_version=torchvision.__version__, pillow_version=PIL.__version__,
                  processor_class=None, defaults=QWEN35, images=[])
    for name, data, overrides in all_cases:
        path = os.path.join(out, name)
        with open(path, "wb") as f:
            f.write(data)
        p = processor(overrides)
        golden["processor_class"] = type(p).__name__
        decoded = transformers.image_utils.load_image_as_tensor(path)  # what fetch_images gives the processor
        entry = dict(file=name, overrides=overrides, decoded_size=[int(decoded.shape[2]), int(decoded.shape[1])],
                     decoded_dtype=str(decoded.dtype))
        if decoded.dtype != torch.uint8:
            entry["note"] = "torchvision decodes this file to %s; no 8-bit golden" % decoded.dtype
            golden["images"].append(entry)
            print(f"{name}: {entry['note']}")
            continue
        hwc = decoded.permute(1, 2, 0).contiguous().numpy()
        entry["decoded_sha256"] = hashlib.sha256(hwc.tobytes()).hexdigest()
        if hwc.shape[0] * hwc.shape[1] <= 200 * 200:  # the large ones keep only their hash
            save_png(hwc, os.path.join(out, name + ".decoded.png"))
            entry["decoded_png"] = name + ".decoded.png"
        res = p(images=[path], return_tensors="pt")
        pv, grid = res["pixel_values"], res["image_grid_thw"][0].tolist()
        resized = unpatchify(pv, grid, p)
        save_png(resized, os.path.join(out, name + ".resized.png"))
        entry.update(grid_thw=grid, pixel_values_shape=list(pv.shape),
                     pixel_values_sum=float(pv.double().sum()), pixel_values_sumsq=float((pv.double() ** 2).sum()),
                     pixel_values_sha256=hashlib.sha256(pv.numpy().astype("<f4").tobytes()).hexdigest())
        golden["images"].append(entry)
        print(f"{name}: decoded {entry['decoded_size']}, grid {grid}")

    for name, data in bombs():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)

    # the patch layout in full, on a small image with patch 4 (layout.f32: float32, row-major)
    src = os.path.join(out, "rgb_37x53.jpg")
    p = processor(dict(patch_size=4, merge_size=2, temporal_patch_size=2,
                       size={"shortest_edge": 256, "longest_edge": 24 * 16}))
    res = p(images=[src], return_tensors="pt")
    res["pixel_values"].numpy().astype("<f4").tofile(os.path.join(out, "layout.f32"))
    golden["layout"] = dict(file="rgb_37x53.jpg", patch_size=4, merge_size=2, temporal_patch_size=2,
                            min_pixels=256, max_pixels=24 * 16, grid_thw=res["image_grid_thw"][0].tolist(),
                            pixel_values_shape=list(res["pixel_values"].shape), pixel_values_file="layout.f32")

    # smart_resize on sizes no file needs: factor 32 and the Qwen3.5 limits
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize
    sr = []
    for h, w in [(1, 1), (16, 16), (48, 80), (80, 48), (112, 112), (1000, 1000), (4000, 3000), (5000, 25),
                 (25, 5000), (10000, 9000), (240, 240), (272, 272), (1080, 1920), (37, 53), (33, 97)]:
        sr.append([h, w, *smart_resize(h, w, 32, 65536, 16777216)])
    golden["smart_resize_factor32"] = sr
    with open(os.path.join(out, "golden.json"), "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
