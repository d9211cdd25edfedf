"""Claude Code's own screen: interactive Claude Code (in tmux) through a running
`oceancode-proxy serve`, set up with `oceancode-proxy setup claude-code`.

The status line it renders (tmux capture-pane) must show the meter before and
after a cut of the 20k line, and an installed slash command (`/oc-status`) must
run the CLI for this very session: its output reaches the model's next request.
The pane is also rendered to a PNG (docs/img/claude-code-statusline.png is one).
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

import harness as h
from test_claude_code import cc_env, claude_bin, make_project, script_for

STEPS = 12
TIMEOUT = 240
TMUX = shutil.which("tmux")


class Tmux:
    """One tmux server of its own (`-L`), one window running `cmd`."""

    def __init__(self, work: Path, cmd: list[str], env: dict, cwd: Path):
        self.sock = f"oc-{os.getpid()}-{int(time.time() * 1000) % 100000}"
        self.base = [TMUX, "-L", self.sock, "-f", "/dev/null"]
        shell = " ".join(_q(c) for c in cmd)
        envs = " ".join(f"{k}={_q(v)}" for k, v in env.items())
        subprocess.run(self.base + ["new-session", "-d", "-s", "cc", "-x", "160", "-y", "45",
                                    "-c", str(cwd), f"env -i {envs} {shell}; sleep 600"],
                       check=True, env={**os.environ, "TMUX": ""})

    def keys(self, *keys: str):
        subprocess.run(self.base + ["send-keys", "-t", "cc", *keys], check=True)

    def text(self, escapes: bool = False) -> str:
        args = ["capture-pane", "-p", "-t", "cc"] + (["-e"] if escapes else [])
        return subprocess.run(self.base + args, capture_output=True, text=True).stdout

    def close(self):
        subprocess.run(self.base + ["kill-server"], capture_output=True)


def _q(s: str) -> str:
    return "'" + str(s).replace("'", "'\\''") + "'"


def wait_for(pred, timeout: float, what: str, pane=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.25)
    pytest.fail(f"timed out waiting for {what}" + (f"\n--- pane\n{pane()}" if pane else ""))


STATUS = re.compile(r"oceancode (\S+)/(\S+) · (\d+) cuts")


def to_png(work: Path, pane: str, out: Path) -> Path | None:
    """The pane (plain text) as a dark terminal picture, the status line
    highlighted; Chromium headless takes the screenshot."""
    chrome = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chrome:
        return None
    lines = []
    # The bottom of the screen: the last answers, the prompt, the status line.
    for line in pane.rstrip("\n").splitlines()[-18:]:
        esc = html.escape(line)
        if STATUS.search(line):
            esc = f'<span style="color:#7fd4ff">{esc}</span>'
        lines.append(esc)
    page = work / "pane.html"
    page.write_text(
        "<html><body style='margin:0;background:#1e1e1e'><pre style='margin:12px;"
        "font:14px/1.25 DejaVu Sans Mono,monospace;color:#d4d4d4'>" + "\n".join(lines) + "</pre></body></html>")
    subprocess.run([chrome, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--screenshot={out}", f"--window-size=1400,{int(len(lines) * 17.5) + 30}", page.as_uri()],
                   capture_output=True, timeout=60)
    return out if out.exists() else None


@pytest.mark.skipif(TMUX is None, reason="tmux is not installed")
def test_claude_code_status_line_and_slash_command(make_stack, tmp_path):
    proj = tmp_path / "proj"
    make_project(proj)
    script = script_for(proj, STEPS)
    for r in script["replies"]:
        # A step a person could watch: the status line refreshes between steps.
        r["delay_first_ms"] = 1500
    st = make_stack(script=script, tideline="20k")
    env = cc_env(st.home)
    env["ANTHROPIC_BASE_URL"] = st.url
    env["TERM"] = "xterm-256color"
    # The setup under test, as a user runs it (a private HOME).
    setup = h.run([str(h.PROXY_BIN), "--data-dir", str(st.data), "setup", "claude-code", "--user"],
                  env, proj, 60)
    assert setup.code == 0, setup.tail()
    assert "statusLine" in setup.stdout and "oc-status.md" in setup.stdout, setup.stdout
    settings = json.loads((st.home / ".claude" / "settings.json").read_text())
    assert settings["permissions"]["additionalDirectories"] == [str(st.data.resolve())]
    # No first-run dialogs: onboarding done, the test key approved, the project trusted.
    key = env["ANTHROPIC_API_KEY"]
    (st.home / ".claude.json").write_text(json.dumps({
        "hasCompletedOnboarding": True,
        "customApiKeyResponses": {"approved": [key[-20:]], "rejected": []},
        "projects": {str(proj): {"hasTrustDialogAccepted": True, "hasCompletedProjectOnboarding": True}},
    }))
    t = Tmux(tmp_path, [str(claude_bin()), "--allowedTools", "Bash,Read"], env, proj)
    try:
        wait_for(lambda: "oceancode" in t.text() or "❯" in t.text(), 60, "Claude Code's prompt", t.text)
        ask = "Work through the numbered steps in this directory."
        t.keys(ask)
        wait_for(lambda: ask in t.text(), 30, "the ask in the input box", t.text)
        t.keys("Enter")
        seen = []

        def status(pred=lambda m: True):
            m = STATUS.search(t.text())
            if m and (not seen or seen[-1] != m.group(0)):
                seen.append(m.group(0))
            return m if m and pred(m) else None

        wait_for(lambda: status() is not None and "FINAL_ANSWER_MARKER" in t.text() and t.text(),
                 TIMEOUT, "the run's end", t.text)
        st.settle()
        cuts = st.ledger.cuts()
        assert cuts, "the ledger has no cut"
        # The line after the last step counts every cut of the session.
        last = wait_for(lambda: status(lambda m: int(m.group(3)) == len(cuts)), 30,
                        f"the status line to show {len(cuts)} cuts", t.text)
        counts = [int(STATUS.search(s).group(3)) for s in seen]
        assert len(set(counts)) >= 2, f"the line never changed across a cut: {seen}"
        assert last.group(2) == "20k", seen
        pane = t.text()
        to_png(tmp_path, pane, tmp_path / "claude-code-statusline.png")
        # A slash command of setup's, for this session.
        before = len(st.tap.model_requests())
        t.keys("/oc-status")
        wait_for(lambda: "/oc-status" in t.text(), 30, "the command in the input box", t.text)
        t.keys("Enter")
        wait_for(lambda: len(st.tap.model_requests(quiesce=False)) > before, 60,
                 "the request after /oc-status", t.text)
        req = json.dumps(st.tap.model_requests()[before:])
        ids = [r["id"] for r in st.ledger.sessions()]
        assert "cache    hit ratio" in req and any(i in req for i in ids), req[-3000:]
    finally:
        t.close()
