#!/usr/bin/env bash
# Installs the real clients of the end-to-end suite: the pinned npm clients
# (clients/package-lock.json) and the Python side (clients/requirements.txt)
# into $OCEANCODE_CLIENTS_DEPS (default clients/.deps). Idempotent: what is
# there at the pinned versions is kept, so a DEPS outside the checkout is a
# cache (.ci/run keeps one under ~/.cache and starts this in the background
# while the workspace builds).
#
#   bash clients/install.sh           install (or check) and exit
#   . clients/install.sh              the same, from clients/run.sh, which then
#                                     uses $PYRUN and $OCEANCODE_NODE_BIN
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
	set -euo pipefail
	cd "$(dirname "$0")/.."
fi
ROOT=${ROOT:-$PWD}
CL=${CL:-$ROOT/clients}
DEPS=${DEPS:-${OCEANCODE_CLIENTS_DEPS:-$CL/.deps}}
PY=${PY:-$(command -v python3 || true)}
if ! declare -F say >/dev/null; then
	say() { printf '== clients: %s\n' "$*"; }
	die() { printf 'clients/install.sh: %s\n' "$*" >&2; exit 1; }
fi
[ -n "$PY" ] || die "python3 is required"
command -v node >/dev/null || die "node is required (Node 22+)"
command -v npm >/dev/null || die "npm is required"

# ---------------------------------------------------------------- npm clients
want() { node -p "require('$CL/package.json').dependencies['$1']"; }
want_cc=$(want @anthropic-ai/claude-code)
want_codex=$(want @openai/codex)
want_opencode=$(want opencode-ai)
want_qwen=$(want @qwen-code/qwen-code)
want_gemini=$(want @google/gemini-cli)
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
		has_version opencode "$want_opencode" && has_version qwen "$want_qwen" &&
		has_version gemini "$want_gemini"
}
mkdir -p "$NODE_DIR" "$DEPS/home"
if have_versions; then
	say "npm clients already installed (claude-code $want_cc, codex $want_codex, opencode $want_opencode, qwen-code $want_qwen, gemini-cli $want_gemini)"
else
	say "install claude-code $want_cc, codex $want_codex, opencode-ai $want_opencode, qwen-code $want_qwen, gemini-cli $want_gemini (npm, from the lock)"
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
	have_versions || die "the installed clients do not report claude-code $want_cc / codex $want_codex / opencode $want_opencode / qwen-code $want_qwen / gemini-cli $want_gemini"
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
# Arize Phoenix (test_otel_phoenix.py: a real OTLP backend on loopback), in a
# venv of its own: its many dependencies stay out of the SDKs' pinned set.
PHOENIX_VENV=$DEPS/phoenix
if [ -x "$PHOENIX_VENV/bin/python" ] || "$PY" -m venv "$PHOENIX_VENV" >/dev/null 2>&1; then
	"$PHOENIX_VENV/bin/python" -m pip install --disable-pip-version-check -q -r "$CL/requirements-phoenix.txt" ||
		die "pip install -r clients/requirements-phoenix.txt failed"
	export OCEANCODE_PHOENIX=$PHOENIX_VENV/bin/phoenix
	say "arize-phoenix $("$PHOENIX_VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("arize-phoenix"))')"
else
	say "python3 -m venv is unavailable: the Phoenix test will be skipped"
fi
version_of() { HOME=$DEPS/home "$OCEANCODE_NODE_BIN/$1" --version 2>/dev/null | head -1; }
say "node $(node --version), claude-code $(version_of claude), $(version_of codex), opencode $(version_of opencode), qwen-code $(version_of qwen)"

