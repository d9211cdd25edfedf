#!/usr/bin/env bash
# oceancode-proxy benchmarks: overhead against a direct connection and nginx,
# scale, the ledger writer and export, and the context-efficiency simulator.
# Everything runs on loopback and stops by itself. See docs/benchmarks.md.
#
#   bench/run.sh [full|quick] [overhead] [scale] [ledger] [sim] [criterion] [fleet]
#
# BASELINE=DIR (a folder holding an earlier build's oceancode-proxy and
# oceancode-ledger-bench) adds that build as one more target,
# `oceancode-proxy@before`, run in the same rounds: before and after side by
# side in one run.
#
# `fleet` (issue 17: one vs two proxies on one PostgreSQL ledger behind
# nginx) needs Debian's postgresql and nginx; it starts its own cluster.
#
# SCENARIOS="200k-c1 200k-c64" runs only the overhead scenarios named
# (default: all four: 200k-c1 200k-c64 8m-c1 8m-c64).
#
# With no section named, all but `criterion` and `fleet` run. `quick` shrinks every
# request count (a smoke run, a few minutes); `full` is what
# docs/benchmarks.md reports. The report (Markdown) is written to
# $OUT/report.md (default target/bench/) and printed.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
MODE=full
SECTIONS=()
for a in "$@"; do
    case "$a" in
        full | quick) MODE=$a ;;
        overhead | scale | ledger | sim | criterion | fleet) SECTIONS+=("$a") ;;
        -h | --help) sed -n '2,22p' "$0"; exit 0 ;;
        *) echo "unknown argument: $a" >&2; exit 2 ;;
    esac
