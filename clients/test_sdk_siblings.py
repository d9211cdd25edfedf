"""An SDK script started twice at once (pass@k sampling, a fleet running one prompt):
the real `anthropic` and `openai` SDKs in two processes against one proxy, with the
same system prompt and first message and no session header. Each copy is its own
ledger session — the second a sibling linked to the first at the shared opening —
cut under the 20k line with its own stub, its upstream requests holding only its own
messages, and the ledger writes each message once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import agentcheck as ac
import harness as h

HERE = Path(__file__).resolve().parent
STEPS = 12  # tool calls per copy, on average
LINE, BLOCK = 20_000, 14_000


@pytest.mark.parametrize("sdk,client,dialect,opening", [
    ("anthropic", "anthropic-sdk", "anthropic", 1),
    ("openai", "openai-sdk", "chat", 2),
], ids=["anthropic", "openai-chat"])
def test_an_sdk_script_started_twice_at_once_is_two_sibling_sessions(make_stack, sdk, client, dialect, opening):
    # Tool calls for both (consumed in whatever order the two copies ask), then
    # each copy's final answer.
    calls = [{"text": f"Call {i}.", "tool_calls": [{"name": "get_weather", "input": {"city": f"city {i}"}}]}
             for i in range(2 * STEPS)]
    st = make_stack(script={"replies": calls, "default": {"text": "All done. FINAL_ANSWER_MARKER"}},
                    tideline="20k")
    markers = ["agent-one-checkout", "agent-two-checkout"]
    env = h.base_env(st.home)
    env["PYTHONPATH"] = ":".join(p for p in [str(HERE), *sys.path] if p)
    procs = [subprocess.Popen([sys.executable, str(HERE / "sdk_agent.py"), sdk, st.url, m], env=env,
                              cwd=str(HERE), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for m in markers]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))

    # Every upstream request was valid and held one agent's messages only.
    reqs = st.tap.model_requests()
    assert len(reqs) == 2 * STEPS + 2
    assert all(q["status"] == 200 for q in reqs), [q["status"] for q in reqs]
    mine = {m: [] for m in markers}
    for q in reqs:
        who = [m for m in markers if m in q["body"]]
        assert len(who) <= 1, f"an upstream request mixes agents: {who}"
        if who:
            mine[who[0]].append(q)

    st.settle()
    sessions = [s for s in st.ledger.sessions() if s["client"] == client]
    assert len(sessions) == 2, [dict(s) for s in st.ledger.sessions()]
    first, sibling = sessions
    assert first["parent"] is None
    assert sibling["parent"] == first["id"] and sibling["parent_seq"] == opening, dict(sibling)
    rows = {s["id"]: [r for r in st.ledger.rows(s["id"]) if not r["hidden"]] for s in sessions}
    owner = {}
    for sid, rs in rows.items():
        text = "".join(r["raw"] for r in rs)
        who = [m for m in markers if m in text]
        assert len(who) == 1, f"session {sid} holds {who}"
        owner[who[0]] = sid
    written = st.ledger.q("SELECT COUNT(*) AS n FROM rows")[0]["n"]
    # What the proxy saw of each copy: every message (each ends on an answer).
    messages = sum(o["messages"] for o in outs)
    assert written <= 1.05 * messages, (written, messages)
    assert not st.ledger.q("SELECT * FROM branches"), "no branch"
    for m, o in zip(markers, outs):
        sid = owner[m]
        assert st.ledger.cuts(sid), f"{m} was never cut"
        ac.check_stub_upstream(dialect, mine[m], st.data / "sessions" / sid)
        assert max(o["windows"]) < LINE + BLOCK, o["windows"]
