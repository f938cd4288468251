#!/usr/bin/env bash
# Builds and checks the nvCOMP plugin on a GPU host, after the SDK is installed: GPU tests,
# compute-sanitizer passes and the benchmark. Logs and results go into OUT_DIR/nvcomp/.
#
#   plugins/kvcodec-nvcomp/scripts/gpu-check.sh OUT_DIR      (run from anywhere)
#
# Every step runs under `timeout` with its output capped (LOG_CAP bytes per log); a failing step
# sets the exit status and the script goes on with the next one. The limits are upper bounds
# (about 9 minutes in all); a healthy run takes a fraction of that.
#
# Offline hosts: wheels in <repo>/.whl/ (nvidia_libnvcomp_cu13-6.*.whl, lz4) are installed first.
#
# KVCODEC_GPU_PHASE=tests runs the install, the tests and the sanitizers only; =bench only the
# benchmark (the plugin installed by an earlier tests phase); unset or all: everything.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
PLUGIN="$ROOT/plugins/kvcodec-nvcomp"
OUT_DIR=$(mkdir -p "${1:?usage: gpu-check.sh OUT_DIR}/nvcomp" && cd "$1/nvcomp" && pwd)
export PYTHONUNBUFFERED=1
LOG_CAP=2000000
status=0
PHASE=${KVCODEC_GPU_PHASE:-all}
step() { echo "== nvcomp: $* ($(date +%T))"; }
case "$PHASE" in all|tests|bench) ;; *) echo "KVCODEC_GPU_PHASE is '$PHASE'; use all, tests or bench" >&2; exit 2 ;; esac

# run LOG SECONDS CMD...: runs CMD in OUT_DIR under timeout, output capped into LOG.
run() {
  local log=$1 limit=$2 rc
  shift 2
  (cd "$OUT_DIR" && timeout -k 10 "$limit" "$@") 2>&1 | head -c "$LOG_CAP" > "$OUT_DIR/$log"
  rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then
    status=1
    [ "$rc" -eq 124 ] && echo "$log: timed out after ${limit}s" || echo "$log: exit status $rc"
  fi
  return "$rc"
}

PYTEST=(python3 -m pytest -p no:cacheprovider --rootdir "$PLUGIN" -c "$PLUGIN/pyproject.toml" --tb=short)

if [[ "$PHASE" != bench ]]; then
step "install"
if compgen -G "$ROOT/.whl/*.whl" > /dev/null; then
  run wheels.log 60 python3 -m pip install -q --no-index --no-deps "$ROOT"/.whl/*.whl || tail -5 "$OUT_DIR/wheels.log"
fi
run build.log 150 python3 -m pip install --no-build-isolation --no-deps -v "$PLUGIN" || tail -30 "$OUT_DIR/build.log"
run list.txt 30 kvcodec list; cat "$OUT_DIR/list.txt"

step "pytest (CPU and GPU)"
run pytest.log 150 "${PYTEST[@]}" -v "$PLUGIN/tests" --junitxml=pytest.xml
grep -E "^(FAILED|ERROR)" "$OUT_DIR/pytest.log" | head -30
tail -3 "$OUT_DIR/pytest.log"

if command -v compute-sanitizer > /dev/null; then
  step "compute-sanitizer memcheck"
  run memcheck.log 60 compute-sanitizer --tool memcheck --error-exitcode 3 "${PYTEST[@]}" -q \
    "$PLUGIN/tests/test_nvcomp_gpu.py" -k "odd_layout or corrupted or did_not_fit or interchangeable"
  grep -E "ERROR SUMMARY|passed|failed" "$OUT_DIR/memcheck.log" | tail -5

  # initcheck: no uninitialized device bytes may reach nvCOMP or a blob (gdeflate's and ANS's batch
  # dependence), encode and decode.
  step "compute-sanitizer initcheck"
  run initcheck.log 45 compute-sanitizer --tool initcheck --error-exitcode 3 "${PYTEST[@]}" -q \
    "$PLUGIN/tests/test_nvcomp_gpu.py" -k "rest_of_the_call and staged and plain or round_trip and kv and default"
  grep -E "ERROR SUMMARY|passed|failed" "$OUT_DIR/initcheck.log" | tail -5
fi

fi

if [[ "$PHASE" != tests ]]; then
step "benchmark"
run bench.log 90 python3 "$PLUGIN/bench/bench_nvcomp.py" --budget-s 60 --json bench-nvcomp.json \
  --markdown bench-nvcomp.md
grep -v '^\[bench\]' "$OUT_DIR/bench.log" | head -40
grep -E "FAILED|skipped" "$OUT_DIR/bench.log" | head -10
fi

step "done (status $status)"
exit $status
