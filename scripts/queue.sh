# Sourced by the reproduction scripts: run_jobs N FILE FUNC calls `FUNC LINE` for each line of FILE,
# N at a time. Queue q is pinned to core q with taskset (when present; children inherit it), so that
# each job runs with one libtorch thread and one BLAS thread (drmas gives BLAS one thread per core it
# may use). Each queue takes the next line as it frees up (a counter file under flock).
run_jobs() {
  local n=$1 file=$2 fn=$3 q counter
  counter=$(mktemp "${TMPDIR:-/tmp}/drmas-queue.XXXXXX")
  echo 0 > "$counter"
  for ((q = 0; q < n; q++)); do
    (
      command -v taskset > /dev/null && taskset -pc $((q % $(nproc))) $BASHPID > /dev/null
      while :; do
        i=$(flock "$counter" bash -c 'n=$(cat "$1"); echo $((n + 1)) > "$1"; echo "$n"' _ "$counter")
        line=$(sed -n "$((i + 1))p" "$file")
        [ -n "$line" ] || break
        "$fn" "$line"
      done
    ) &
  done
  wait
  rm -f "$counter"
}
