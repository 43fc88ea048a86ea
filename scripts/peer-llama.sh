#!/usr/bin/env bash
# The llama.cpp that make bench-peer and make quality-peer compare against: the llama.cpp vendored in
# the PyPI source distribution of llama-cpp-python (pinned version and sha256 below), built for the
# CPU under bench-data/peer/ (ignored by git), once; and a Python venv there with that source's own
# `gguf` package (gguf-py) to write GGUF files. Nothing of it is committed.
#   scripts/peer-llama.sh            set up (reusing what is there), print the paths as shell variables
#   scripts/peer-llama.sh --check    say what is there and what would be done; download and build nothing
# Layout: bench-data/peer/{sdist/,llama_cpp_python-VERSION/,build/,venv/}; PEER_DIR overrides the folder.
# PEER_ISA=avx2 builds in build-avx2/ for AVX2 + FMA + F16C only (GGML_NATIVE off, no AVX-512), so that on
# a CPU with AVX-512 both engines can also be compared as an AVX2-only machine runs them; default native.
set -euo pipefail
cd "$(dirname "$0")/.."

LCP_VERSION=0.3.36
LCP_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
PEER=${PEER_DIR:-bench-data/peer}
SDIST=$PEER/sdist/llama_cpp_python-$LCP_VERSION.tar.gz
SRC=$PEER/llama_cpp_python-$LCP_VERSION/vendor/llama.cpp
ISA=${PEER_ISA:-native}
case "$ISA" in
    native) BLD=$PEER/build; ISA_FLAGS=(-DGGML_NATIVE=ON) ;;
    avx2) BLD=$PEER/build-avx2
          ISA_FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
                     -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF
                     -DGGML_AVX512_BF16=OFF) ;;
    *) echo "peer-llama: PEER_ISA='$ISA': native or avx2" >&2; exit 1 ;;
esac
VENV=$PEER/venv
TARGETS=(llama-bench llama-quantize llama-perplexity llama-tokenize)

die() { echo "peer-llama: $*" >&2; exit 1; }

built() { for t in "${TARGETS[@]}"; do [ -x "$BLD/bin/$t" ] || return 1; done; }

if [ "${1:-}" = "--check" ]; then
    echo "llama-cpp-python $LCP_VERSION, sha256 $LCP_SHA256; instruction sets: $ISA"
    [ -f "$SDIST" ] && echo "sdist: $SDIST (present)" || echo "sdist: $SDIST (would download with pip from PyPI)"
    [ -d "$SRC" ] && echo "source: $SRC (present)" || echo "source: $SRC (would unpack)"
    built && echo "build: $BLD/bin (present: ${TARGETS[*]})" || echo "build: $BLD/bin (would build ${TARGETS[*]})"
    [ -x "$VENV/bin/python" ] && echo "venv: $VENV (present)" || echo "venv: $VENV (would create, with gguf-py from the source)"
    command -v cmake >/dev/null && echo "cmake: $(command -v cmake)" || echo "cmake: missing (scripts/install-deps.sh --peer installs it)"
    exit 0
fi

# cmake, g++ and python3-venv through the project's install script
if ! command -v cmake >/dev/null || ! command -v g++ >/dev/null || ! python3 -c "import venv, ensurepip" 2>/dev/null; then
    scripts/install-deps.sh --peer >&2 || die "scripts/install-deps.sh --peer failed"
fi
mkdir -p "$PEER/sdist"

if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV" >&2 || die "cannot create the venv $VENV"
fi

# 1. the pinned source distribution, checked against its sha256
if [ ! -f "$SDIST" ]; then
    echo "peer-llama: downloading llama-cpp-python $LCP_VERSION (source distribution, ~77 MB) from PyPI" >&2
    tmp=$PEER/sdist/tmp.$$; rm -rf "$tmp"; mkdir -p "$tmp"
    "$VENV/bin/pip" download -q --disable-pip-version-check --no-deps --no-binary :all: \
        "llama-cpp-python==$LCP_VERSION" -d "$tmp" >&2 \
        || { rm -rf "$tmp"; die "download of llama-cpp-python==$LCP_VERSION from PyPI failed"; }
    [ -f "$tmp/$(basename "$SDIST")" ] || { rm -rf "$tmp"; die "pip did not leave $(basename "$SDIST")"; }
    mv "$tmp/$(basename "$SDIST")" "$SDIST.part"; rm -rf "$tmp"
    got=$(sha256sum "$SDIST.part" | cut -d' ' -f1)
    if [ "$got" != "$LCP_SHA256" ]; then
        rm -f "$SDIST.part"
        die "checksum mismatch for llama_cpp_python-$LCP_VERSION.tar.gz: got $got, expected $LCP_SHA256"
    fi
    mv "$SDIST.part" "$SDIST"
fi
got=$(sha256sum "$SDIST" | cut -d' ' -f1)
[ "$got" = "$LCP_SHA256" ] || die "$SDIST: sha256 $got, expected $LCP_SHA256 (delete it to download again)"

# 2. its vendored llama.cpp
if [ ! -f "$SRC/CMakeLists.txt" ]; then
    rm -rf "$PEER/llama_cpp_python-$LCP_VERSION"
    tar -xzf "$SDIST" -C "$PEER" || die "cannot unpack $SDIST"
    [ -f "$SRC/CMakeLists.txt" ] || die "$SDIST has no vendor/llama.cpp"
fi

# 3. the CPU tools, once (about 10 minutes on 2 cores)
if ! built; then
    LOG=$PEER/$(basename "$BLD").log
    echo "peer-llama: building llama.cpp (${TARGETS[*]}; $ISA) in $BLD; log in $LOG" >&2
    { cmake -S "$SRC" -B "$BLD" -DCMAKE_BUILD_TYPE=Release "${ISA_FLAGS[@]}" -DBUILD_SHARED_LIBS=OFF \
          -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
          -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
      && cmake --build "$BLD" -j "$(nproc)" --target "${TARGETS[@]}"; } > "$LOG" 2>&1 \
        || { tail -20 "$LOG" >&2; die "building llama.cpp failed (log: $LOG)"; }
    built || die "the build finished without ${TARGETS[*]} in $BLD/bin"
fi

# 4. the gguf package of the same source, and numpy
if ! "$VENV/bin/python" -c "import gguf, numpy" 2>/dev/null; then
    "$VENV/bin/pip" install -q --disable-pip-version-check "$SRC/gguf-py" >&2 \
        || die "pip install of $SRC/gguf-py (and numpy) failed"
fi

echo "PEER_SRC=$SRC"
echo "PEER_BIN=$BLD/bin"
echo "PEER_PY=$VENV/bin/python"
echo "PEER_VERSION=llama-cpp-python-$LCP_VERSION"
echo "PEER_SHA256=$LCP_SHA256"
echo "PEER_ISA=$ISA"
echo "PEER_CMAKE_FLAGS='${ISA_FLAGS[*]}'"
