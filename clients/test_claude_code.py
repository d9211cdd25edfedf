"""Claude Code (headless `-p`, stream-json) through `oceancode-proxy run`.

A 20-step Bash/Read tool session (each tool result a few thousand tokens) on a
temp project, with a fixed 20k tideline: the window sent upstream must be cut
several times, Claude Code must finish cleanly and never compact, the ledger
must hold every row verbatim, and `--continue` must land in the same ledger
session.

Claude Code's auto-compact window is set to 100k (CLAUDE_CODE_AUTO_COMPACT_WINDOW,
its smallest effective value: compaction fires near 67k of reported context), and
the whole session is ~115k tokens: without the proxy it compacts
(test_control_without_proxy_claude_code_compacts proves the check can fail), with
the proxy the usage it sees is the real usage of the cut window, ~26k at most.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import agentcheck as ac
import harness as h
from conftest import require_client

STEPS = 20
CALLS = STEPS + STEPS // 5  # every fifth step makes two parallel calls
LINE = "20k"
LINE_TOKENS = 20_000
BLOCK_TOKENS = 14_000  # default block: 70% of the line
TIMEOUT = 240
PROMPT = "Work through the numbered steps in this directory."
PROMPT2 = "Now do four more steps, please."


def claude_bin() -> Path:
    p = h.NODE_BIN / "claude"
    require_client(p)
    return p


def make_project(proj: Path) -> None:
    proj.mkdir(parents=True, exist_ok=True)
    for i in range(2, 64, 2):
        (proj / f"notes{i}.txt").write_text("".join(
            f"line {j} of notes {i}: the quick brown fox jumps over the lazy dog\n" for j in range(300)))


def script_for(proj: Path, steps: int, first: int = 1, final: str = "All steps done. FINAL_ANSWER_MARKER"):
    replies = []
    for i in range(first, first + steps):
        if i % 2:
            call = {"name": "Bash", "input": {"command": f"seq {i * 10000} {i * 10000 + 1500}",
                                              "description": f"Print the numbers of step {i}"}}
        else:
            call = {"name": "Read", "input": {"file_path": str(proj / f"notes{i}.txt")}}
        calls = [call]
        if i % 5 == 0:  # now and then two tool calls in parallel
            calls.append({"name": "Bash", "input": {"command": "seq 1 800", "description": "More numbers"}})
        replies.append({"text": f"Step {i}.", "thinking": f"Step {i} of the plan comes next.", "tool_calls": calls})
    return {"replies": replies, "default": {"text": final}}


def cc_env(home: Path) -> dict:
    env = h.base_env(home)
    env.update({
        "ANTHROPIC_API_KEY": "sk-ant-test-not-a-real-key",
        "DISABLE_TELEMETRY": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_AUTO_COMPACT_WINDOW": "100000",
        "OCEANCODE_LOG": "info,oceancode_proxy=debug",
    })
    return env


def cc_cmd(prompt: str, *extra: str) -> list[str]:
    return [str(claude_bin()), "-p", prompt, "--output-format", "stream-json", "--verbose",
            "--allowedTools", "Bash,Read", *extra]


def events(out: str) -> list[dict]:
    evs = []
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                evs.append(json.loads(line))
            except ValueError:
                pass
    return evs


def compaction_requests(reqs: list[dict]) -> list[int]:
    """Upstream requests that are Claude Code's own compaction: the last user
    message carries a text block asking for a summary."""
    found = []
    for r in reqs:
        msgs = (r["json"] or {}).get("messages") or []
        users = [m for m in msgs if m.get("role") == "user"]
        if not users:
            continue
        c = users[-1].get("content")
        texts = [c] if isinstance(c, str) else [b.get("text", "") for b in c or [] if b.get("type") == "text"]
        # Not the context Claude Code adds (its gitStatus quotes the repository's
        # recent commit messages, which may say "summary").
        texts = [re.sub(r"<system-reminder>.*?</system-reminder>", "", t, flags=re.S) for t in texts]
        if any(re.search(r"\bsummary\b", t, re.I) for t in texts):
            found.append(r["seq"])
    return found


def cc_transcript(home: Path, session_id: str):
    files = list((home / ".claude" / "projects").glob(f"*/{session_id}.jsonl"))
    assert files, f"Claude Code wrote no transcript for {session_id} under {home}/.claude/projects"
    uses, results = {}, {}
    for line in files[0].read_text().splitlines():
        x = json.loads(line)
        m = x.get("message")
        if not isinstance(m, dict) or not isinstance(m.get("content"), list):
            continue
        for b in m["content"]:
            if b.get("type") == "tool_use":
                uses[b["id"]] = (b["name"], b["input"])
            elif b.get("type") == "tool_result":
                results[b["tool_use_id"]] = b.get("content")
    return uses, results


def ledger_tools(rows) -> tuple[dict, dict]:
    uses, results = {}, {}
    for r in rows:
        m = json.loads(r["raw"])
        if isinstance(m.get("content"), list):
            for b in m["content"]:
                if b.get("type") == "tool_use":
                    uses[b["id"]] = (b["name"], b["input"])
                elif b.get("type") == "tool_result":
                    results[b["tool_use_id"]] = b.get("content")
    return uses, results


class CCRun:
    pass


class Upstream:
    """fake ─ tap, shared by the runs of one Claude Code session (the fake's
    tool-call ids and prompt cache carry over, as with a real provider)."""

    def __init__(self, work: Path, script: dict, name: str, end_delay_ms: int = 0):
        self.fake = h.start_fake(work, script, name=f"{name}-fakeup")
        self.tap = h.start_tap(work, self.fake.url, name=f"{name}-tap", end_delay_ms=end_delay_ms)

    def stop(self):
        self.tap.stop()
        self.fake.stop()


def run_cc(work: Path, name: str, up: Upstream, prompt: str, *extra: str, proxy: bool = True) -> CCRun:
    """One Claude Code run: fake ─ tap ─ [oceancode-proxy run] ─ claude."""
    o = CCRun()
    o.work, o.home, o.proj, o.data = work, work / "home", work / "proj", work / "data"
    o.home.mkdir(exist_ok=True)
    o.tap, o.fake = up.tap, up.fake
    before = len(up.tap.model_requests(quiesce=False))
    env = cc_env(o.home)
    if proxy:
        cmd = [str(h.PROXY_BIN), "--data-dir", str(o.data), "run", "--tideline", LINE,
               "--anthropic-upstream", up.tap.url, "--openai-upstream", up.tap.url, "--",
               *cc_cmd(prompt, *extra)]
    else:
        env["ANTHROPIC_BASE_URL"] = up.tap.url
        cmd = cc_cmd(prompt, *extra)
    o.run = h.run(cmd, env, o.proj, TIMEOUT, log=work / f"{name}-client.log")
    o.events = events(o.run.stdout)
    o.reqs = up.tap.model_requests()[before:]
    o.fake_log = up.fake.read_log()
    m = re.findall(r"oceancode-proxy: ledger (\S+)", o.run.stderr)
    o.session_dirs = [Path(x) for x in m]
    return o


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    work = tmp_path_factory.mktemp("claude_code")
    make_project(work / "proj")
    first = script_for(work / "proj", STEPS)
    second = script_for(work / "proj", 4, first=STEPS + 1)
    # First run: STEPS tool calls then its final answer; --continue: 4 more, then the default.
    script = {"replies": first["replies"] + [first["default"]] + second["replies"],
              "default": second["default"]}
    up = Upstream(work, script, "cc")
    up.work = work
    yield up
    up.stop()


@pytest.fixture(scope="module")
def first(upstream):
    o = run_cc(upstream.work, "first", upstream, PROMPT)
    # What the ledger held after the first run (the --continue run must only append).
    led = h.Ledger(o.data)
    try:
        o.rows_after = [(r["seq"], r["raw"], r["from_response"])
                        for r in led.q("SELECT seq, raw, from_response FROM rows ORDER BY session, seq")]
    except Exception:  # no ledger: the tests report why
        o.rows_after = []
    led.close()
    return o


@pytest.fixture(scope="module")
def cont(first, upstream):
    assert first.run.code == 0, first.run.tail()
    return run_cc(first.work, "continue", upstream, PROMPT2, "--continue")


def main_session(o: CCRun, ledger: h.Ledger):
    assert len(o.session_dirs) == 1, f"expected one ledger session, `run` printed {o.session_dirs}\n{o.run.tail()}"
    sid = o.session_dirs[0].name
    rows = ledger.rows(sid)
    assert rows, f"no rows for {sid}"
    return sid, rows


def test_claude_code_completes_without_compacting(first):
    r = first.run
    assert not r.timed_out, f"Claude Code hung:\n{r.tail()}"
    assert r.code == 0, r.tail()
    result = [e for e in first.events if e.get("type") == "result"]
    assert result, f"no result event:\n{r.tail()}"
    assert result[-1].get("subtype") == "success" and not result[-1].get("is_error"), result[-1]
    assert "FINAL_ANSWER_MARKER" in (result[-1].get("result") or "")
    assert result[-1].get("num_turns", 0) >= STEPS
    compact = [e for e in first.events if e.get("subtype") == "compact_boundary"]
    assert not compact, f"Claude Code compacted: {compact}"
    assert not compaction_requests(first.reqs), "Claude Code sent a compaction request upstream"
    # Every tool ran and its result went back.
    tool_results = [e for e in first.events if e.get("type") == "user"]
    assert len(tool_results) >= STEPS


def test_claude_code_tideline_cuts_and_upstream_sees_stub(first):
    assert first.run.code == 0, first.run.tail()
    led = h.Ledger(first.data)
    sid, rows = main_session(first, led)
    s = led.q("SELECT * FROM sessions WHERE id=?", sid)[0]
    assert s["client"] == "claude-code"
    cuts = led.cuts(sid)
    assert len(cuts) >= 3, f"expected several cuts at a {LINE} line, got {[dict(c) for c in cuts]}"
    assert all(c["line"] == LINE_TOKENS for c in cuts)
    info = ac.check_stub_upstream("anthropic", first.reqs, first.session_dirs[0])
    assert set(info["cut_seqs"]) <= {c["upto_seq"] for c in cuts}
    # Every upstream answer was a 200: the cut windows were valid for the fake's validator.
    bad = [(q["seq"], q["status"]) for q in first.tap.entries() if q["status"] != 200]
    assert not bad, f"upstream errors: {bad}"
    assert not re.search(r"-> [45]\d\d", first.fake_log), "the fake answered an error"
    # The window stayed bounded while the conversation kept growing.
    totals = [int(x) for x in re.findall(r"total_input_tokens: (\d+)", first.fake_log)]
    assert len(totals) == len(first.reqs)
    assert max(totals) < LINE_TOKENS + BLOCK_TOKENS, f"upstream window overshot: {max(totals)}"
    client_total = sum(r["tokens"] for r in rows)
    assert client_total > 4 * LINE_TOKENS, f"session too small to prove anything: {client_total}"
    # The usage Claude Code saw is the real usage of the cut window.
    usages = [e["message"]["usage"] for e in first.events if e.get("type") == "assistant"]
    seen = max(u.get("input_tokens", 0) + u.get("cache_read_input_tokens", 0)
               + u.get("cache_creation_input_tokens", 0) for u in usages)
    assert seen == max(totals)
    ac.check_transcripts(first.session_dirs[0], ["10000\n10001", "line 299 of notes 2"])
    ac.check_gauge_follows_usage(led, sid)
    led.close()


def test_claude_code_ledger_holds_every_row_verbatim(first):
    assert first.run.code == 0, first.run.tail()
    led = h.Ledger(first.data)
    sid, rows = main_session(first, led)
    assert not led.q("SELECT * FROM branches WHERE session=?", sid), "unexpected branch"
    ac.check_rows_verbatim(rows, [q["json"]["messages"] for q in first.reqs], "anthropic")
    # Against Claude Code's own transcript: same tool calls, byte-identical results.
    session_id = next(e["session_id"] for e in first.events if e.get("type") == "result")
    cc_uses, cc_results = cc_transcript(first.home, session_id)
    l_uses, l_results = ledger_tools(rows)
    assert len(cc_uses) == CALLS
    assert l_uses == cc_uses
    assert l_results == cc_results
    assert [u[0] for u in l_uses.values()].count("Bash") == STEPS // 2 + STEPS // 5
    # The prompt and the final answer are rows too.
    assert any(PROMPT in r["raw"] for r in rows if r["kind"] == "prompt")
    assert "FINAL_ANSWER_MARKER" in rows[-1]["raw"] and rows[-1]["role"] == "assistant"
    # `ledger list` (the CLI) agrees.
    out = h.run([str(h.PROXY_BIN), "--data-dir", str(first.data), "ledger", "list"],
                h.base_env(first.home), first.work, 30)
    assert out.code == 0 and sid in out.stdout and "claude-code" in out.stdout, out.tail()
    led.close()


def test_claude_code_continue_maps_to_the_same_session(first, cont):
    r = cont.run
    assert not r.timed_out, f"Claude Code --continue hung:\n{r.tail()}"
    assert r.code == 0, r.tail()
    result = [e for e in cont.events if e.get("type") == "result"]
    assert result and result[-1].get("subtype") == "success", r.tail()
    assert not [e for e in cont.events if e.get("subtype") == "compact_boundary"]
    assert not compaction_requests(cont.reqs)
    assert cont.session_dirs == first.session_dirs, (cont.session_dirs, first.session_dirs)
    led = h.Ledger(cont.data)
    sid = first.session_dirs[0].name
    sessions = [s for s in led.sessions() if s["client"] == "claude-code"]
    assert [s["id"] for s in sessions] == [sid]
    rows = led.rows(sid)
    new = [x for x in rows if PROMPT2 in x["raw"] and x["kind"] == "prompt"]
    assert new, "the --continue prompt is not a row of the session"
    assert max(x["turn"] for x in rows) >= 2
    uses, results = ledger_tools(rows)
    assert len(uses) == CALLS + 4 and len(results) == CALLS + 4
    branches = led.q("SELECT * FROM branches WHERE session=?", sid)
    assert not branches, f"--continue recorded a branch: {[dict(b) for b in branches]}"
    # Rows were appended, never rewritten: the first run's rows are a prefix.
    seqs = [x["seq"] for x in rows]
    assert seqs == list(range(1, len(seqs) + 1))
    # (A response row not yet echoed is confirmed by the client's echo: same message,
    # the client's bytes.)
    assert first.rows_after
    for (seq, raw, from_response), now in zip(first.rows_after, rows):
        assert now["seq"] == seq
        if from_response:
            assert ac.key(json.loads(now["raw"])) == ac.key(json.loads(raw)), seq
        else:
            assert now["raw"] == raw, f"row {seq} was rewritten"
    ac.check_rows_verbatim(rows, [q["json"]["messages"] for q in first.reqs + cont.reqs], "anthropic")
    # The resumed history is over the line at once: the upstream saw a stub again,
    # and a cut is never undone (the new proxy restores the cut point).
    ac.check_stub_upstream("anthropic", first.reqs + cont.reqs, first.session_dirs[0])
    ac.check_gauge_follows_usage(led, sid)
    led.close()


def test_control_without_proxy_claude_code_compacts(tmp_path):
    """Not a proxy test: proves the no-compaction check above can fail. The same
    session straight to the fake upstream makes Claude Code compact."""
    make_project(tmp_path / "proj")
    up = Upstream(tmp_path, script_for(tmp_path / "proj", STEPS), "control")
    try:
        o = run_cc(tmp_path, "control", up, PROMPT, proxy=False)
    finally:
        up.stop()
    assert o.run.code == 0, o.run.tail()
    compacted = [e for e in o.events if e.get("subtype") == "compact_boundary"] or compaction_requests(o.reqs)
    assert compacted, "without the proxy Claude Code did not compact: the no-compaction check proves nothing"


def serve_cc_clean(st, proj: Path, **env_extra: str) -> list[dict]:
    """Claude Code against `oceancode-proxy serve` (the stack's proxy): it must finish
    cleanly without compacting. Returns the upstream's model requests."""
    env = cc_env(st.home)
    env["ANTHROPIC_BASE_URL"] = st.proxy.url
    env.update(env_extra)
    r = h.run(cc_cmd(PROMPT), env, proj, TIMEOUT, log=st.work / "client.log")
    assert r.code == 0 and not r.timed_out, r.tail()
    evs = events(r.stdout)
    result = [e for e in evs if e.get("type") == "result"][-1]
    assert result["subtype"] == "success" and not result.get("is_error"), result
    assert "FINAL_ANSWER_MARKER" in result["result"]
    assert not [e for e in evs if e.get("subtype") == "compact_boundary"]
    reqs = st.tap.model_requests()
    assert not compaction_requests(reqs)
    return reqs


def claude_code_context(st) -> int:
    """The context window the proxy's meter holds for the one Claude Code session."""
    sessions = h.http_json(st.proxy.url + "/_oceancode/sessions")["sessions"]
    cc = [s for s in sessions if s["client"] == "claude-code"]
    assert len(cc) == 1, cc
    return cc[0]["meter"]["context"]


def test_claude_code_prompt_too_long_is_absorbed_by_the_proxy(make_stack, tmp_path):
    """`oceancode-proxy serve` at its default line, against an upstream whose real
    context is only 45k: when the conversation outgrows it, the upstream answers
    "prompt is too long"; the proxy learns the ceiling, cuts and retries once, so
    Claude Code never sees the error and never compacts."""
    proj = tmp_path / "proj"
    make_project(proj)
    st = make_stack(script=script_for(proj, STEPS), max_context=45_000)
    reqs = serve_cc_clean(st, proj)
    statuses = [q["status"] for q in reqs]
    assert statuses.count(400) >= 1, "the upstream never said the prompt was too long: the test proves nothing"
    first_400 = statuses.index(400)
    assert "prompt is too long" in reqs[first_400]["response"]
    assert statuses[first_400 + 1] == 200 and h.STUB_PREFIX in reqs[first_400 + 1]["body"], \
        "the retry after a too-long error must carry a cut window"
    m = h.metrics(st.proxy.url)
    assert m.get("oceancode_too_long_retries_total", 0) >= 1
    assert claude_code_context(st) == 45_000


def test_claude_code_input_plus_max_tokens_is_absorbed_by_the_proxy(make_stack, tmp_path):
    """An upstream of 60k that counts `max_tokens` against the context, as older
    Claude models do: once input + max_tokens is over it, it answers `input length
    and max_tokens exceed context limit: N + T > 60000`; the proxy learns the
    ceiling, cuts and retries once with Claude Code's own max_tokens, so Claude Code
    never sees the error (it would lower max_tokens itself) and never compacts."""
    proj = tmp_path / "proj"
    make_project(proj)
    st = make_stack(script=script_for(proj, STEPS), max_context=60_000, fake_args=["--count-max-tokens"])
    reqs = serve_cc_clean(st, proj, CLAUDE_CODE_MAX_OUTPUT_TOKENS="20000")
    statuses = [q["status"] for q in reqs]
    assert 400 in statuses, "the upstream never refused: the test proves nothing"
    for k, q in enumerate(reqs):
        if q["status"] == 400:
            assert "input length and `max_tokens` exceed context limit" in q["response"], q["response"]
            assert reqs[k + 1]["status"] == 200 and h.STUB_PREFIX in reqs[k + 1]["body"]
            assert reqs[k + 1]["json"]["max_tokens"] == q["json"]["max_tokens"], "max_tokens is never changed"
    assert claude_code_context(st) == 60_000


def test_claude_code_subagent_gets_a_linked_session(tmp_path):
    """The Agent tool: the sub-agent's requests (another system prompt and tools)
    become their own ledger session, linked to the parent."""
    make_project(tmp_path / "proj")
    replies = [
        {"text": "Step 1.", "tool_calls": [{"name": "Bash", "input": {"command": "seq 1 50", "description": "numbers"}}]},
        {"text": "Delegating.", "tool_calls": [{"name": "Agent", "input": {
            "description": "Count numbers", "prompt": "Run seq 1 100 and report how many lines.",
            "subagent_type": "general-purpose", "run_in_background": False}}]},
        {"text": "SUBAGENT_REPORT: 100 lines."},  # the sub-agent's only answer
    ]
    up = Upstream(tmp_path, {"replies": replies, "default": {"text": "All steps done. FINAL_ANSWER_MARKER"}}, "agent")
    try:
        o = run_cc(tmp_path, "agent", up, PROMPT)
    finally:
        up.stop()
    assert o.run.code == 0, o.run.tail()
    result = [e for e in o.events if e.get("type") == "result"][-1]
    assert result["subtype"] == "success" and "FINAL_ANSWER_MARKER" in result["result"]
    assert len(o.session_dirs) == 2, o.session_dirs
    led = h.Ledger(o.data)
    sessions = {s["id"]: s for s in led.sessions()}
    children = [s for s in sessions.values() if s["parent"]]
    parents = [s for s in sessions.values() if not s["parent"]]
    assert len(parents) == 1 and len(children) == 1, [dict(s) for s in sessions.values()]
    assert children[0]["parent"] == parents[0]["id"]
    assert any("SUBAGENT_REPORT" in r["raw"] for r in led.rows(children[0]["id"]))
    # The parent's rows carry the Agent call and its result, not the sub-agent's conversation.
    parent_rows = led.rows(parents[0]["id"])
    assert any('"name":"Agent"' in r["raw"] for r in parent_rows)
    assert not any("Run seq 1 100 and report" in r["raw"] and r["kind"] == "prompt" for r in parent_rows)
    led.close()


def test_claude_code_upstream_error_exit_code(tmp_path):
    """An upstream 400 reaches Claude Code unchanged (its own error handling runs)
    and `run` exits with Claude Code's exit code, as without the proxy. (A 400:
    Claude Code retries 401/429/5xx for minutes.)"""
    body = {"type": "error", "error": {"type": "invalid_request_error", "message": "FAKE_BAD_REQUEST: tools.0 is wrong"}}
    up = Upstream(tmp_path, {"replies": [], "default": {"error": {"status": 400, "body": body}}}, "err")
    (tmp_path / "proj").mkdir()
    try:
        o = run_cc(tmp_path, "err", up, PROMPT)
        env = cc_env(tmp_path / "home2")
        (tmp_path / "home2").mkdir()
        env["ANTHROPIC_BASE_URL"] = up.tap.url
        direct = h.run(cc_cmd(PROMPT), env, tmp_path / "proj", TIMEOUT, log=tmp_path / "err-direct.log")
    finally:
        up.stop()
    assert not o.run.timed_out and not direct.timed_out
    assert direct.code != 0, direct.tail()
    assert o.run.code == direct.code, (o.run.code, direct.code)
    result = [e for e in o.events if e.get("type") == "result"][-1]
    assert result.get("is_error") and result.get("api_error_status") == 400, result
    assert "FAKE_BAD_REQUEST: tools.0 is wrong" in o.run.stdout
