"""Project instructions survive every cut, with the real clients (issue 22).

Claude Code with a CLAUDE.md in the project (and a nested sub/CLAUDE.md it
loads when a file under sub/ is read), Codex with an AGENTS.md: a 20-step tool
session at a fixed 20k tideline, then a second run on the same conversation
(`--continue` / `exec resume --last`) with a new ask. Qwen Code (QWEN.md in
its system prompt; its environment, skills and tool list as reminders in the
first user message) the same way at its suite's 40k line. The window is cut
several times and turn 1 leaves it whole; every upstream request the tap
recorded must still carry the instruction text, byte for byte as the client
sent it, and the upstream must accept every request.
"""

from __future__ import annotations

import json

import pytest

import agentcheck as ac
import harness as h
import test_claude_code as cc
import test_codex as cx
import test_qwen_code as qw

PROJECT_RULE = "ALWAYS run make lint before committing. PROJECT_RULE_MARKER"
NESTED_RULE = "Files under sub/ are generated: NESTED_RULE_MARKER"
AGENTS_RULE = "ALWAYS run make lint before committing. AGENTS_RULE_MARKER"
STEPS = 20


def blocks_with(msgs: list, needle: str) -> list[str]:
    """Every text part of `msgs` holding `needle`, as JSON (sorted keys, no cache_control)."""
    out = []
    for m in msgs:
        c = m.get("content")
        if isinstance(c, list):
            # Normalized per SPEC §2: Claude Code puts cache_control on the last block.
            out += [json.dumps(h.canon(b), sort_keys=True) for b in c
                    if isinstance(b, dict) and needle in (b.get("text") or "")
                    and not b["text"].startswith(h.STUB_PREFIX)]
        elif isinstance(c, str) and needle in c:
            out.append(json.dumps(c))
    return out


def check_kept(dialect: str, reqs: list[dict], needle: str, first_prompt: str, since: int = 0):
    """Every request from `since` on carries the part with `needle`, once and
    unchanged; windows past turn 1 (its ask no longer sent) exist and still do."""
    conv = "input" if dialect == "responses" else "messages"
    seen = None
    past_turn1 = 0
    for r in reqs[since:]:
        assert r["status"] == 200, f"upstream refused request {r['seq']}: {r['response'][:300]}"
        msgs = r["json"][conv]
        found = blocks_with(msgs, needle)
        assert len(found) == 1, f"request {r['seq']}: {len(found)} parts carry {needle!r}"
        assert seen is None or found[0] == seen, f"request {r['seq']}: the instructions changed"
        seen = found[0]
        # The text as JSON-escaped by the client is in the bytes the upstream received.
        part = json.loads(found[0])
        text = part.get("text", "") if isinstance(part, dict) else part
        assert json.dumps(text, ensure_ascii=False)[1:-1] in r["body"], f"request {r['seq']}"
        if ac.stub_of(dialect, r["json"]) and not any(
                first_prompt == (b.get("text") if isinstance(b, dict) else None)
                for m in msgs if isinstance(m.get("content"), list) for b in m["content"]):
            past_turn1 += 1
    return past_turn1


def test_claude_code_keeps_claude_md_after_every_cut(tmp_path):
    proj = tmp_path / "proj"
    cc.make_project(proj)
    (proj / "CLAUDE.md").write_text(PROJECT_RULE + "\n")
    (proj / "sub").mkdir()
    (proj / "sub" / "CLAUDE.md").write_text(NESTED_RULE + "\n")
    (proj / "sub" / "notes.txt").write_text("generated\n")
    first = cc.script_for(proj, STEPS)
    # Step 1 reads a file under sub/: Claude Code attaches sub/CLAUDE.md to that tool result.
    first["replies"][0] = {"text": "Step 1.", "tool_calls": [
        {"name": "Read", "input": {"file_path": str(proj / "sub" / "notes.txt")}}]}
    second = cc.script_for(proj, 6, first=STEPS + 1)
    up = cc.Upstream(tmp_path, {"replies": first["replies"] + [first["default"]] + second["replies"],
                                "default": second["default"]}, "instr")
    try:
        a = cc.run_cc(tmp_path, "first", up, cc.PROMPT)
        assert a.run.code == 0, a.run.tail()
        b = cc.run_cc(tmp_path, "continue", up, cc.PROMPT2, "--continue")
        assert b.run.code == 0, b.run.tail()
    finally:
        up.stop()
    reqs = a.reqs + b.reqs
    assert not cc.compaction_requests(reqs)
    info = ac.check_stub_upstream("anthropic", reqs, a.session_dirs[0])
    assert len(info["cut_seqs"]) >= 3, f"expected several cuts, got {info['cut_seqs']}"
    past = check_kept("anthropic", reqs, "PROJECT_RULE_MARKER", cc.PROMPT)
    assert past >= 3, f"turn 1 never left the window whole: {past}"
    # The nested CLAUDE.md, from the request after the read on.
    since = next(i for i, r in enumerate(reqs) if "NESTED_RULE_MARKER" in r["body"])
    assert since <= 2
    check_kept("anthropic", reqs, "NESTED_RULE_MARKER", cc.PROMPT, since)
    # The ledger keeps Claude Code's first message as sent: reminders and the ask.
    led = h.Ledger(a.data)
    sid = a.session_dirs[0].name
    row1 = led.rows(sid)[0]
    assert row1["kind"] == "prompt" and "PROJECT_RULE_MARKER" in row1["raw"] and cc.PROMPT in row1["raw"]
    led.close()