done
[ ${#SECTIONS[@]} -eq 0 ] && SECTIONS=(overhead scale ledger sim)
want() { [[ " ${SECTIONS[*]} " == *" $1 "* ]]; }

TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=$TARGET_DIR/release
OUT=${OUT:-$TARGET_DIR/bench}
mkdir -p "$OUT"
REPORT=$OUT/report.md
RESULTS=$OUT/load-$(date +%Y%m%d-%H%M%S).jsonl
WORK=$(mktemp -d "${TMPDIR:-/tmp}/oceancode-bench.XXXXXX")
PIDS=()

cleanup() {
    for p in "${PIDS[@]}"; do
        kill "$p" 2>/dev/null || true
    done
    for p in "${PIDS[@]}"; do
        wait "$p" 2>/dev/null || true
    done
    rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

log() { printf '\n== %s\n' "$*" >&2; }

log "building release binaries"
cargo build --release -p oceancode-proxy -p oceancode-fakeup -p oceancode-bench >&2

NGINX=$(command -v nginx || true)
if [ -z "$NGINX" ] && { want overhead || want fleet; } && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    log "installing nginx (Debian package nginx-light)"
    apt-get install -y -qq nginx-light >&2 || apt-get install -y -qq nginx >&2 || true
    NGINX=$(command -v nginx || true)
fi
[ -z "$NGINX" ] && [ -x /usr/sbin/nginx ] && NGINX=/usr/sbin/nginx

free_port() { "$BIN/oceancode-load" free-port; }

wait_port() { # wait until 127.0.0.1:$1 accepts connections (10 s)
    for _ in $(seq 1 200); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
        sleep 0.05
    done
    echo "nothing listens on port $1" >&2
    return 1
}

stop() { # stop one process we started
    local p=$1
    kill "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
    local keep=()
    for q in "${PIDS[@]}"; do [ "$q" = "$p" ] || keep+=("$q"); done
    PIDS=("${keep[@]}")
}

# start_fakeup → FAKE_PID, FAKE_URL
start_fakeup() {
    local out=$WORK/fakeup.$RANDOM.out
    : >"$out"
    "$BIN/oceancode-fakeup" --listen 127.0.0.1:0 >"$out" 2>"$out.err" &
    FAKE_PID=$!
    PIDS+=("$FAKE_PID")
    for _ in $(seq 1 200); do
        FAKE_URL=$(sed -n 's/^listening on //p' "$out")
        [ -n "$FAKE_URL" ] && return 0
        sleep 0.05
    done
    echo "fakeup did not start: $(cat "$out.err")" >&2
    return 1
}

# start_nginx UPSTREAM_URL... → NGINX_PID, NGINX_URL. With several
# upstreams, requests are routed by their session key (consistent hashing,
# as docs/deploy.md sets up a fleet).
start_nginx() {
    local port dir u servers="" hash=""
    for u in "$@"; do servers+="        server ${u#http://};"$'\n'; done
    [ $# -gt 1 ] && hash="        hash \$http_x_oceancode_session consistent;"
    port=$(free_port)
    dir=$WORK/nginx.$port
    mkdir -p "$dir/tmp"
    local user=""
    [ "$(id -u)" = 0 ] && user="user $(id -un) $(id -gn);"
    cat >"$dir/nginx.conf" <<EOF
$user
worker_processes auto;
daemon off;
master_process on;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $dir/tmp/body;
    proxy_temp_path $dir/tmp/proxy;
    fastcgi_temp_path $dir/tmp/fastcgi;
    uwsgi_temp_path $dir/tmp/uwsgi;
    scgi_temp_path $dir/tmp/scgi;
    client_max_body_size 64m;
    keepalive_requests 1000000;
    keepalive_timeout 120s;
    upstream fake {
$hash
$servers        keepalive 256;
    }
    server {
        listen 127.0.0.1:$port;
        location / {
            proxy_pass http://fake;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            # The client's Host (127.0.0.1:PORT): oceancode-proxy refuses a
            # name that is not this machine's (DNS rebinding).
            proxy_set_header Host \$http_host;
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 600s;
            proxy_send_timeout 600s;
        }
    }
}
EOF
    "$NGINX" -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" &
    NGINX_PID=$!
    PIDS+=("$NGINX_PID")
    NGINX_URL=http://127.0.0.1:$port
    wait_port "$port"
}

# start_proxy UPSTREAM_URL [BINARY [serve args...]] → PROXY_PID, PROXY_URL
start_proxy() {
    local port dir up=$1 exe=${2:-$BIN/oceancode-proxy}
    shift; [ $# -gt 0 ] && shift
    port=$(free_port)
    dir=$WORK/proxy.$port
    mkdir -p "$dir"
    echo '{}' >"$dir/config.json"
    # A 100M fixed line on a model unknown to the table: nothing is ever cut,
    # so the upstream does the same work on every target (pure overhead).
    "$exe" --config "$dir/config.json" --data-dir "$dir/data" serve \
        --listen "127.0.0.1:$port" --anthropic-upstream "$up" --openai-upstream "$up" \
        --tideline 100m "$@" >"$dir/proxy.log" 2>&1 &
    PROXY_PID=$!
    PIDS+=("$PROXY_PID")
    PROXY_URL=http://127.0.0.1:$port
    wait_port "$port"
}

BASELINE=${BASELINE:-}
if [ -n "$BASELINE" ] && [ ! -x "$BASELINE/oceancode-proxy" ]; then
    echo "BASELINE=$BASELINE holds no oceancode-proxy" >&2
    exit 2
fi
PROXIES=()
[ -n "$BASELINE" ] && PROXIES+=(oceancode-proxy@before)
PROXIES+=(oceancode-proxy)
# proxy_exe TARGET: the binary a proxy target runs.
proxy_exe() { if [ "$1" = oceancode-proxy@before ]; then echo "$BASELINE/oceancode-proxy"; else echo "$BIN/oceancode-proxy"; fi; }

MODEL=oceancode-bench
# The proxy's admin API (settle, /metrics) needs a token: one for this run,
# used by the proxies started here and by oceancode-load.
OCEANCODE_ADMIN_TOKEN=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
export OCEANCODE_ADMIN_TOKEN

# overhead_scenario NAME SIZE CONCURRENCY REQUESTS ROUNDS [extra load args...]
# The REQUESTS are split over ROUNDS; each round runs every target once, in
# turn, so a slow spell of the machine lands on all of them alike (the report
# takes the median of the rounds' paired differences).
overhead_scenario() {
    local name=$1 size=$2 conc=$3 reqs=$4 rounds=$5
    if [ -n "${SCENARIOS:-}" ] && [[ " $SCENARIOS " != *" $name "* ]]; then
        return 0
    fi
    shift 5
    local targets=(direct)
    [ -n "$NGINX" ] && targets+=(nginx)
    targets+=("${PROXIES[@]}")
    local round t
    for round in $(seq 1 "$rounds"); do
    for t in "${targets[@]}"; do
        log "overhead $name (round $round/$rounds): $t"
        start_fakeup
        local url pids=() admin=()
        case $t in
            direct) url=$FAKE_URL ;;
            nginx) start_nginx "$FAKE_URL"; url=$NGINX_URL; pids=(--pid "$NGINX_PID") ;;
            oceancode-proxy*)
                start_proxy "$FAKE_URL" "$(proxy_exe "$t")"
                url=$PROXY_URL
                pids=(--pid "$PROXY_PID")
                admin=(--admin "$PROXY_URL")
                ;;
        esac
        "$BIN/oceancode-load" run --target "$url" --label "$t" --scenario "$name" \
            --size "$size" --messages 2000 --concurrency "$conc" --requests $((reqs / rounds)) \
            --model "$MODEL" "${pids[@]}" "${admin[@]}" --out "$RESULTS" "$@" >&2
        case $t in
            nginx) stop "$NGINX_PID" ;;
            oceancode-proxy*) stop "$PROXY_PID" ;;
        esac
        stop "$FAKE_PID"
    done
    done
}

