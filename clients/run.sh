#!/usr/bin/env bash
# Real clients end to end: Claude Code, Codex CLI, opencode, Qwen Code,
# mini-swe-agent and the Python anthropic/openai SDKs talk to oceancode-proxy,
# which talks to the project's fake upstream.
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

command -v node >/dev/null || die "node is required (Node 22+)"
command -v npm >/dev/null || die "npm is required"
PY=$(command -v python3 || true)
[ -n "$PY" ] || die "python3 is required"

# ---------------------------------------------------------------- binaries
say "build oceancode-proxy and oceancode-fakeup ($PROFILE)"
cargo build --locked --profile "$PROFILE" -p oceancode-proxy -p oceancode-fakeup
case $PROFILE in dev) bin_dir=$ROOT/target/debug ;; *) bin_dir=$ROOT/target/$PROFILE ;; esac
export OCEANCODE_BIN_DIR=$bin_dir

# ---------------------------------------------------------------- npm clients
want() { node -p "require('$CL/package.json').dependencies['$1']"; }
want_cc=$(want @anthropic-ai/claude-code)
want_codex=$(want @openai/codex)
want_opencode=$(want opencode-ai)
want_qwen=$(want @qwen-code/qwen-code)
NODE_DIR=$DEPS/node
export OCEANCODE_NODE_BIN=$NODE_DIR/node_modules/.bin
# `<bin> --version` prints the pinned version (HOME: the clients' own, so
# nothing of the host's config is read).
has_version() {
	[ -x "$OCEANCODE_NODE_BIN/$1" ] &&
		HOME=$DEPS/home timeout 60 "$OCEANCODE_NODE_BIN/$1" --version 2>/dev/null | grep -qF "$2"
}
have_versions() {
	has_version claude "$want_cc" && has_version codex "$want_codex" &&
		has_version opencode "$want_opencode" && has_version qwen "$want_qwen"
}
mkdir -p "$NODE_DIR" "$DEPS/home"
if have_versions; then
	say "npm clients already installed (claude-code $want_cc, codex $want_codex, opencode $want_opencode, qwen-code $want_qwen)"
else
	say "install claude-code $want_cc, codex $want_codex, opencode-ai $want_opencode, qwen-code $want_qwen (npm, from the lock)"
	cp "$CL/package.json" "$CL/package-lock.json" "$NODE_DIR/"
	# `npm install` from the lock rather than `npm ci`: the registry this
	# machine reaches lacks some other platforms' optional packages (opencode's
	# darwin/windows/musl binaries, a clipboard helper of Qwen Code's), which
	# `npm ci` refuses as "missing from the lock file". The lock must come out
	# unchanged: the exact versions, nothing resolved anew.
	(cd "$NODE_DIR" && npm install --no-audit --no-fund --loglevel=error)
	cmp -s "$CL/package-lock.json" "$NODE_DIR/package-lock.json" ||
		die "npm resolved other versions than clients/package-lock.json"
	# Claude Code's postinstall puts its native binary in place of bin/claude.exe;
	# run it explicitly in case this npm skipped install scripts.
	if ! HOME=$DEPS/home timeout 60 "$OCEANCODE_NODE_BIN/claude" --version >/dev/null 2>&1; then
		(cd "$NODE_DIR/node_modules/@anthropic-ai/claude-code" && node install.cjs)
	fi
	have_versions || die "the installed clients do not report claude-code $want_cc / codex $want_codex / opencode $want_opencode / qwen-code $want_qwen"
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
import sys, importlib.metadata as md, anthropic, openai, pytest
print(f"== clients: python {sys.version.split()[0]}, anthropic {anthropic.__version__}, openai {openai.__version__}, "
      f"mini-swe-agent {md.version('mini-swe-agent')} (litellm {md.version('litellm')}), pytest {pytest.__version__}")
EOF2
version_of() { HOME=$DEPS/home "$OCEANCODE_NODE_BIN/$1" --version 2>/dev/null | head -1; }
say "node $(node --version), claude-code $(version_of claude), $(version_of codex), opencode $(version_of opencode), qwen-code $(version_of qwen)"

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
