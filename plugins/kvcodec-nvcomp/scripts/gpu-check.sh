#!/usr/bin/env bash
# Builds and checks the nvCOMP plugin on a GPU host, after the SDK is installed: GPU tests, a
# memcheck pass and the benchmark. Logs and results go into OUT_DIR/nvcomp/.
#
#   plugins/kvcodec-nvcomp/scripts/gpu-check.sh OUT_DIR      (run from anywhere)
#
# Offline hosts: wheels in <repo>/.whl/ (nvidia_libnvcomp_cu13-6.*.whl, lz4) are installed first.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
PLUGIN="$ROOT/plugins/kvcodec-nvcomp"
OUT_DIR=$(mkdir -p "${1:?usage: gpu-check.sh OUT_DIR}/nvcomp" && cd "$1/nvcomp" && pwd)
export PYTHONUNBUFFERED=1
status=0
step() { echo "== nvcomp: $* ($(date +%T))"; }

step "install"
if compgen -G "$ROOT/.whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps "$ROOT"/.whl/*.whl > "$OUT_DIR/wheels.log" 2>&1 \
    || { tail -20 "$OUT_DIR/wheels.log"; echo "installing .whl/ failed"; exit 1; }
fi
if ! python3 -m pip install --no-build-isolation --no-deps -v "$PLUGIN" > "$OUT_DIR/build.log" 2>&1; then
  tail -40 "$OUT_DIR/build.log"; echo "plugin build failed"; exit 1
fi
(cd "$OUT_DIR" && kvcodec list) | tee "$OUT_DIR/list.txt"

step "pytest (CPU and GPU)"
(cd "$OUT_DIR" && python3 -m pytest -v -p no:cacheprovider --rootdir "$PLUGIN" -c "$PLUGIN/pyproject.toml" \
   "$PLUGIN/tests" --junitxml=pytest.xml) > "$OUT_DIR/pytest.log" 2>&1 || status=1
tail -15 "$OUT_DIR/pytest.log"

step "compute-sanitizer memcheck"
if command -v compute-sanitizer > /dev/null; then
  (cd "$OUT_DIR" && timeout 200 compute-sanitizer --tool memcheck --error-exitcode 3 \
     python3 -m pytest -q -p no:cacheprovider --rootdir "$PLUGIN" -c "$PLUGIN/pyproject.toml" "$PLUGIN/tests/test_nvcomp_gpu.py" \
     -k "odd_layout or corrupted or did_not_fit or interchangeable") > "$OUT_DIR/memcheck.log" 2>&1 || status=1
  grep -E "ERROR SUMMARY|passed|failed" "$OUT_DIR/memcheck.log" | tail -5
fi

step "benchmark"
(cd "$OUT_DIR" && timeout 300 python3 "$PLUGIN/bench/bench_nvcomp.py" --json bench-nvcomp.json \
   --markdown bench-nvcomp.md) > "$OUT_DIR/bench.log" 2>&1 || status=1
grep -v '^\[bench\]' "$OUT_DIR/bench.log"

step "done (status $status)"
exit $status
