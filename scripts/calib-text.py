#!/usr/bin/env python3
"""Writes the demo model's calibration text for `qwen35 prepare --calibrate`.

The text comes from the demo model's own training corpus (the Python 3.11
documentation of the Debian package python3.11-doc, cleaned as
scripts/train_demo_model.py cleans it), never from its held-out files, so
quality measured on models/qwen35-demo-eval.txt stays a held-out figure.
Each training document is cut into pieces of --piece characters and every
--stride-th piece (counted over the documents in name order) is kept, so the
text samples the whole corpus; the same package gives the same bytes.

    scripts/calib-text.py [--corpus DIR] [--piece 2000] [--stride 32] -o FILE
"""
import argparse
import hashlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_demo_model as demo  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default=demo.DEFAULT_CORPUS)
    ap.add_argument("--piece", type=int, default=2000)
    ap.add_argument("--stride", type=int, default=32)
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args()
    if a.piece < 100 or a.stride < 1:
        sys.exit("calib-text: --piece must be >= 100 and --stride >= 1")
    train, _held, _pairs, _rel = demo.load_corpus(a.corpus)
    pieces, k = [], 0
    for doc in train:
        for i in range(0, len(doc), a.piece):
            if k % a.stride == 0:
                pieces.append(doc[i:i + a.piece])
            k += 1
    text = "\n\n".join(pieces)
    with open(a.out, "w", encoding="utf-8") as f:
        f.write(text)
    sha = hashlib.sha256(text.encode("utf-8")).hexdigest()
    print(f"calib-text: {len(pieces)} pieces of {k}, {len(text)} characters, sha256 {sha} -> {a.out}")


if __name__ == "__main__":
    main()
