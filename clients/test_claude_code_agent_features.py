"""Claude Code 2.1.332's own agent features through `oceancode-proxy run`.

- Tasks: Claude Code keeps its list with `TaskCreate` / `TaskUpdate` (it has
  no `TodoWrite`: a call of it comes back `is_error`). After a cut, the state
  block lists the tasks with their latest status, and nothing from the
  rejected call.
- Auto mode: with `--permission-mode auto` Claude Code sends `safeguards` on
  every `/v1/messages` and reads `safeguard_results` (a verdict per tool call)
  from the answer; the fake upstream answers them. Through the proxy the
  server path stays on: every request upstream carries the client's
  `safeguards`, Claude Code sends none of its own classifier requests, and a
  command that needs a verdict runs.
"""

from __future__ import annotations

import re
from pathlib import Path

import harness as h
from test_claude_code import Upstream, cc_env, claude_bin, events

TIMEOUT = 240
STATE_HEAD = "[State at the tideline:"


def big_step(i: int) -> dict:
    return {"text": f"Step {i}.", "tool_calls": [{"name": "Bash", "input": {
        "command": f"seq {i * 10000} {i * 10000 + 1500}", "description": f"Print the numbers of step {i}"}}]}


def run_cc(work: Path, up: Upstream, prompt: str, *extra: str, env_extra: dict | None = None,
           line: str = "20k", log: str = "client.log") -> tuple[h.Run, list[dict]]:
    home, proj, data = work / "home", work / "proj", work / "data"
    home.mkdir(exist_ok=True)
    proj.mkdir(exist_ok=True)
    env = cc_env(home)
    env.update(env_extra or {})
    cmd = [str(h.PROXY_BIN), "--data-dir", str(data), "run", "--tideline", line,
           "--anthropic-upstream", up.tap.url, "--openai-upstream", up.tap.url, "--",
           str(claude_bin()), "-p", prompt, "--output-format", "stream-json", "--verbose", *extra]
    r = h.run(cmd, env, proj, TIMEOUT, log=work / log)
    return r, up.tap.model_requests()


def state_blocks(reqs: list[dict]) -> list[str]:
    """The state block of each upstream request that carries one."""
    out = []
    for q in reqs:
        for m in (q["json"] or {}).get("messages") or []:
            c = m.get("content")
            for b in c if isinstance(c, list) else []:
                t = b.get("text", "") if isinstance(b, dict) else ""
                if STATE_HEAD in t:
                    out.append(t[t.index(STATE_HEAD):])
    return out


def test_claude_code_tasks_are_in_the_state_block_with_their_latest_status(tmp_path):
    """TaskCreate ×2, TaskUpdate by id, a TodoWrite Claude Code rejects, then
    enough output to cut twice: the block after the cuts lists both tasks
    with their latest status, by id, and not the rejected list."""
    replies = [
        {"text": "Planning.", "tool_calls": [
            {"name": "TaskCreate", "input": {"subject": "Port the parser", "description": "Port it.",
                                             "activeForm": "Porting the parser"}}]},
        {"text": "More.", "tool_calls": [
            {"name": "TaskCreate", "input": {"subject": "Write the docs", "description": "Docs.",
                                             "activeForm": "Writing the docs"}}]},
        {"text": "Old habit.", "tool_calls": [
            {"name": "TodoWrite", "input": {"todos": [
                {"content": "GHOST_TODO from a rejected call", "status": "in_progress",
                 "activeForm": "Haunting"}]}}]},
        {"text": "Start.", "tool_calls": [{"name": "TaskUpdate", "input": {"taskId": "1", "status": "in_progress"}}]},
        *[big_step(i) for i in range(1, 4)],
        {"text": "Done with 1.", "tool_calls": [{"name": "TaskUpdate", "input": {"taskId": "1", "status": "completed"}}]},
        {"text": "Next.", "tool_calls": [{"name": "TaskUpdate", "input": {"taskId": "2", "status": "in_progress"}}]},
        *[big_step(i) for i in range(4, 10)],
    ]
    up = Upstream(tmp_path, {"replies": replies, "default": {"text": "All steps done. FINAL_ANSWER_MARKER"}}, "tasks")
    try:
        r, reqs = run_cc(tmp_path, up, "Work through the plan.",
                         "--allowedTools", "Bash,Read,TaskCreate,TaskUpdate,TaskList,TaskGet",
                         env_extra={"CLAUDE_CODE_ENABLE_TODO_TOOLS": "1"})
    finally:
        up.stop()
    assert r.code == 0, r.tail()
    evs = events(r.stdout)
    result = [e for e in evs if e.get("type") == "result"][-1]
    assert "FINAL_ANSWER_MARKER" in (result.get("result") or ""), result
    # What the client answered: the tasks were made (ids 1, 2) and updated;
    # the TodoWrite was refused.
    results = {}
    for e in evs:
        for b in (e.get("message") or {}).get("content") or []:
            if isinstance(b, dict) and b.get("type") == "tool_result":
                c = b.get("content")
                text = c if isinstance(c, str) else " ".join(x.get("text", "") for x in c or [])
                results[b["tool_use_id"]] = (text, bool(b.get("is_error")))
    texts = [t for t, _ in results.values()]
    assert any(t.startswith("Task #1 created successfully") for t in texts), texts
    assert any(t.startswith("Updated task #2") for t in texts), texts
    assert any(err for t, err in results.values() if "TodoWrite" in t or "No such tool" in t), \
        f"Claude Code took the TodoWrite call: the rejected-call check proves nothing: {texts}"
    blocks = state_blocks(reqs)
    assert blocks, "no cut carried a state block"
    last = blocks[-1]
    assert re.search(r"\n- \[x\] #1 Port the parser\n- \[~\] #2 Write the docs", last), last
    assert not any("GHOST_TODO" in b for b in blocks), "a rejected call was taken as the task list"


