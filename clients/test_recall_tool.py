"""Claude Code and Codex CLI with the in-band recall tool on (`ledger.recall_tool`).

    real client ──► client tap ──► oceancode-proxy serve ──► tap ──► fakeup
                    (what the         (OCEANCODE_RECALL_TOOL=1)  (what the
                     client sent                                  upstream saw)
                     and got)

The fake is scripted to make the model call `oceancode_recall` twice in a
tool session: once alone (the proxy answers it and continues upstream) and
once next to one of the client's own tool calls (the proxy answers it, hides
it, and the client gets its own call only). The agent must never see the
tool or its calls (not in what it got, not in what it sent, not in its own
transcript), its session must go on and finish normally, the ledger must be
what the client sent (the verbatim rows, no recall anywhere in them, the
calls in the steps' detail), and the upstream must see the tool, the same in
every request, and both exchanges re-inserted in the requests after them.
"""

from __future__ import annotations

import json
import agentcheck as ac
import harness as h
import test_claude_code as cc
import test_codex as cx

RECALL = "oceancode_recall"
TIMEOUT = 240
PROMPT = "Work through the numbered steps in this directory."
FINAL = "All steps done. FINAL_ANSWER_MARKER"


def stack_with_client_tap(make_stack, script: dict, end_delay_ms: int = 0):
    st = make_stack(script=script, proxy_env={"OCEANCODE_RECALL_TOOL": "1"}, end_delay_ms=end_delay_ms)
    st.client_tap = h.start_tap(st.work, st.proxy.url, name="client-tap")
    st.procs.append(st.client_tap)
    return st


def tools_of(req: dict) -> list:
    return (req["json"] or {}).get("tools") or []


def tool_names(req: dict) -> list[str]:
    return [t.get("name") or (t.get("function") or {}).get("name") for t in tools_of(req)]


def check_upstream(up_reqs: list[dict], client_reqs: list[dict], conv: str):
    """The upstream saw the tool in every request, the same each time, one
    continuation more than the client sent, and the exchanges re-inserted."""
    assert up_reqs and client_reqs
    bad = [(q["seq"], q["status"], q["response"][:300]) for q in up_reqs if q["status"] != 200]
    assert not bad, f"the upstream rejected a request: {bad}"
    main = [q for q in up_reqs if tools_of(q)]
    assert all(tool_names(q)[-1] == RECALL for q in main), [tool_names(q) for q in main]
    first = json.dumps(tools_of(main[0]))
    assert all(json.dumps(tools_of(q)) == first for q in main), "the tools changed within the session"
    # One continuation: the upstream got one request more than the client sent.
    assert len(up_reqs) == len(client_reqs) + 1, (len(up_reqs), len(client_reqs))
    # The requests after the second recall carry both exchanges (two calls of the tool).
    last = json.dumps((up_reqs[-1]["json"] or {}).get(conv))
    assert last.count(f'"{RECALL}"') == 2, "both exchanges are re-inserted in the last request"


def named(text: str) -> bool:
    """`text` (JSON, maybe inside an SSE stream) names the tool as a tool or
    a call's name. (Its name alone may come in the client's own context:
    Claude Code quotes the repository's recent commit messages.)"""
    return f'"name":"{RECALL}"' in text.replace(" ", "") or f'\\"name\\":\\"{RECALL}' in text


def check_client_never_saw_it(client_reqs: list[dict], stdout: str):
    for q in client_reqs:
        assert RECALL not in tool_names(q), f"the client declared the tool (request {q['seq']})"
        assert not named(q["body"]), f"the client sent a call of the tool (request {q['seq']})"
        assert not named(q["response"]), f"the client got a call of the tool (request {q['seq']})"
    assert not named(stdout), "the agent reported a call of the tool"


def check_ledger(led: h.Ledger, sid: str, client_reqs: list[dict], conv: str, dialect: str):
    rows = led.rows(sid)
    assert rows, f"no rows for {sid}"
    assert not [r["seq"] for r in rows if named(r["raw"])], "a ledger row holds a call of the tool"
    # The rows are what the client sent, verbatim, every one of them.
    ac.check_rows_verbatim(rows, [(q["json"] or {}).get(conv) or [] for q in client_reqs], dialect)
    recalls = []
    for s in led.steps(sid):
        d = json.loads(s["detail"]) if s["detail"] else {}
        recalls += d.get("recalls", [])
    assert [r["continued"] for r in recalls] == [True, False], recalls
    assert all(r.get("after") for r in recalls), "each exchange records the row it follows"
    assert FINAL in rows[-1]["raw"]


# ---------------------------------------------------------------- Claude Code

def cc_script() -> dict:
    def bash(cmd: str, i: int) -> dict:
        return {"name": "Bash", "input": {"command": cmd, "description": f"Step {i}"}}
    return {"replies": [
        {"text": "Step 1.", "tool_calls": [bash("seq 10000 10300", 1)]},
        {"text": "Step 2.", "tool_calls": [bash("cat notes2.txt", 2)]},
        # Alone: answered and continued by the proxy; the continuation's answer is step 3.
        {"tool_calls": [{"name": RECALL, "input": {"match": "notes"}}]},
        {"text": "Step 3.", "tool_calls": [bash("seq 30000 30300", 3)]},
        # Next to the client's own call: the client gets the Bash call only.
        {"text": "Step 4.", "tool_calls": [{"name": RECALL, "input": {"seq": 2}}, bash("cat notes4.txt", 4)]},
        {"text": "Step 5.", "tool_calls": [bash("seq 50000 50300", 5)]},
    ], "default": {"text": FINAL}}


