#!/usr/bin/env bash
# Instruction counts of the request path (valgrind --tool=callgrind): the
# release proxy serves one 200 KB session of 2,001 messages on loopback (a
# cold first request, then N warm steps, from oceancode-load), counting only
# inside SessionManager::prepare_request and provider_request. Counts are
# repeatable whatever else the machine does; one warm step is the difference
# of two runs (N=10 and N=30) over 20. See docs/benchmarks.md (fourth pass).
#
#   bench/callgrind.sh [PROXY_BINARY]      # N=30 by default
#   SIZE=8m N=2 bench/callgrind.sh         # another body size (default 200k)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${CARGO_TARGET_DIR:-$PWD/target}/release
PROXY=${1:-$BIN/oceancode-proxy}
N=${N:-30}
SIZE=${SIZE:-200k}
W=$(mktemp -d "${TMPDIR:-/tmp}/oceancode-cg.XXXXXX")
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$W"' EXIT
OCEANCODE_ADMIN_TOKEN=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
export OCEANCODE_ADMIN_TOKEN
"$BIN/oceancode-fakeup" --listen 127.0.0.1:0 >"$W/fake.out" 2>"$W/fake.err" &
PIDS+=($!)
for _ in $(seq 1 200); do FAKE=$(sed -n 's/^listening on //p' "$W/fake.out"); [ -n "$FAKE" ] && break; sleep 0.05; done
PORT=$("$BIN/oceancode-load" free-port)
echo '{}' >"$W/config.json"
OUTFILE=${OUTFILE:-callgrind.out.prepare-$N}
valgrind --tool=callgrind --callgrind-out-file="$OUTFILE" --collect-atstart=no \
    --toggle-collect='*prepare_request*' --toggle-collect='*provider_request*' \
    "$PROXY" --config "$W/config.json" --data-dir "$W/data" serve --listen "127.0.0.1:$PORT" \
    --anthropic-upstream "$FAKE" --openai-upstream "$FAKE" --tideline 100m >"$W/proxy.log" 2>&1 &
VG=$!
PIDS+=($VG)
for _ in $(seq 1 1200); do (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.1; done
"$BIN/oceancode-load" run --target "http://127.0.0.1:$PORT" --label callgrind --scenario callgrind \
    --size "$SIZE" --messages 2000 --concurrency 1 --requests "$N" --model oceancode-bench --out "$W/load.jsonl" >&2
kill -INT "$VG"
wait "$VG" || true
callgrind_annotate --inclusive=yes "$OUTFILE" | grep -E 'PROGRAM TOTALS|prepare_request \[' | head -2
