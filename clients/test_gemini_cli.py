"""Gemini CLI (`gemini -p "..." --yolo`, headless) through oceancode-proxy.

Gemini CLI (`@google/genai`) reads GOOGLE_GEMINI_BASE_URL and GEMINI_API_KEY
(sent as `x-goog-api-key`) and speaks the Generative Language API:
`/v1beta/models/{model}:streamGenerateContent?alt=sse` for its turns, and
`:generateContent` with a `responseJsonSchema` for its utility calls (the
model router, the next-speaker check), which the proxy forwards untouched.
Its settings file selects the API-key auth, turns off folder trust, usage
statistics, telemetry and the update check.

Gemini CLI sends no session header: the proxy keys the session on its
system instruction and first content. GEMINI.md goes in a
`<session_context>` part of the first user content (the ask is the next
part of the same content): it is pinned, so every window after a cut still
carries it. 16 run_shell_command steps at a 30k line cut several times.
Every upstream request valid, one ledger session, exit 0, the ledger equal
to what the client sent.
"""

from __future__ import annotations

import json
from pathlib import Path

import agentcheck as ac
import harness as h
from conftest import require_client

STEPS = 16
LINE = "30k"
TIMEOUT = 300
PROMPT = "Work through the numbered steps in this directory."
MODEL = "gemini-2.5-flash"
RULE = "GEMINI_MD_RULE_7731: always answer in English."

SETTINGS = {
    "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
    "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
}


def gemini_bin() -> Path:
    p = h.NODE_BIN / "gemini"
    require_client(p)
    return p


def script() -> dict:
    replies = []
    for i in range(1, STEPS + 1):
        cmd = f"seq {i * 10000} {i * 10000 + 1500}" if i % 2 else f"cat notes{i}.txt"
        replies.append({"text": f"Step {i}.", "tool_calls": [
            {"name": "run_shell_command", "input": {"command": cmd, "description": f"step {i}"}}]})
    return {"replies": replies, "default": {"text": "All steps done. FINAL_ANSWER_MARKER"}}


def texts(content: dict) -> str:
    return "".join(p.get("text", "") for p in content.get("parts", []) if isinstance(p, dict))


def test_gemini_cli_headless_across_cuts_one_session(make_stack):
    st = make_stack(script=script(), tideline=LINE)
    proj = st.work / "proj"
    proj.mkdir()
    (proj / "GEMINI.md").write_text(RULE + "\n")
    for i in range(2, STEPS + 1, 2):
        (proj / f"notes{i}.txt").write_text("".join(
            f"line {j} of notes {i}: the quick brown fox jumps over the lazy dog\n" for j in range(300)))
    (st.home / ".gemini").mkdir(parents=True)
    (st.home / ".gemini" / "settings.json").write_text(json.dumps(SETTINGS, indent=1))
    env = h.base_env(st.home)
    env.update({"GOOGLE_GEMINI_BASE_URL": st.url, "GEMINI_API_KEY": "sk-test-not-a-real-key"})
    cmd = [str(gemini_bin()), "-m", MODEL, "--yolo", "-p", PROMPT]
    run = h.run(cmd, env, proj, TIMEOUT, log=st.work / "client.log")
    assert not run.timed_out and run.code == 0, run.tail()
    assert "FINAL_ANSWER_MARKER" in run.stdout, run.tail()

    reqs = st.tap.model_requests()
    turns = [q for q in reqs if q["json"] and q["json"].get("tools")]
    assert len(turns) == STEPS + 1, [q["path"] for q in reqs]
    assert all(q["path"].startswith(f"/v1beta/models/{MODEL}:streamGenerateContent") for q in turns)
    bad = [(q["seq"], q["status"], q["response"][:200]) for q in reqs if q["status"] != 200]
    assert not bad and not st.fake_errors(), (bad, st.fake_errors())
    # The key reached the upstream only in its header, never in a ledger file.
    st.settle()
    sessions = st.ledger.sessions()
    assert [(s["client"], s["dialect"]) for s in sessions] == [("gemini-cli", "gemini")], \
        [dict(s) for s in sessions]
    sid = sessions[0]["id"]
    cuts = st.ledger.cuts(sid)
    assert len(cuts) >= 3, f"expected at least 3 cuts at a {LINE} line: {[dict(c) for c in cuts]}"
    info = ac.check_stub_upstream("gemini", turns, st.data / "sessions" / sid)
    # GEMINI.md is in every window, before and after the cuts.
    missing = [q["seq"] for q in turns if RULE not in json.dumps(q["json"]["contents"])]
    assert not missing, f"requests without GEMINI.md: {missing}"
    # After a cut the stub is a user content, first.
    for q in turns[info["first_cut_index"]:]:
        first = q["json"]["contents"][0]
        assert first["role"] == "user" and texts(first).startswith(h.STUB_PREFIX), first
    assert not st.ledger.q("SELECT * FROM branches WHERE session=?", sid)
    rows = st.ledger.rows(sid)
    ac.check_rows_verbatim(rows, [q["json"]["contents"] for q in turns], "gemini")
    recorded = [json.loads(r["raw"]) for r in rows if r["kind"] == "tool_result"]
    assert len(recorded) == STEPS
    assert any("line 299 of notes 2" in json.dumps(c) for c in recorded)
    ac.check_transcripts(st.data / "sessions" / sid, ["10000\n10001"])
    for f in st.data.rglob("*"):
        if f.is_file():
            assert b"sk-test-not-a-real-key" not in f.read_bytes(), f
    steps = st.ledger.steps(sid)
    assert steps and all(s["input"] + s["cache_read"] > 0 for s in steps if s["status"] == 200)
    assert any(s["cache_read"] > 0 for s in steps), "usageMetadata's cached part is a cache read"
