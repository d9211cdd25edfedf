#!/usr/bin/env bash
# Real clients end to end: Claude Code, Codex CLI, opencode, Qwen Code,
# mini-swe-agent and the Python anthropic/openai SDKs talk to oceancode-proxy,
# which talks to the project's fake upstream.
# Everything stays on loopback; no real provider is ever contacted.
#
#   bash clients/run.sh [pytest args...]      e.g. -k codex, -x
#
# Installs the pinned clients (clients/install.sh: clients/package-lock.json,
# clients/requirements.txt) into clients/.deps, builds oceancode-proxy and oceancode-fakeup, runs the suite and
# prints `N passed, M failed` last; exits non-zero when anything failed.
#
# Environment:
#   OCEANCODE_CLIENTS_PROFILE  cargo profile of the binaries: dev (default) or release
#   OCEANCODE_CLIENTS_DEPS     where the clients are installed (default clients/.deps)
#   OCEANCODE_CLIENTS_TIMEOUT  seconds for the whole pytest run (default 1200)
#   OCEANCODE_LOG              proxy log filter (default info,oceancode_proxy=debug)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CL=$ROOT/clients
DEPS=${OCEANCODE_CLIENTS_DEPS:-$CL/.deps}
PROFILE=${OCEANCODE_CLIENTS_PROFILE:-dev}
WORK=$CL/.work
start=$(date +%s)

say() { printf '== clients: %s\n' "$*"; }
die() { printf 'clients/run.sh: %s\n' "$*" >&2; echo "0 passed, 1 failed"; exit 1; }

command -v node >/dev/null || die "node is required (Node 22+)"
command -v npm >/dev/null || die "npm is required"
PY=$(command -v python3 || true)
[ -n "$PY" ] || die "python3 is required"

# ---------------------------------------------------------------- binaries
say "build oceancode-proxy and oceancode-fakeup ($PROFILE)"
cargo build --locked --profile "$PROFILE" -p oceancode-proxy -p oceancode-fakeup
target_dir=${CARGO_TARGET_DIR:-$ROOT/target}
case $PROFILE in dev) bin_dir=$target_dir/debug ;; *) bin_dir=$target_dir/$PROFILE ;; esac
export OCEANCODE_BIN_DIR=$bin_dir

# ---------------------------------------------------------------- clients
# shellcheck source=clients/install.sh
. "$CL/install.sh"

# ---------------------------------------------------------------- run
rm -rf "$WORK"
mkdir -p "$WORK"
junit=$WORK/junit.xml
set +e
(cd "$CL" && timeout --kill-after=30 "${OCEANCODE_CLIENTS_TIMEOUT:-1200}" \
	"$PYRUN" -m pytest -q --basetemp="$WORK/tmp" --junitxml="$junit" "$@")
rc=$?
set -e
counts=$("$PYRUN" - "$junit" "$rc" <<'EOF'
import sys, xml.etree.ElementTree as ET
path, rc = sys.argv[1], int(sys.argv[2])
passed = failed = 0
try:
    for case in ET.parse(path).getroot().iter("testcase"):
        kinds = {c.tag for c in case}
        if kinds & {"failure", "error"}:
            failed += 1
        elif "skipped" not in kinds:
            passed += 1
except (OSError, ET.ParseError):
    pass
if rc != 0 and failed == 0:
    failed = 1  # pytest itself failed (collection error, timeout, crash)
print(passed, failed)
EOF
)
read -r passed failed <<<"$counts"
say "work files (logs, ledgers, tap records) in $WORK; took $(($(date +%s) - start))s"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$rc" -eq 0 ]
