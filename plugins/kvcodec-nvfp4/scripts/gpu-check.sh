#!/usr/bin/env bash
# Builds the plugin on a GPU host and runs the conformance suite on CUDA and the CPU reference,
# writing the logs into OUT_DIR (default ./gpu-results).
set -uo pipefail
OUT_DIR=${1:-gpu-results}
mkdir -p "$OUT_DIR"
HERE=$(cd "$(dirname "$0")/.." && pwd)
status=0
python3 -m pip install --no-build-isolation --no-deps "$HERE" > "$OUT_DIR/build.log" 2>&1 || { tail -30 "$OUT_DIR/build.log"; exit 1; }
kvcodec check nvfp4 --device all --junit-xml "$OUT_DIR/conformance.xml" \
  | tee "$OUT_DIR/conformance.txt" || status=1
exit $status
