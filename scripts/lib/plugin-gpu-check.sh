# Sourced (not run) by a plugin's scripts/gpu-check.sh in this repository, as
#
#   source "$(dirname "$0")/../../../scripts/lib/plugin-gpu-check.sh" NAME "${1:-}"
#
# with the plugin's codec NAME and the script's OUT_DIR argument (default ./gpu-results-NAME). It
# sets HERE (the plugin's folder), OUT_DIR (created, absolute), PHASE (KVCODEC_GPU_PHASE: all,
# tests or bench; anything else ends the script with status 2) and status=0, exports
# PYTHONUNBUFFERED and KVCODEC_CUDA_ARCHITECTURES (default 90-real), and defines step, which
# prints "== NAME: <what> (time)".
set -uo pipefail
GPU_CHECK_NAME=$1
HERE=$(cd "$(dirname "${BASH_SOURCE[1]}")/.." && pwd)
OUT_DIR=${2:-gpu-results-$GPU_CHECK_NAME}
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
export PYTHONUNBUFFERED=1
export KVCODEC_CUDA_ARCHITECTURES=${KVCODEC_CUDA_ARCHITECTURES:-90-real}
status=0
PHASE=${KVCODEC_GPU_PHASE:-all}
step() { echo "== $GPU_CHECK_NAME: $* ($(date +%T))"; }
case "$PHASE" in all|tests|bench) ;; *) echo "KVCODEC_GPU_PHASE is '$PHASE'; use all, tests or bench" >&2; exit 2 ;; esac
