#!/usr/bin/env bash
# The session viewer in a real browser (issue 18): Debian's chromium driven
# by playwright-core (viewer-tests/package-lock.json) against a real
# oceancode-proxy and the fake upstream, all on loopback.
#
#   bash viewer-tests/run.sh
#
# Needs /usr/bin/chromium (`apt-get install -y chromium`; .ci/run installs
# it) and node/npm. Screenshots: viewer-tests/.work/screenshots/.
# Environment: OCEANCODE_BIN_DIR (default target/debug, built here),
# CHROMIUM (default /usr/bin/chromium).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
if [ -z "${OCEANCODE_BIN_DIR:-}" ]; then
	cargo build --locked -p oceancode-proxy -p oceancode-fakeup
	export OCEANCODE_BIN_DIR=${CARGO_TARGET_DIR:-$ROOT/target}/debug
fi
[ -x "${CHROMIUM:-/usr/bin/chromium}" ] || { echo "viewer-tests: no chromium at ${CHROMIUM:-/usr/bin/chromium}" >&2; exit 1; }
cd viewer-tests
if [ ! -d node_modules/playwright-core ]; then
	npm ci --no-audit --no-fund
fi
cd "$ROOT"
export VIEWER_WORK=$ROOT/viewer-tests/.work
timeout 300 node viewer-tests/viewer.test.mjs
