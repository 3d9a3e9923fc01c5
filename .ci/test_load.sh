#!/usr/bin/env bash
# Runs `make test` beside LOAD busy CPU-bound processes, as on a shared CI
# machine, and prints the wall time, make's exit status and the load averages
# (1, 5 and 15 min, from /proc/loadavg) at the start and at the end.
# The busy processes stop however `make test` ends (pass, fail, Ctrl-C).
#
#   .ci/test_load.sh [LOAD]      # or: make test-load LOAD=4
set -u

load=${1:-${LOAD:-4}}
case $load in
  '' | *[!0-9]*)
    echo "error: LOAD must be a whole number of busy processes, got '$load'" >&2
    exit 2
    ;;
esac
make=${MAKE:-make}

busy=()
stop_busy() {
  local pid
  for pid in "${busy[@]}"; do
    kill "$pid" 2>/dev/null
  done
  for pid in "${busy[@]}"; do
    wait "$pid" 2>/dev/null
  done
  busy=()
}
trap stop_busy EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

for _ in $(seq 1 "$load"); do
  # A shell loop: one core's worth of CPU each, no memory, no I/O.
  bash -c 'while :; do :; done' &
  busy+=("$!")
done

start_load=$(cut -d' ' -f1-3 /proc/loadavg)
start=$(date +%s)
echo "test-load: $load busy processes; load average at start $start_load" >&2
$make test
status=$?
end=$(date +%s)
end_load=$(cut -d' ' -f1-3 /proc/loadavg)
stop_busy
wall=$((end - start))
printf 'test-load: %d busy processes, wall time %dm%02ds, make test exit status %d, load average at start %s, at end %s\n' \
  "$load" $((wall / 60)) $((wall % 60)) "$status" "$start_load" "$end_load" >&2
exit "$status"
