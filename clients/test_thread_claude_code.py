"""Keeping the thread across a cut (issue 13) with the real Claude Code.

One headless prompt (`oceancode-proxy run --tideline 20k -- claude -p …`),
then a long tool loop the fake scripts: Read, Write and Bash (one command
fails) on a temp project. The window sent upstream is cut several times; after
each cut what the model saw (the tap's record of the upstream request) carries
the stub and, after it, the state block naming the files the cut part touched
and the transcript lines to open; SESSION.md, with one prompt and no turn wholly
past the tideline, already lists the files touched and the commands with their
exit codes (merged block by block).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import harness as h
import test_claude_code as tcc

STEPS = 24
TIMEOUT = 300
STATE_HEAD = "[State at the tideline:"
FAILING = "ls /nonexistent-oceancode-dir"


def script(proj: Path) -> dict:
    replies = []
    for i in range(1, STEPS + 1):
        if i % 3 == 1:
            call = {"name": "Read", "input": {"file_path": str(proj / f"notes{2 * i}.txt")}}
        elif i % 3 == 2:
            body = "".join(f"written line {j} of step {i}\n" for j in range(40))
            call = {"name": "Write", "input": {"file_path": str(proj / f"out{i}.txt"), "content": body}}
        elif i == 6:
            call = {"name": "Bash", "input": {"command": FAILING, "description": "List a missing dir"}}
        else:
            call = {"name": "Bash", "input": {"command": f"seq {i * 10000} {i * 10000 + 1500}",
                                              "description": f"Print the numbers of step {i}"}}
        replies.append({"text": f"Step {i}.", "tool_calls": [call]})
    return {"replies": replies, "default": {"text": "All steps done. FINAL_ANSWER_MARKER"}}


def first_text(req: dict) -> str | None:
    msgs = (req.get("json") or {}).get("messages") or []
    if not msgs:
        return None
    c = msgs[0].get("content")
    if isinstance(c, list) and c and isinstance(c[0], dict):
        return c[0].get("text")
    return c if isinstance(c, str) else None


def stub_upto(text: str) -> int:
    m = re.search(r"every row up to seq (\d+) left this window", text)
    assert m, text[:300]
    return int(m.group(1))


def test_claude_code_p_keeps_the_thread_across_cuts(tmp_path):
    work = tmp_path
    proj = work / "proj"
    tcc.make_project(proj)
    up = tcc.Upstream(work, script(proj), "thread")
    try:
        env = tcc.cc_env(work / "home")
        (work / "home").mkdir(exist_ok=True)
        cmd = [str(h.PROXY_BIN), "--data-dir", str(work / "data"), "run", "--tideline", "20k",
               "--anthropic-upstream", up.tap.url, "--openai-upstream", up.tap.url, "--",
               *tcc.cc_cmd(tcc.PROMPT, "--allowedTools", "Bash,Read,Write")]
        r = h.run(cmd, env, proj, TIMEOUT, log=work / "client.log")
        reqs = up.tap.model_requests()
    finally:
        up.stop()
    assert not r.timed_out, r.tail()
    assert r.code == 0, r.tail()
    assert "FINAL_ANSWER_MARKER" in r.stdout, r.tail()
    # Claude Code really ran the tools.
    assert (proj / "out2.txt").read_text().startswith("written line 0 of step 2")
    loop = [q for q in reqs if (q.get("json") or {}).get("tools")]
    assert len(loop) >= STEPS, len(loop)

    # After each cut the model saw the stub and the state block right after it.
    cut = [(q, first_text(q)) for q in loop if (first_text(q) or "").startswith(h.STUB_PREFIX)]
    uptos = sorted({stub_upto(t) for _, t in cut})
    print(f"claude -p: {len(loop)} agent requests, {len(cut)} of them cut, cuts at seqs {uptos}")
    assert len(uptos) >= 2, f"cut several times: {uptos}"
    for q, text in cut:
        assert f"\n\n{STATE_HEAD}" in text, f"request {q['seq']}: no state block after the stub\n{text[:600]}"
    last = cut[-1][1]
    block = last[last.index(STATE_HEAD):]
    print(block)
    assert "Goal (t01, seq " in block and "Work through the numbered steps" in block, block
    assert "Files touched in the cut part" in block, block
    # The first steps' files left the window: the block names them.
    assert "notes2.txt (read " in block, block
    assert "out2.txt (created " in block, block
    # The failing command, not since succeeded (its exit code, or `error`).
    assert re.search(r"Failed, not since succeeded:\n- `" + re.escape(FAILING) + r"` → (exit [1-9]|error)", block), block
    assert re.search(r"- 0001\.md lines \d+–\d+: seq \d+–\d+ \(t01\)", block), block
    assert "oceancode-proxy recall " in block

    # SESSION.md of the one-prompt run: populated after its first cut.
    dirs = re.findall(r"oceancode-proxy: ledger (\S+)", r.stderr)
    assert len(dirs) == 1, r.tail()
    page = (Path(dirs[0]) / "SESSION.md").read_text()
    print(page[:3000])
    files = page.split("## Files touched", 1)[1].split("\n## ", 1)[0]
    assert "notes2.txt` (read)" in files, page
    assert "out2.txt` (write)" in files or "out2.txt` (create" in files, page
    commands = page.split("## Commands", 1)[1].split("\n## ", 1)[0]
    assert re.search(re.escape(FAILING) + r"` → (exit [1-9]|error)", commands), page
    assert "→ ok" in commands or "→ exit 0" in commands, page