scale_run() {
    local steps=$1 sessions=$2
    for t in direct "${PROXIES[@]}"; do
        log "scale: $t"
        start_fakeup
        local url pids=() admin=()
        if [ "$t" = direct ]; then
            url=$FAKE_URL
        else
            start_proxy "$FAKE_URL" "$(proxy_exe "$t")"
            url=$PROXY_URL
            pids=(--pid "$PROXY_PID")
            admin=(--admin "$PROXY_URL")
        fi
        "$BIN/oceancode-load" scale --target "$url" --label "$t" --scenario scale \
            --size 200k --messages 2000 --sessions "$sessions" --steps "$steps" --buckets 4 \
            --model "$MODEL" "${pids[@]}" "${admin[@]}" --out "$RESULTS" >&2
        [ "$t" != direct ] && stop "$PROXY_PID"
        stop "$FAKE_PID"
    done
}

{
    echo "# oceancode-proxy benchmarks ($MODE, $(date -u +%Y-%m-%dT%H:%MZ))"
    echo
    echo "Machine: $(nproc) CPU, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo); $(uname -sr)"
    [ -n "$NGINX" ] && echo "nginx: $("$NGINX" -v 2>&1 | sed 's/^nginx version: //')"
    echo
} >"$REPORT"

if want overhead; then
    [ -z "$NGINX" ] && echo "nginx not found: the nginx rows are skipped" >&2
    if [ "$MODE" = quick ]; then
        overhead_scenario 200k-c1 200k 1 200 2
        overhead_scenario 200k-c64 200k 64 640 1
        overhead_scenario 8m-c1 8m 1 10 1
        overhead_scenario 8m-c64 8m 64 64 1 --max-steps 1
    else
        overhead_scenario 200k-c1 200k 1 2000 5
        overhead_scenario 200k-c64 200k 64 6400 3
        overhead_scenario 8m-c1 8m 1 100 5
        overhead_scenario 8m-c64 8m 64 256 3
    fi
fi

if want scale; then
    if [ "$MODE" = quick ]; then scale_run 20 100; else scale_run 200 100; fi
fi

