"""Fixtures: a loopback stack (fake upstream, recording tap, proxy) per test."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h  # noqa: E402


def pytest_sessionstart(session):
    missing = [p for p in (h.PROXY_BIN, h.FAKEUP_BIN) if not p.exists()]
    if missing:
        raise pytest.UsageError(
            f"missing binaries {missing}: build them first (clients/run.sh does) "
            "or set OCEANCODE_BIN_DIR")


class Stack:
    """fake upstream ─ tap ─ (optional) proxy, all on loopback."""

    def __init__(self, work: Path, script=None, tideline: str | None = None,
                 max_context: int | None = None, proxy: bool = True,
                 proxy_env: dict | None = None, upstream_override: str | None = None,
                 end_delay_ms: int = 0, gzip: bool = False, fake_args: list[str] | None = None):
        self.work = work
        self.home = work / "home"
        self.home.mkdir(parents=True, exist_ok=True)
        self.data = work / "data"
        self.procs = []
        self.fake = h.start_fake(work, script, max_context, gzip=gzip, args=fake_args)
        self.procs.append(self.fake)
        self.tap = h.start_tap(work, self.fake.url, end_delay_ms=end_delay_ms)
        self.procs.append(self.tap)
        self.proxy = None
        if proxy:
            self.proxy = h.start_proxy(work, upstream_override or self.tap.url, self.data,
                                       tideline, proxy_env)
            self.procs.append(self.proxy)
        self.ledger = h.Ledger(self.data)

    @property
    def url(self) -> str:
        """Where clients point: the proxy (or the tap when there is no proxy)."""
        return self.proxy.url if self.proxy else self.tap.url

    def settle(self):
        if self.proxy:
            h.http_json(self.proxy.url + "/_oceancode/settle", "POST", {})

    def fake_errors(self) -> list[str]:
        """Lines of the fake's debug log answering a non-2xx status."""
        import re
        out = []
        for line in self.fake.read_log().splitlines():
            m = re.search(r"(POST|GET|HEAD) \S+ -> (\d{3})", line)
            if m and not m.group(2).startswith("2"):
                out.append(line)
        return out

    def close(self):
        self.ledger.close()
        for p in reversed(self.procs):
            p.stop()


@pytest.fixture
def make_stack(tmp_path):
    stacks = []

    def make(**kw) -> Stack:
        work = tmp_path / f"stack{len(stacks)}"
        work.mkdir()
        s = Stack(work, **kw)
        stacks.append(s)
        return s

    yield make
    for s in stacks:
        s.close()


@pytest.fixture(scope="session")
def node_bin() -> Path:
    return h.NODE_BIN


def require_client(path: Path):
    if not path.exists():
        pytest.fail(f"{path} is not installed (clients/run.sh installs the pinned versions; "
                    "or set OCEANCODE_NODE_BIN)")


def pytest_report_header(config):
    return [f"oceancode binaries: {h.BIN_DIR}", f"node clients: {h.NODE_BIN}",
            f"python: {sys.version.split()[0]}"] + (
        [f"OCEANCODE_LOG={os.environ['OCEANCODE_LOG']}"] if "OCEANCODE_LOG" in os.environ else [])
