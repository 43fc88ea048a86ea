#!/usr/bin/env bash
# A bounded soak of `qwen35 serve` with faults, on loopback only:
# scripts/stress.py (16 mixed clients; disconnects mid-stream, slow headers,
# non-reading streams, oversized and malformed bodies, one SIGTERM-restart
# cycle; byte-identical repeats, no truncation without an error, RSS within
# the prefix-cache cap plus a margin, no crash). docs/serving.md has figures.
#
#   scripts/stress.sh              the 60-second form (make stress)
#   scripts/stress.sh 1800         half an hour
#   Q35_BIN=build-asan/qwen35 scripts/stress.sh 120 --rss-margin 1024
#                                  under the sanitizers (which take memory of their own)
#
# The summary goes to stdout and, as JSON, to build/stress.json; the
# server's log to build/stress-server.log. Exits 1 on any failed check.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_TO_RUN=${1:-60}
PY=.venv/bin/python; [ -x "$PY" ] || PY=python3
export Q35_BIN=${Q35_BIN:-$PWD/build/qwen35}
mkdir -p build
exec "$PY" scripts/stress.py --seconds "$SECONDS_TO_RUN" --out build/stress.json --log build/stress-server.log "${@:2}"
