"""Qwen Code (`qwen --auth-type openai -o stream-json --yolo "..."`, headless)
through oceancode-proxy.

Qwen Code's OpenAI auth reads OPENAI_BASE_URL / OPENAI_API_KEY / OPENAI_MODEL
and speaks Chat Completions (streamed, with usage). Its settings file turns
off usage statistics, telemetry and the update check (nothing else leaves the
machine; its web tools are never called).

Qwen Code sends no session header: the proxy keys the session on its system
prompt and first message. Its system prompt and tool schemas alone are ~20k
tokens, so the line is 40k: 16 run_shell_command steps cut several times.
Every upstream request valid, one ledger session, exit 0, every tool output
Qwen Code reported is a ledger row.
"""

from __future__ import annotations

import json
from pathlib import Path

import agentcheck as ac
import harness as h
from conftest import require_client

STEPS = 16
LINE = "40k"
TIMEOUT = 240
PROMPT = "Work through the numbered steps in this directory."
MODEL = "qwen3-coder-plus"

SETTINGS = {
    "general": {"enableAutoUpdate": False, "disableAutoUpdate": True, "disableUpdateNag": True},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
}


def qwen_bin() -> Path:
    p = h.NODE_BIN / "qwen"
    require_client(p)
    return p


def script() -> dict:
    replies = []
    for i in range(1, STEPS + 1):
        cmd = f"seq {i * 10000} {i * 10000 + 1500}" if i % 2 else f"cat notes{i}.txt"
        replies.append({"text": f"Step {i}.", "tool_calls": [
            {"name": "run_shell_command", "input": {"command": cmd, "description": f"step {i}"}}]})
    return {"replies": replies, "default": {"text": "All steps done. FINAL_ANSWER_MARKER"}}


def test_qwen_code_headless_across_cuts_one_session(make_stack):
    st = make_stack(script=script(), tideline=LINE)
    proj = st.work / "proj"
    proj.mkdir()
    for i in range(2, STEPS + 1, 2):
        (proj / f"notes{i}.txt").write_text("".join(
            f"line {j} of notes {i}: the quick brown fox jumps over the lazy dog\n" for j in range(300)))
    (st.home / ".qwen").mkdir(parents=True)
    (st.home / ".qwen" / "settings.json").write_text(json.dumps(SETTINGS, indent=1))
    env = h.base_env(st.home)
    env.update({"OPENAI_BASE_URL": st.url + "/v1", "OPENAI_API_KEY": "sk-test-not-a-real-key",
                "OPENAI_MODEL": MODEL, "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1"})
    cmd = [str(qwen_bin()), "--auth-type", "openai", "--yolo", "-o", "stream-json", PROMPT]
    run = h.run(cmd, env, proj, TIMEOUT, log=st.work / "client.log")
    assert not run.timed_out and run.code == 0, run.tail()
    events = [json.loads(l) for l in run.stdout.splitlines() if l.startswith("{")]
    result = [e for e in events if e.get("type") == "result"]
    assert result and result[-1]["subtype"] == "success" and not result[-1]["is_error"], run.tail()
    assert "FINAL_ANSWER_MARKER" in result[-1]["result"]
    outputs = [b for e in events if e.get("type") == "user"
               for b in (e.get("message", {}).get("content") or []) if isinstance(b, dict) and b.get("type") == "tool_result"]
    assert len(outputs) == STEPS, f"{len(outputs)} tool results\n{run.tail()}"
    assert not [b for b in outputs if b.get("is_error")], outputs[:1]

    reqs = st.tap.model_requests()
    assert len(reqs) == STEPS + 1, [q["path"] for q in reqs]
    bad = [(q["seq"], q["status"], q["response"][:200]) for q in reqs if q["status"] != 200]
    assert not bad and not st.fake_errors(), (bad, st.fake_errors())
    st.settle()
    sessions = st.ledger.sessions()
    assert [(s["client"], s["dialect"]) for s in sessions] == [("qwen-code", "openai_chat")], \
        [dict(s) for s in sessions]
    sid = sessions[0]["id"]
    cuts = st.ledger.cuts(sid)
    assert len(cuts) >= 2, f"expected several cuts at a {LINE} line: {[dict(c) for c in cuts]}"
    ac.check_stub_upstream("chat", reqs, st.data / "sessions" / sid)
    assert not st.ledger.q("SELECT * FROM branches WHERE session=?", sid)
    rows = st.ledger.rows(sid)
    ac.check_rows_verbatim(rows, [q["json"]["messages"] for q in reqs], "chat")
    recorded = [json.loads(r["raw"]).get("content") for r in rows if r["kind"] == "tool_result"]
    assert len(recorded) == STEPS
    # Whole outputs are recorded, not stubs. Which ones are whole is up to Qwen
    # Code: its child_process runner resolves on the child's `exit` event
    # (ShellExecutionService.childProcessFallback, `!streamStdout`), so on a
    # loaded machine a `cat` can lose what was still in the pipe. The rows
    # match the requests byte for byte above; here at least one of the eight
    # notes files must have arrived whole (here and on CI, `cat notes2.txt`,
    # the first, has come back "(empty)").
    texts = [c if isinstance(c, str) else json.dumps(c) for c in recorded]
    whole = [i for i in range(2, STEPS + 1, 2) if any(f"line 299 of notes {i}:" in t for t in texts)]
    assert whole, [t[-200:] for t in texts]
    ac.check_transcripts(st.data / "sessions" / sid, ["10000\n10001"])
