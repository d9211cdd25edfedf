"""mini-swe-agent (`mini`, LitellmModel with an `openai/` model) through
oceancode-proxy.

mini-swe-agent calls litellm, which calls the OpenAI SDK (Chat Completions,
not streamed); `-c model.model_kwargs.api_base=...` points it at the proxy.
LITELLM_LOCAL_MODEL_COST_MAP keeps litellm on the cost map it ships,
MSWEA_CONFIGURED skips the first-run setup prompt, `-y --exit-immediately`
makes it headless, `-l 0` lifts the cost limit.

31 model calls (30 bash actions run in the project directory, then the
submission command) at a 20k line: cuts, every upstream request valid, one
ledger session (no header names it: the proxy's fingerprint of system prompt
and first message), exit 0, and the trajectory file mini-swe-agent writes
agrees with the ledger message for message.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

import agentcheck as ac
import harness as h

STEPS = 30
LINE = "20k"
TIMEOUT = 240
TASK = "Work through the numbered steps in this directory."
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def command(i: int) -> str:
    if i % 3 == 0:
        return f"echo 'step {i} done' > out_{i}.txt && wc -c out_{i}.txt"
    return f"seq {i * 10000} {i * 10000 + 1500}" if i % 2 else f"cat notes{i % 10}.txt"


def script() -> dict:
    replies = [{"text": f"Step {i}: running it.", "tool_calls": [{"name": "bash", "input": {"command": command(i)}}]}
               for i in range(1, STEPS + 1)]
    replies.append({"text": "All steps done.", "tool_calls": [{"name": "bash", "input": {"command": SUBMIT}}]})
    return {"replies": replies}


def make_project(proj: Path) -> None:
    proj.mkdir(parents=True, exist_ok=True)
    for i in range(10):
        (proj / f"notes{i}.txt").write_text("".join(
            f"line {j} of notes {i}: the quick brown fox jumps over the lazy dog\n" for j in range(150)))


@pytest.fixture(scope="module")
def mini(tmp_path_factory):
    import conftest
    pytest.importorskip("minisweagent", reason="mini-swe-agent is not installed (clients/run.sh installs it)")
    work = tmp_path_factory.mktemp("mini")
    st = conftest.Stack(work, script=script(), tideline=LINE)
    proj = work / "proj"
    make_project(proj)
    traj = work / "trajectory.json"
    env = h.base_env(st.home)
    env.update({
        "OPENAI_API_KEY": "sk-test-not-a-real-key",
        "MSWEA_CONFIGURED": "true",
        "MSWEA_SILENT_STARTUP": "1",
        "MSWEA_GLOBAL_CONFIG_DIR": str(st.home / "mini-swe-agent"),
        "MSWEA_COST_TRACKING": "ignore_errors",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    })
    if os.environ.get("PYTHONPATH"):  # clients/run.sh without venv: a --target install
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    cmd = [sys.executable, "-m", "minisweagent.run.mini", "-m", "openai/gpt-4.1", "-t", TASK,
           "-y", "--exit-immediately", "-l", "0", "-o", str(traj),
           "-c", "mini.yaml", "-c", f"model.model_kwargs.api_base={st.url}/v1"]
    run = h.run(cmd, env, proj, TIMEOUT, log=work / "client.log")
    st.settle()
    yield st, run, proj, traj
    st.close()


def trajectory(traj: Path) -> dict:
    assert traj.exists(), "mini-swe-agent wrote no trajectory"
    return json.loads(traj.read_text())


def test_mini_swe_agent_runs_30_bash_steps_and_submits(mini):
    st, run, proj, traj = mini
    assert not run.timed_out and run.code == 0, run.tail()
    t = trajectory(traj)
    assert t["info"]["exit_status"] == "Submitted", t["info"]
    assert t["info"]["model_stats"]["api_calls"] == STEPS + 1
    # The actions really ran, in the project directory.
    for i in range(3, STEPS + 1, 3):
        assert (proj / f"out_{i}.txt").read_text() == f"step {i} done\n"
    outputs = [m["content"] for m in t["messages"] if m["role"] == "tool"]
    assert any("line 149 of notes 2" in o for o in outputs)


def test_mini_swe_agent_across_cuts_one_session(mini):
    st, run, _, _ = mini
    reqs = st.tap.model_requests()
    assert len(reqs) == STEPS + 1
    bad = [(q["seq"], q["status"]) for q in reqs if q["status"] != 200]
    assert not bad and not st.fake_errors(), (bad, st.fake_errors())
    sessions = st.ledger.sessions()
    assert len(sessions) == 1, [dict(s) for s in sessions]
    sid = sessions[0]["id"]
    assert sessions[0]["dialect"] == "openai_chat"
    cuts = st.ledger.cuts(sid)
    assert len(cuts) >= 4, f"expected several cuts at a {LINE} line: {[dict(c) for c in cuts]}"
    ac.check_stub_upstream("chat", reqs, st.data / "sessions" / sid)
    ac.check_gauge_follows_usage(st.ledger, sid)
    assert not st.ledger.q("SELECT * FROM branches WHERE session=?", sid)


def same_message(traj_msg: dict, row: dict) -> bool:
    """A trajectory message and a ledger row say the same thing: role,
    content, tool calls (id, name, arguments), tool_call_id."""
    def calls(m):
        return [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in m.get("tool_calls") or []]

    return (traj_msg["role"] == row.get("role")
            and (traj_msg.get("content") or "") == (row.get("content") or "")
            and calls(traj_msg) == calls(row)
            and traj_msg.get("tool_call_id") == row.get("tool_call_id"))


def test_mini_swe_agent_trajectory_agrees_with_the_ledger_row_for_row(mini):
    st, _, _, traj = mini
    msgs = trajectory(traj)["messages"]
    # The trajectory ends with the submission's (unsent) observation and an
    # `exit` entry: neither was ever sent to the model.
    assert msgs[-1]["role"] == "exit" and msgs[-2]["role"] == "tool", [m["role"] for m in msgs[-3:]]
    sent = msgs[:-2]
    sid = st.ledger.sessions()[0]["id"]
    rows = st.ledger.rows(sid)
    assert len(rows) == len(sent), (len(rows), len(sent))
    for i, (m, r) in enumerate(zip(sent, rows)):
        raw = json.loads(r["raw"])
        assert same_message(m, raw), f"message {i} differs:\ntrajectory: {json.dumps(m)[:400]}\nledger: {r['raw'][:400]}"
    assert rows[-1]["from_response"] and SUBMIT in rows[-1]["raw"]
    assert [r["kind"] for r in rows[:2]] == ["system", "prompt"]
