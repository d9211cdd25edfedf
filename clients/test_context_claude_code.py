"""Claude Code edits its own context through the proxy, with its own tools.

Scripted by the fake upstream: Claude Code reads a large build log (Read),
exports its context (`oceancode-proxy context` in Bash, linked into the
project as ctx.txt), then reads context.txt and edits it with its Edit tool:
the log's block is deleted (its result marker replaced by `[[delete]]`, one
small replacement) and a note is added before the last line. The next
upstream request lacks the log and its call, carries the note as the
assistant's words, stays valid (the fake's validator answers 200), and so
does the one after Claude Code's next step (a new call and its result); the
receipt says taken; the ledger still holds the log verbatim.

Run 2's fake upstream numbers its tool calls from toolu_1 again, so Claude
Code leaves the calls whose ids it saw in run 1 (the export, the Read) out
of its history: the proxy must read an answer's calls from the client's
echo of it, not from the answer (issue 32 item 3: the edit was refused on
the next step because of a Read call the client never sent).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import harness as h
from test_claude_code import cc_env, claude_bin, events, Upstream

TIMEOUT = 240
NOTE = "The build log said: only net/ fails; everything else builds."
LOG_LAST = "build log line 1199"


def make_log(proj: Path) -> Path:
    p = proj / "build.log"
    p.write_text("".join(f"build log line {i}: compiling crate_{i % 37} v0.{i % 9}.0 ok\n" for i in range(1200)))
    return p


def cc_run(work: Path, proj: Path, data: Path, up: "Upstream", name: str, *extra: str):
    home = work / "home"
    home.mkdir(exist_ok=True)
    cmd = [str(h.PROXY_BIN), "--data-dir", str(data), "run", "--tideline", "90%",
           "--anthropic-upstream", up.tap.url, "--openai-upstream", up.tap.url, "--",
           str(claude_bin()), "-p", "Check the build log, then trim your context.",
           "--output-format", "stream-json", "--verbose", "--allowedTools", "Bash,Read,Edit", *extra]
    o = type("O", (), {})()
    o.run = h.run(cmd, cc_env(home), proj, TIMEOUT, log=work / f"{name}-client.log")
    o.events = events(o.run.stdout)
    o.reqs = up.tap.model_requests()
    o.fake_log = up.fake.read_log()
    o.session_dirs = [Path(x) for x in re.findall(r"oceancode-proxy: ledger (\S+)", o.run.stderr)]
    return o


@pytest.fixture(scope="module")
def edited(tmp_path_factory):
    """Run 1 reads the log and exports (the test learns the file's path and
    the log block's header from it); run 2 (`--continue`, a fresh proxy)
    exports again and edits the file with Read + Edit."""
    work = tmp_path_factory.mktemp("cc_context")
    proj = work / "proj"
    proj.mkdir()
    data = proj / "data"
    log = make_log(proj)
    export = f"{h.PROXY_BIN} --data-dir {data} context"
    first = {"replies": [
        {"text": "Reading the build log.", "tool_calls": [{"name": "Read", "input": {"file_path": str(log)}}]},
        {"text": "Exporting my context.",
         "tool_calls": [{"name": "Bash", "input": {"command": export, "description": "Export my context"}}]},
    ], "default": {"text": "Exported. FINAL_ANSWER_MARKER"}}
    up1 = Upstream(work, first, "ccctx1")
    o1 = cc_run(work, proj, data, up1, "first")
    up1.stop()
    assert o1.run.code == 0, o1.run.tail()
    sdir = o1.session_dirs[0]
    ctx = sdir / "context.txt"
    text = ctx.read_text()
    header = next(line for line in text.splitlines()
                  if line.startswith("[[m:") and "[[tool_result" in text.split(line, 1)[1].split("\n", 2)[1])
    # Run 2 exports again (a new nonce, random: not known to the script):
    # the block is found by the end of its header and its result's marker.
    marker = text.split(header, 1)[1].split("\n", 2)[1]
    anchor = " user]]\n" + marker + "\n"
    second = {"replies": [
        {"text": "Exporting my context again.",
         "tool_calls": [{"name": "Bash", "input": {"command": export, "description": "Export my context"}}]},
        {"text": "Editing my context.", "tool_calls": [
            # Only its head: reading it whole would bring the window back as a tool result.
            {"name": "Read", "input": {"file_path": str(ctx), "limit": 3}},
            {"name": "Edit", "input": {"file_path": str(ctx), "old_string": anchor,
                                       "new_string": " user]]\n[[delete]]\n" + marker + "\n"}},
            {"name": "Edit", "input": {"file_path": str(ctx), "old_string": "\n[[end of context ",
                                       "new_string": f"\n[[note]]\n{NOTE}\n\n[[end of context "}},
        ]},
        # The agent's next step after the edit (issue 32.3): the edit holds.
        {"text": "One more step.",
         "tool_calls": [{"name": "Bash", "input": {"command": "echo next step", "description": "Next step"}}]},
    ], "default": {"text": "Context trimmed. FINAL_ANSWER_MARKER"}}
    up2 = Upstream(work, second, "ccctx2")
    o = cc_run(work, proj, data, up2, "second", "--continue")
    o.data, o.ctx, o.work, o.header = data, ctx, work, header
    yield o
    up2.stop()


def with_tools(reqs):
    return [r for r in reqs if (r["json"] or {}).get("tools")]


def text_of(r) -> str:
    import json
    return json.dumps((r["json"] or {}).get("messages") or [])


def test_claude_code_edits_its_context_file(edited):
    r = edited.run
    assert not r.timed_out, f"Claude Code hung:\n{r.tail()}"
    assert r.code == 0, r.tail()
    result = [e for e in edited.events if e.get("type") == "result"]
    assert result and result[-1].get("subtype") == "success", r.tail()
    # The Edit tool succeeded on the file (Claude Code's own results).
    results = [b for e in edited.events if e.get("type") == "user"
               for b in (e.get("message", {}).get("content") or []) if isinstance(b, dict)
               and b.get("type") == "tool_result"]
    errors = [b for b in results if b.get("is_error")]
    assert not errors, f"a tool failed: {errors}"
    reqs = with_tools(edited.reqs)
    assert len(reqs) >= 4, [text_of(q)[:200] for q in reqs]
    bad = [(q["seq"], q["status"]) for q in edited.reqs if q["status"] != 200]
    assert not bad, f"upstream refused a request: {bad}"
    # Run 2's requests: the prompt, the export's result, the edits' results.
    before, after = reqs[1], reqs[2]
    assert LOG_LAST in text_of(before), "the log was in the window before the edit"
    assert LOG_LAST not in text_of(after), "the edit took the log out"
    msgs = after["json"]["messages"]
    notes = [m for m in msgs if m["role"] == "assistant" and NOTE in str(m["content"])]
    assert notes, "the note is in the window as the assistant's words"
    # The next step (a new call and its result, then Claude Code's note
    # that the file changed on disk): the edit still holds upstream.
    nxt = reqs[3]
    assert "next step" in text_of(nxt), text_of(nxt)[-400:]
    assert LOG_LAST not in text_of(nxt), "the edit holds on the next step"
    assert any(m["role"] == "assistant" and NOTE in str(m["content"]) for m in nxt["json"]["messages"])
    receipt = (edited.session_dirs[0] / "context.receipt.txt").read_text()
    assert receipt.startswith("taken · export e"), receipt
    assert "note 1 added, after seq" in receipt, receipt
    totals = [int(x) for x in re.findall(r"total_input_tokens: (\d+)", edited.fake_log)]
    saved = totals[1] - totals[2] if len(totals) >= 3 else 0
    print(f"\ntokens saved (the fake upstream's count, before → after the edit): {saved} ({totals})\nreceipt:\n{receipt}")
    assert saved > 5_000, totals
    # The ledger keeps the original.
    led = h.Ledger(edited.data)
    sid = edited.session_dirs[0].name
    assert any(LOG_LAST in x["raw"] for x in led.rows(sid)), "the ledger keeps the log"
    edits = led.q("SELECT * FROM context_edits WHERE session=?", sid)
    assert len(edits) == 1
    led.close()