def test_claude_code_auto_mode_server_path_stays_on_through_the_proxy(tmp_path):
    """`--permission-mode auto`: every request upstream carries the client's
    `safeguards` (the server path), the answers' verdicts reach the client
    and decide (a command the fake flags is refused, the same command not
    flagged runs, before and after a cut), Claude Code never falls back to
    its own classifier requests, and the proxy records the one session."""
    keep, gone = tmp_path / "victim_flagged", tmp_path / "victim_cleared"
    keep.mkdir()
    gone.mkdir()
    rm = lambda d: {"name": "Bash", "input": {"command": f"rm -rf {d}", "description": "Delete a directory"}}
    replies = [
        {"text": "Deleting.", "tool_calls": [rm(keep)], "safeguard_outcome": "flagged"},
        *[big_step(i) for i in range(1, 7)],
        {"text": "Deleting the other.", "tool_calls": [rm(gone)]},
    ]
    up = Upstream(tmp_path, {"replies": replies, "default": {"text": "All steps done. FINAL_ANSWER_MARKER"}}, "auto")
    try:
        r, reqs = run_cc(tmp_path, up, "Clean up.", "--permission-mode", "auto",
                         "--debug-file", str(tmp_path / "cc-debug.log"))
    finally:
        up.stop()
    assert r.code == 0, r.tail()
    debug = (tmp_path / "cc-debug.log").read_text(errors="replace")
    main = [q for q in reqs if (q["json"] or {}).get("tools")]
    assert len(main) >= 8, [q["seq"] for q in reqs]
    missing = [q["seq"] for q in main if "safeguards" not in q["json"]]
    assert not missing, f"requests upstream without safeguards (the client fell back): {missing}\n{debug[-3000:]}"
    assert all(q["json"]["safeguards"][0]["type"] == "dangerous_tool_use" for q in main)
    assert h.STUB_PREFIX in main[-1]["body"], "no cut: the test proves nothing after a cut"
    classifier = [q["seq"] for q in reqs if "<transcript>" in q["body"] and not (q["json"] or {}).get("tools")]
    assert not classifier, f"Claude Code ran its own classifier: {classifier}"
    assert "classifies locally" not in debug and "no safeguard_results" not in debug, debug[-3000:]
    assert keep.exists(), f"the flagged call ran: the verdict never reached Claude Code\n{r.tail()}"
    assert "server-side auto mode classifier judged this action dangerous" in r.stdout, r.tail()
    assert not gone.exists(), f"the cleared call did not run\n{r.tail()}"
    led = h.Ledger(tmp_path / "data")
    try:
        assert len(led.sessions()) == 1, [dict(s) for s in led.sessions()]
    finally:
        led.close()
