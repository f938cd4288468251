#!/usr/bin/env bash
# Builds and installs the nvfp4 plugin on a GPU host (the SDK must be installed already), runs the
# conformance suite on CUDA and the CPU reference, the plugin's GPU tests (CUDA blobs against the
# CPU reference's), a memcheck and a racecheck pass and the benchmark, and writes every log and
# result into OUT_DIR.
#
#   plugins/kvcodec-nvfp4/scripts/gpu-check.sh [OUT_DIR]     (default: ./gpu-results-nvfp4)
#
# KVCODEC_GPU_PHASE=tests runs everything but the benchmark; =bench only the benchmark (the plugin
# installed by an earlier tests phase); unset or all: everything.
#
# Needs torch with CUDA, ml_dtypes, pytest, scikit-build-core, pybind11, cmake and nvcc.
source "$(dirname "$0")/../../../scripts/lib/plugin-gpu-check.sh" nvfp4 "${1:-}"

if [[ "$PHASE" != bench ]]; then

step "build"
if ! timeout 420 python3 -m pip install --no-build-isolation --no-deps -v "$HERE" > "$OUT_DIR/build.log" 2>&1; then
  tail -40 "$OUT_DIR/build.log"; echo "nvfp4 build failed"; exit 1
fi

step "kvcodec check nvfp4 --device all"
(cd "$OUT_DIR" && timeout -k 15 300 kvcodec check nvfp4 --device all --golden "$HERE/tests/vectors" \
   --junit-xml "$OUT_DIR/conformance.xml") > "$OUT_DIR/conformance.txt" 2>&1 || status=1
tail -30 "$OUT_DIR/conformance.txt"

step "pytest -m gpu"
# From outside the source tree, so the installed package is what gets tested.
(cd "$OUT_DIR" && timeout -k 15 -s ABRT 300 python3 -X faulthandler -m pytest -m gpu -v -p no:cacheprovider \
   --rootdir "$HERE" -c "$HERE/pyproject.toml" "$HERE/tests/test_nvfp4_gpu.py" --junitxml=pytest-gpu.xml) \
   > "$OUT_DIR/pytest-gpu.log" 2>&1 || status=1
tail -15 "$OUT_DIR/pytest-gpu.log"

if command -v compute-sanitizer > /dev/null && [[ -z "${KVCODEC_SKIP_MEMCHECK:-}" ]]; then
  for tool in memcheck racecheck; do
    step "compute-sanitizer $tool"
    (cd "$OUT_DIR" && timeout 240 compute-sanitizer --tool "$tool" --error-exitcode 3 \
       python3 -m pytest -q -m gpu -p no:cacheprovider --rootdir "$HERE" -c "$HERE/pyproject.toml" \
       "$HERE/tests/test_nvfp4_gpu.py" -k "mixed and device or misaligned or out_of_range") \
       > "$OUT_DIR/$tool.log" 2>&1 || status=1
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" "$OUT_DIR/$tool.log" | tail -5
  done
fi

fi

if [[ "$PHASE" != tests ]]; then
step "benchmark"
for data in kv-like skewed-heads; do
  (cd "$OUT_DIR" && timeout -s INT 240 python3 "$HERE/bench/bench_nvfp4.py" --device cuda --pages 512 --repeats 20 \
     --data "$data" --json "$OUT_DIR/bench-cuda-$data.json") > "$OUT_DIR/bench-$data.log" 2>&1 || status=1
  cat "$OUT_DIR/bench-$data.log"
done
# The same pages, 10 calls back to back per sample: the device's rate without the host's issue
# time between single calls (docs/nvfp4.md).
(cd "$OUT_DIR" && timeout -s INT 240 python3 "$HERE/bench/bench_nvfp4.py" --device cuda --pages 512 --repeats 20 \
   --calls 10 --data kv-like --json "$OUT_DIR/bench-cuda-kv-like-calls10.json") > "$OUT_DIR/bench-kv-like-calls10.log" 2>&1 || status=1
cat "$OUT_DIR/bench-kv-like-calls10.log"
fi

step "done (status $status)"
exit $status
