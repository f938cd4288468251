#!/usr/bin/env bash
# Builds and installs the fp8 plugin on a GPU host (the SDK must be installed already), runs its
# GPU tests, a memcheck pass and the benchmark, and writes every log and result into OUT_DIR.
#
#   plugins/kvcodec-fp8/scripts/gpu-check.sh [OUT_DIR]     (default: ./gpu-results-fp8)
#
# KVCODEC_GPU_PHASE=tests runs the build, the tests and memcheck only; =bench only the benchmark
# (the plugin installed by an earlier tests phase); unset or all: everything.
#
# Needs torch with CUDA, ml_dtypes, pytest, scikit-build-core, pybind11, cmake and nvcc.
source "$(dirname "$0")/../../../scripts/lib/plugin-gpu-check.sh" fp8 "${1:-}"

if [[ "$PHASE" != bench ]]; then
step "build"
if ! KVCODEC_FP8_PTXAS_VERBOSE=ON timeout 420 python3 -m pip install --no-build-isolation --no-deps -v "$HERE" \
     > "$OUT_DIR/build.log" 2>&1; then
  tail -40 "$OUT_DIR/build.log"; echo "fp8 build failed"; exit 1
fi
# Registers and spills of the kernel (ptxas -v), for the record.
# Every variant: fp8KernelILb<encode>ELi<variant index>E (0 v1, 1 b2, 2 b4), fp8TileKernelILb<encode>E.
grep -E "fp8Kernel|fp8TileKernel|registers|spill" "$OUT_DIR/build.log" | grep -B2 "registers" | tail -24 | tee "$OUT_DIR/ptxas.txt"

step "pytest -m gpu"
# From outside the source tree, so the installed package is what gets tested.
(cd "$OUT_DIR" && timeout -k 15 -s ABRT 300 python3 -X faulthandler -m pytest -m gpu -v -p no:cacheprovider --rootdir "$HERE" -c "$HERE/pyproject.toml" \
   "$HERE/tests" --junitxml=pytest-gpu.xml) > "$OUT_DIR/pytest-gpu.log" 2>&1 || status=1
tail -15 "$OUT_DIR/pytest-gpu.log"

step "compute-sanitizer memcheck"
if command -v compute-sanitizer > /dev/null && [[ -z "${KVCODEC_SKIP_MEMCHECK:-}" ]]; then
  (cd "$OUT_DIR" && timeout 240 compute-sanitizer --tool memcheck --error-exitcode 3 \
     python3 -m pytest -q -m gpu -p no:cacheprovider --rootdir "$HERE" -c "$HERE/pyproject.toml" \
     "$HERE/tests/test_fp8_gpu.py" -k "mixed and pinned and e4m3 or scalar_path or out_of_range or variant_on_the_scalar and deep-block or conformance_layouts and page_head-v1 or tile_hard_cases and (pinned-e4m3-page_head-tile-deep or unaligned_cold_base and tile-deep)") \
     > "$OUT_DIR/memcheck.log" 2>&1 || status=1
  grep -E "ERROR SUMMARY|passed|failed" "$OUT_DIR/memcheck.log" | tail -5
fi

step "compute-sanitizer racecheck (the tile kernel's shared memory)"
if command -v compute-sanitizer > /dev/null && [[ -z "${KVCODEC_SKIP_MEMCHECK:-}" ]]; then
  t="$HERE/tests/test_fp8_gpu.py::test_tile_hard_cases_write_the_cpu_blobs_and_decode_identically"
  (cd "$OUT_DIR" && timeout 120 compute-sanitizer --tool racecheck --error-exitcode 3 \
     python3 -m pytest -q -m gpu -p no:cacheprovider --rootdir "$HERE" -c "$HERE/pyproject.toml" \
     "$t[device-e4m3-page_head-tile]" "$t[device-e4m3-token_head-tile-deep-block]") \
     > "$OUT_DIR/racecheck.log" 2>&1 || status=1
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" "$OUT_DIR/racecheck.log" | tail -5
fi

fi

if [[ "$PHASE" != tests ]]; then
step "benchmark (default kernel, then the sweep of the tuning knobs)"
(cd "$OUT_DIR" && timeout -s INT 240 python3 "$HERE/bench/bench_fp8.py" --out-dir "$OUT_DIR") > "$OUT_DIR/bench.log" 2>&1 || status=1
grep -v '^\[bench\]' "$OUT_DIR/bench.log"
fi

step "done (status $status)"
exit $status
