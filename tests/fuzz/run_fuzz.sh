#!/usr/bin/env bash
# tests/fuzz/run_fuzz.sh: runs one libFuzzer target for a bounded time over a temp copy of its seed corpus; one-line result.
# usage: run_fuzz.sh BINARY CORPUS_DIR ARTIFACT_DIR [SECONDS]   (SECONDS default: $FUZZ_SECONDS, else 10)
# Exit 0 when no crash, leak, timeout or sanitizer report; otherwise non-zero with the reproducer's path printed.
set -u
bin=${1:?binary}; corpus=${2:?corpus dir}; artifacts=${3:?artifact dir}
secs=${4:-${FUZZ_SECONDS:-10}}
name=$(basename "$bin")
case "$secs" in ''|*[!0-9]*) echo "$name: FAIL bad seconds '$secs'"; exit 2;; esac
[ -x "$bin" ] || { echo "$name: FAIL no executable $bin"; exit 2; }
work=$(mktemp -d "${TMPDIR:-/tmp}/dserve-fuzz-$name.XXXXXX") || exit 2
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/corpus" "$artifacts" || exit 2
[ -d "$corpus" ] && cp -R "$corpus/." "$work/corpus/" 2>/dev/null
seeds=$(find "$work/corpus" -type f | wc -l)
log="$artifacts/$name.log"
# -timeout: one input running longer than 10 s is a hang (reported like a crash); -rss_limit_mb bounds memory.
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1} \
UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$(cd "$(dirname "$0")" && pwd)/../lsan/suppressions.txt} \
  "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="$artifacts/$name-" "$work/corpus" >"$log" 2>&1
rc=$?
runs=$(grep -o 'Done [0-9]* runs' "$log" | tail -1 | awk '{print $2}')
cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | awk '{print $2}')
if [ $rc -eq 0 ]; then
  echo "$name: ok, ${runs:-?} runs in ${secs}s from $seeds seeds, cov ${cov:-?}"
  exit 0
fi
crash=$(grep -o "Test unit written to [^ ]*" "$log" | tail -1 | sed 's/Test unit written to //')
echo "$name: FAIL (exit $rc) after ${runs:-?} runs; reproducer: ${crash:-none written}; log: $log"
grep -E '^(==[0-9]+==ERROR|SUMMARY|.*runtime error|fuzz_)' "$log" | head -5 | sed "s/^/  $name: /"
[ -n "$crash" ] && echo "  reproduce: $bin $crash"
exit 1
