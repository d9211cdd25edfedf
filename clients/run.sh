#!/usr/bin/env bash
# Real clients end to end: Claude Code, Codex CLI and the Python anthropic/openai
# SDKs talk to oceancode-proxy, which talks to the project's fake upstream.
# Everything stays on loopback; no real provider is ever contacted.
#
#   bash clients/run.sh [pytest args...]      e.g. -k codex, -x
#
# Installs the pinned clients (clients/package-lock.json, clients/requirements.txt)
# into clients/.deps, builds oceancode-proxy and oceancode-fakeup, runs the suite and
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

command -v node >/dev/null || die "node is required (Node 20+)"
command -v npm >/dev/null || die "npm is required"
PY=$(command -v python3 || true)
[ -n "$PY" ] || die "python3 is required"

# ---------------------------------------------------------------- binaries
say "build oceancode-proxy and oceancode-fakeup ($PROFILE)"
cargo build --locked --profile "$PROFILE" -p oceancode-proxy -p oceancode-fakeup
case $PROFILE in dev) bin_dir=$ROOT/target/debug ;; *) bin_dir=$ROOT/target/$PROFILE ;; esac
export OCEANCODE_BIN_DIR=$bin_dir

# ---------------------------------------------------------------- npm clients
want_cc=$(node -p "require('$CL/package.json').dependencies['@anthropic-ai/claude-code']")
want_codex=$(node -p "require('$CL/package.json').dependencies['@openai/codex']")
NODE_DIR=$DEPS/node
export OCEANCODE_NODE_BIN=$NODE_DIR/node_modules/.bin
have_versions() {
	[ -x "$OCEANCODE_NODE_BIN/claude" ] && [ -x "$OCEANCODE_NODE_BIN/codex" ] || return 1
	HOME=$DEPS/home timeout 60 "$OCEANCODE_NODE_BIN/claude" --version 2>/dev/null | grep -qF "$want_cc" || return 1
	HOME=$DEPS/home timeout 60 "$OCEANCODE_NODE_BIN/codex" --version 2>/dev/null | grep -qF "$want_codex" || return 1
}
mkdir -p "$NODE_DIR" "$DEPS/home"
if have_versions; then
	say "npm clients already installed (claude-code $want_cc, codex $want_codex)"
else
	say "install @anthropic-ai/claude-code@$want_cc @openai/codex@$want_codex (npm ci)"
	cp "$CL/package.json" "$CL/package-lock.json" "$NODE_DIR/"
	(cd "$NODE_DIR" && npm ci --no-audit --no-fund --loglevel=error)
	# Claude Code's postinstall puts its native binary in place of bin/claude.exe;
	# run it explicitly in case this npm skipped install scripts.
	if ! HOME=$DEPS/home timeout 60 "$OCEANCODE_NODE_BIN/claude" --version >/dev/null 2>&1; then
		(cd "$NODE_DIR/node_modules/@anthropic-ai/claude-code" && node install.cjs)
	fi
	have_versions || die "the installed clients do not report claude-code $want_cc / codex $want_codex"
fi

# ---------------------------------------------------------------- python SDKs
# A venv in clients/.deps; without the venv module (Debian without python3-venv),
# a plain --target install used through PYTHONPATH.
VENV=$DEPS/venv
if [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV" >/dev/null 2>&1; then
	PYRUN=$VENV/bin/python
	"$PYRUN" -m pip install --disable-pip-version-check -q -r "$CL/requirements.txt" ||
		die "pip install -r clients/requirements.txt failed"
else
	say "python3 -m venv is unavailable; installing into $DEPS/pylib"
	rm -rf "$VENV"
	"$PY" -m pip install --disable-pip-version-check -q --upgrade --target "$DEPS/pylib" -r "$CL/requirements.txt" ||
		die "pip install --target failed"
	export PYTHONPATH=$DEPS/pylib${PYTHONPATH:+:$PYTHONPATH}
	PYRUN=$PY
fi
"$PYRUN" - <<'EOF2'
import sys, anthropic, openai, pytest
print(f"== clients: python {sys.version.split()[0]}, anthropic {anthropic.__version__}, openai {openai.__version__}, pytest {pytest.__version__}")
EOF2
say "node $(node --version), claude-code $("$OCEANCODE_NODE_BIN/claude" --version 2>/dev/null | head -1), $("$OCEANCODE_NODE_BIN/codex" --version 2>/dev/null | head -1)"

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