def test_codex_keeps_agents_md_after_every_cut(tmp_path):
    proj = tmp_path / "proj"
    cx.make_project(proj)
    (proj / "AGENTS.md").write_text(AGENTS_RULE + "\n")
    first = cx.script_for(STEPS)
    second = cx.script_for(6, first=STEPS + 1)
    up = cx.Upstream(tmp_path, {"replies": first["replies"] + [first["default"]] + second["replies"],
                                "default": second["default"]}, "instr", end_delay_ms=cx.END_DELAY_MS)
    try:
        a = cx.run_codex(tmp_path, "first", up, [cx.PROMPT])
        cx.check_completed(a)
        b = cx.run_codex(tmp_path, "resume", up, ["resume", "--last", cx.PROMPT2])
        cx.check_completed(b)
    finally:
        up.stop()
    reqs = a.reqs + b.reqs
    info = ac.check_stub_upstream("responses", reqs, a.session_dirs[0])
    assert len(info["cut_seqs"]) >= 3, f"expected several cuts, got {info['cut_seqs']}"
    past = check_kept("responses", reqs, "AGENTS_RULE_MARKER", cx.PROMPT)
    assert past >= 3, f"turn 1 never left the window whole: {past}"
    check_kept("responses", reqs, "<environment_context>", cx.PROMPT)
    # Codex's AGENTS.md message is context: a system row, not turn 1's ask.
    led = h.Ledger(a.data)
    sid = a.session_dirs[0].name
    rows = led.rows(sid)
    agents = [r for r in rows if "AGENTS_RULE_MARKER" in r["raw"]]
    assert [r["kind"] for r in agents] == ["system"], [dict(r) for r in agents]
    asks = [r for r in rows if r["kind"] == "prompt"]
    assert cx.PROMPT in asks[0]["raw"] and asks[0]["turn"] == 1
    led.close()


def test_qwen_code_keeps_its_context_after_every_cut(make_stack):
    first = qw.script()
    more = [{"text": f"Step {i}.", "tool_calls": [{"name": "run_shell_command", "input": {
        "command": f"seq {i * 10000} {i * 10000 + 1500}", "description": f"step {i}"}}]}
        for i in range(qw.STEPS + 1, qw.STEPS + 7)]
    st = make_stack(script={"replies": first["replies"] + [first["default"]] + more,
                            "default": first["default"]}, tideline=qw.LINE)
    proj = st.work / "proj"
    proj.mkdir()
    for i in range(2, qw.STEPS + 1, 2):
        (proj / f"notes{i}.txt").write_text("".join(
            f"line {j} of notes {i}: the quick brown fox jumps over the lazy dog\n" for j in range(300)))
    (proj / "QWEN.md").write_text("ALWAYS run make lint before committing. QWEN_RULE_MARKER\n")
    (st.home / ".qwen").mkdir(parents=True)
    (st.home / ".qwen" / "settings.json").write_text(json.dumps(qw.SETTINGS, indent=1))
    env = h.base_env(st.home)
    env.update({"OPENAI_BASE_URL": st.url + "/v1", "OPENAI_API_KEY": "sk-test-not-a-real-key",
                "OPENAI_MODEL": qw.MODEL, "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1"})
    base = [str(qw.qwen_bin()), "--auth-type", "openai", "--yolo", "-o", "stream-json"]
    runs = []
    for name, args in (("first", [qw.PROMPT]), ("continue", ["--continue", cc.PROMPT2])):
        run = h.run(base + args, env, proj, qw.TIMEOUT, log=st.work / f"{name}-client.log")
        assert not run.timed_out and run.code == 0, run.tail()
        runs.append(len(st.tap.model_requests()))
    reqs = st.tap.model_requests()
    st.settle()
    # `--continue` resends the first message without its date reminder: another
    # fingerprint, so its own ledger session (Qwen Code sends no session id).
    sessions = st.ledger.sessions()
    assert len(sessions) == 2, [dict(s) for s in sessions]
    for (lo, hi, least), s in zip([(0, runs[0], 2), (runs[0], runs[1], 1)], sessions):
        info = ac.check_stub_upstream("chat", reqs[lo:hi], st.data / "sessions" / s["id"])
        assert len(info["cut_seqs"]) >= least, f"expected cuts, got {info['cut_seqs']}"
    # QWEN.md is in the system prompt: never cut.
    assert all("QWEN_RULE_MARKER" in r["json"]["messages"][0]["content"] for r in reqs)
    past = check_kept("chat", reqs, "This is the Qwen Code. We are setting up the context", qw.PROMPT)
    assert past >= 1, f"turn 1 never left the window whole: {past}"
    check_kept("chat", reqs, "The following skills are available for use with the Skill tool", qw.PROMPT)
