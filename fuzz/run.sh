#!/usr/bin/env bash
# Run every fuzz target for a bounded time, starting from its checked-in
# corpus, and fail on the first crash, timeout or memory blow-up.
#   fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]     (default 60 s, all six)
# Needs the nightly toolchain and cargo-fuzz (.ci/run installs them).
# FUZZ_JOBS targets run at once (default: the core count); FUZZ_TARGET_DIR
# holds the build (default target/fuzz). New inputs go to a scratch corpus
# under it, never into fuzz/corpus/
# (minimize with `cargo fuzz cmin` and check in by hand); a crash is saved
# under target/fuzz-artifacts/<target>/ and is replayed by
# `cargo +nightly fuzz run <target> <file>`.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-60}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(sse splice window decode usage recall)
tdir="${FUZZ_TARGET_DIR:-$PWD/target/fuzz}"
bin="$tdir/x86_64-unknown-linux-gnu/release"

# Coverage instrumentation, no sanitizer (the code under test is safe Rust),
# debug assertions and overflow checks on.
cargo +nightly fuzz build --sanitizer none --debug-assertions --target-dir "$tdir"

declare -A max_len=([sse]=8192 [splice]=16384 [window]=4096 [decode]=4096 [usage]=8192 [recall]=1024)
# One target a core at a time (FUZZ_JOBS, default the core count): each is
# single-threaded, so two at once on two cores take half the wall time of
# one after the other, each still for its full SECONDS.
jobs=${FUZZ_JOBS:-$(nproc)}
run_target() {
  local t=$1
  local scratch="$tdir/scratch/$t" art="$PWD/target/fuzz-artifacts/$t/" log="$tdir/$t.log"
  mkdir -p "$scratch" "$art"
  if "$bin/$t" "$scratch" "fuzz/corpus/$t" \
      -max_total_time="$secs" -max_len="${max_len[$t]}" -timeout=10 -rss_limit_mb=2048 \
      -artifact_prefix="$art" -print_final_stats=1 >"$log" 2>&1; then
    local last execs rate cov
    last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
    execs=$(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}')
    rate=$(grep -E '^stat::average_exec_per_sec' "$log" | awk '{print $2}')
    cov=$(sed -nE 's/.* cov: ([0-9]+) ft: ([0-9]+) .*/edges \1, features \2/p' <<<"$last")
    echo "fuzz $t (${secs}s): ok, $execs execs ($rate/s), $cov"
  else
    echo "fuzz $t: FAILED; the end of its log ($log):"
    tail -40 "$log"
    ls -l "$art"
    return 1
  fi
}
status=0
names=()
for t in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
  out="$tdir/$t.out"
  (run_target "$t" >"$out" 2>&1; echo $? >"$out.rc") &
  names+=("$t")
done
wait
for t in "${names[@]}"; do
  cat "$tdir/$t.out"
  [ "$(cat "$tdir/$t.out.rc" 2>/dev/null || echo 1)" = 0 ] || status=1
done
exit $status
