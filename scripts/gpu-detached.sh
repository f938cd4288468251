#!/usr/bin/env bash
# Runs scripts/gpu-check.sh detached from the calling shell, so a full check outlives a caller
# whose commands are time-limited, and hands back what it has written so far as one bounded
# archive.
#
#   scripts/gpu-detached.sh start WAIT_S DEST_DIR   launch the check, then wait up to WAIT_S s
#   scripts/gpu-detached.sh wait  WAIT_S DEST_DIR   wait up to WAIT_S s more for a launched check
#
# Either way it prints the check's progress log and writes DEST_DIR/results.tgz: every result
# file, a file over 4 MiB cut to its last 4 MiB. KVCODEC_GPU_STEPS selects the steps as for
# gpu-check.sh; results go to $KVCODEC_GPU_RESULTS (default /tmp/kvcodec-gpu).
set -uo pipefail
mode=${1:?usage: gpu-detached.sh start|wait WAIT_S DEST_DIR}
wait_s=${2:?usage: gpu-detached.sh start|wait WAIT_S DEST_DIR}
dest=${3:?usage: gpu-detached.sh start|wait WAIT_S DEST_DIR}
results=${KVCODEC_GPU_RESULTS:-/tmp/kvcodec-gpu}
root=$(cd "$(dirname "$0")/.." && pwd)

case "$mode" in
  start)
    mkdir -p "$results"
    rm -f "$results/.status"
    # A new session: the check is not ended with the calling command.
    setsid nohup bash -c 'bash "$1/scripts/gpu-check.sh" "$2" > "$2/main.log" 2>&1; echo $? > "$2/.status"' \
      _ "$root" "$results" < /dev/null > /dev/null 2>&1 &
    ;;
  wait) ;;
  *) echo "mode must be start or wait, got '$mode'" >&2; exit 2 ;;
esac

end=$((SECONDS + wait_s))
while [[ ! -e "$results/.status" && $SECONDS -lt $end ]]; do sleep 5; done

pack=$(mktemp -d)
(cd "$results" && find . -type f ! -name '.status' -print0) | while IFS= read -r -d '' f; do
  mkdir -p "$pack/results/$(dirname "$f")"
  if [[ $(stat -c %s "$results/$f") -gt $((4 << 20)) ]]; then
    tail -c $((4 << 20)) "$results/$f" > "$pack/results/$f.tail"
  else
    cp "$results/$f" "$pack/results/$f"
  fi
done
mkdir -p "$dest"
tar czf "$dest/results.tgz" -C "$pack" results
rm -rf "$pack"
cat "$results/main.log" 2> /dev/null
if [[ -e "$results/.status" ]]; then
  echo "== check finished, status $(cat "$results/.status")"
else
  echo "== check still running: call 'scripts/gpu-detached.sh wait ...' again"
fi