# fleet_run REQUESTS ROUNDS: 200 KB steps at c=64 through nginx to one
# proxy on SQLite, one on PostgreSQL and two on one PostgreSQL database
# (each round every target in turn, each on a fresh fake upstream and, for
# PostgreSQL, a fresh database of one fsync=on cluster).
fleet_run() {
    local reqs=$1 rounds=$2 round t n i
    [ -z "$NGINX" ] && { echo "nginx not found: the fleet section is skipped" >&2; return 0; }
    # Its own folder under /tmp: the server runs as `postgres` (pg.sh, as
    # root), which cannot enter $WORK (0700).
    local pg url
    pg=$(mktemp -d /tmp/oceancode-bench-pg.XXXXXX)
    PG_OPTS="-c fsync=on -c shared_buffers=256MB" bash "$ROOT/.ci/pg.sh" start "$pg" >"$WORK/pg.url" \
        || { echo "no PostgreSQL server: the fleet section is skipped (see $pg)" >&2; return 0; }
    url=$(cat "$WORK/pg.url")
    for round in $(seq 1 "$rounds"); do
    for t in "sqlite x1" "postgres x1" "postgres x2"; do
        log "fleet (round $round/$rounds): $t"
        start_fakeup
        local urls=() pids=() admin=() db=() ids=()
        n=${t##*x}
        if [ "${t%% *}" = postgres ]; then
            local name="fleet_${round}_$n"
            psql -q "$url" -c "CREATE DATABASE $name" >&2
            db=(--database "${url%/*}/$name")
        fi
        for i in $(seq 1 "$n"); do
            start_proxy "$FAKE_URL" "$BIN/oceancode-proxy" "${db[@]}"
            urls+=("$PROXY_URL"); ids+=("$PROXY_PID")
            pids+=(--pid "$PROXY_PID"); admin+=(--admin "$PROXY_URL")
        done
        start_nginx "${urls[@]}"
        "$BIN/oceancode-load" run --target "$NGINX_URL" --label "nginx → $t" --scenario fleet-200k-c64 \
            --size 200k --messages 2000 --concurrency 64 --requests $((reqs / rounds)) \
            --model "$MODEL" "${pids[@]}" "${admin[@]}" --out "$RESULTS" >&2
        stop "$NGINX_PID"
        for i in "${ids[@]}"; do stop "$i"; done
        stop "$FAKE_PID"
    done
    done
    bash "$ROOT/.ci/pg.sh" stop "$pg" >&2 || true
}

if want fleet; then
    if [ "$MODE" = quick ]; then fleet_run 640 1; else fleet_run 6400 3; fi
fi

if { want overhead || want scale || want fleet; } && [ -s "$RESULTS" ]; then
    "$BIN/oceancode-load" report "$RESULTS" >>"$REPORT"
fi

if want ledger; then
    ledger_args=()
    [ "$MODE" = quick ] && ledger_args=(--sessions 20 --steps 5 --export-rows 2000 --repeat 2)
    # With a baseline, the two builds alternate over two rounds.
    ledger_runs=("$BIN")
    [ -n "$BASELINE" ] && ledger_runs=("$BASELINE" "$BIN" "$BASELINE" "$BIN")
    for dir in "${ledger_runs[@]}"; do
        log "ledger ($dir)"
        rm -rf "$WORK/ledger"
        if [ -n "$BASELINE" ]; then
            if [ "$dir" = "$BASELINE" ]; then echo "#### Ledger: oceancode-proxy@before" >>"$REPORT"; else echo "#### Ledger: oceancode-proxy" >>"$REPORT"; fi
            echo >>"$REPORT"
        fi
        "$dir/oceancode-ledger-bench" --data-dir "$WORK/ledger" "${ledger_args[@]}" | sed '/^Machine:/d; /^Data dir:/d' >>"$REPORT"
    done
fi

if want sim; then
    log "simulator"
    mkdir -p "$ROOT/docs/img"
    SWEEP="0,2,5,10,15,20,25,35,50/500/70,35,20"
    LINES="10,12.5,15,20,25,30,40"
    "$BIN/oceancode-sim" --steps 1000 --svg "$ROOT/docs/img/window.svg" \
        --compress "$SWEEP" --compress-svg "$ROOT/docs/img/compress.svg" \
        --lines "$LINES" --lines-svg "$ROOT/docs/img/lines.svg" >>"$REPORT"
    "$BIN/oceancode-sim" --steps 1000 --model claude-sonnet-4-6 --svg "$ROOT/docs/img/window-1m.svg" \
        --compress "$SWEEP" --compress-svg "$ROOT/docs/img/compress-1m.svg" \
        --lines "$LINES" --lines-svg "$ROOT/docs/img/lines-1m.svg" >>"$REPORT"
fi

if want criterion; then
    log "criterion (cargo bench -p oceancode-proxy --bench overhead)"
    cargo bench -p oceancode-proxy --bench overhead 2>&1 | tee "$OUT/criterion.txt" >&2
    {
        echo "### Criterion: request path on the CPU (cargo bench -p oceancode-proxy --bench overhead)"
        echo
        echo '```'
        awk '/^(request_path|parts)\// { name = $1 } /time:/ { sub(/.*time:[[:space:]]*/, ""); print name "  " $0 }' "$OUT/criterion.txt"
        echo '```'
    } >>"$REPORT"
fi

cat "$REPORT"
echo >&2
echo "report: $REPORT; raw results: $RESULTS" >&2