def test_claude_code_with_the_recall_tool_never_sees_it(make_stack):
    st = stack_with_client_tap(make_stack, cc_script())
    proj = st.work / "proj"
    cc.make_project(proj)
    env = cc.cc_env(st.home)
    env["ANTHROPIC_BASE_URL"] = st.client_tap.url
    r = h.run(cc.cc_cmd(PROMPT), env, proj, TIMEOUT, log=st.work / "claude-client.log")
    assert not r.timed_out and r.code == 0, r.tail()
    evs = cc.events(r.stdout)
    results = [e for e in evs if e.get("type") == "result"]
    assert results and not results[-1].get("is_error"), r.tail()
    assert "FINAL_ANSWER_MARKER" in results[-1].get("result", ""), r.tail()

    client_reqs = st.client_tap.model_requests()
    up_reqs = st.tap.model_requests()
    check_client_never_saw_it(client_reqs, r.stdout)
    # Claude Code's own record: its tool calls and results are its own; none failed.
    sid_cc = next(e["session_id"] for e in evs if e.get("session_id"))
    uses, res = cc.cc_transcript(st.home, sid_cc)
    assert RECALL not in json.dumps(uses)
    assert len(uses) == 5 and len(res) == 5, (uses, res)
    assert "No such tool" not in json.dumps(res)
    check_upstream(up_reqs, client_reqs, "messages")

    st.settle()
    led = h.Ledger(st.data)
    sessions = [s for s in led.sessions() if s["client"] == "claude-code"]
    assert len(sessions) == 1, [dict(s) for s in led.sessions()]
    sid = sessions[0]["id"]
    check_ledger(led, sid, client_reqs, "messages", "anthropic")
    l_uses, l_results = cc.ledger_tools(led.rows(sid))
    assert l_uses == uses and l_results == res, "the ledger's calls are Claude Code's"
    assert h.metrics(st.proxy.url).get("oceancode_recalls_total") == 2
    led.close()


# ---------------------------------------------------------------- Codex CLI

def codex_script() -> dict:
    ex = lambda i: {"name": "exec_command", "input": {"cmd": f"seq {i * 10000} {i * 10000 + 300}"}}  # noqa: E731
    return {"replies": [
        {"text": "Step 1.", "tool_calls": [ex(1)]},
        {"text": "Step 2.", "tool_calls": [{"name": "exec_command", "input": {"cmd": "cat notes2.txt"}}]},
        {"tool_calls": [{"name": RECALL, "input": {"match": "notes"}}]},
        {"text": "Step 3.", "tool_calls": [ex(3)]},
        {"text": "Step 4.", "tool_calls": [{"name": RECALL, "input": {"seq": 2}}, ex(4)]},
        {"text": "Step 5.", "tool_calls": [ex(5)]},
    ], "default": {"text": FINAL}}


def test_codex_with_the_recall_tool_never_sees_it(make_stack):
    st = stack_with_client_tap(make_stack, codex_script(), end_delay_ms=cx.END_DELAY_MS)
    proj = st.work / "proj"
    cx.make_project(proj)
    codex_home = st.work / "codex_home"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(cx.CONFIG.format(model=cx.MODEL, base_url=st.client_tap.url + "/v1"))
    env = h.base_env(st.home)
    env.update({"OPENAI_API_KEY": "sk-test-not-a-real-key", "CODEX_HOME": str(codex_home), "RUST_LOG": "warn"})
    r = h.run([str(cx.codex_bin()), "exec", "--skip-git-repo-check", "--json", PROMPT], env, proj, TIMEOUT,
              log=st.work / "codex-client.log")
    o = cx.CodexRun()
    o.run, o.events = r, cx.events(r.stdout)
    o.reqs = st.tap.model_requests()
    assert not r.timed_out and r.code == 0, r.tail()
    assert any(e.get("type") == "turn.completed" for e in o.events), r.tail()
    assert not [e for e in o.events if e.get("type") in ("turn.failed", "error")], r.tail()
    assert "FINAL_ANSWER_MARKER" in cx.final_message(o), r.tail()

    client_reqs = st.client_tap.model_requests()
    check_client_never_saw_it(client_reqs, r.stdout)
    # Codex's own record: only its exec_command calls, each answered.
    r_calls, r_outputs = cx.rollout_tools(codex_home)
    assert RECALL not in json.dumps(r_calls)
    assert len(r_calls) == 5 and set(r_outputs) == set(r_calls), (r_calls, r_outputs)
    check_upstream(o.reqs, client_reqs, "input")

    st.settle()
    led = h.Ledger(st.data)
    sessions = [s for s in led.sessions() if s["client"] == "codex"]
    assert len(sessions) == 1, [dict(s) for s in led.sessions()]
    sid = sessions[0]["id"]
    check_ledger(led, sid, client_reqs, "input", "responses")
    l_calls, l_outputs = cx.ledger_tools(led.rows(sid))
    assert l_calls == r_calls and l_outputs == r_outputs, "the ledger's calls are Codex's"
    assert h.metrics(st.proxy.url).get("oceancode_recalls_total") == 2
    led.close()
