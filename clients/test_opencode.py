"""opencode (`opencode run --format json`, headless) through oceancode-proxy.

opencode talks to providers declared in an opencode.json (OPENCODE_CONFIG): the
built-in Anthropic provider with its `baseURL` set to the proxy, or an
OpenAI-compatible one (`@ai-sdk/openai-compatible`, bundled in the binary:
nothing is installed at run time). OPENCODE_DISABLE_MODELS_FETCH keeps it off
models.dev (it uses the snapshot it ships), `autoupdate: false` off its update
check, `--title` skips the title request. The project is its own git
repository: opencode snapshots its project's work tree at every step.

- 26 bash steps in four runs (`opencode run`, then `--continue` three times)
  at a 20k line: many cuts, every upstream request valid (the fake validates),
  one ledger session keyed by opencode's `x-session-id`. With
  `compaction.prune` on, opencode clears old tool outputs at the end of the
  third run ("[Old tool result content cleared]" in place of the output): the
  fourth run's resend is an echo of the recorded rows, not a rewind (no
  branch; the ledger keeps the outputs).
- The OpenAI-compatible provider (Chat Completions): 10 steps, cuts, one session.
- A model whose context opencode believes is 24k: opencode compacts (its
  summary request: no tools, the conversation as one text message) and starts
  over from the summary. The summary request is forwarded untouched and not
  recorded; each restart is a branch of the same session.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

import agentcheck as ac
import harness as h
from conftest import require_client

LINE = "20k"
TIMEOUT = 240
PROMPT = "Work through the numbered steps in this directory."
SUMMARY = "Summary: the numbered steps so far ran seq and cat; continue with the next one."
MODEL = "claude-sonnet-4-5"
CLEARED = "[Old tool result content cleared]"


def opencode_bin() -> Path:
    p = h.NODE_BIN / "opencode"
    require_client(p)
    return p


def make_project(proj: Path) -> None:
    proj.mkdir(parents=True, exist_ok=True)
    # Its own repository: opencode snapshots its project's work tree with git
    # at every step (prune needs the snapshots), and the project would
    # otherwise be the whole oceancode-proxy checkout around clients/.work.
    subprocess.run(["git", "init", "-q", str(proj)], check=True)
    for i in range(2, 40, 2):
        (proj / f"notes{i}.txt").write_text("".join(
            f"line {j} of notes {i}: the quick brown fox jumps over the lazy dog\n" for j in range(300)))


def steps(first: int, n: int, final: str) -> list[dict]:
    out = []
    for i in range(first, first + n):
        cmd = f"seq {i * 10000} {i * 10000 + 1500}" if i % 2 else f"cat notes{i}.txt"
        out.append({"text": f"Step {i}.",
                    "tool_calls": [{"name": "bash", "input": {"command": cmd, "description": f"step {i}"}}]})
    out.append({"text": final})
    return out


def config(base_url: str, provider: str = "anthropic", context: int | None = None, prune: bool = False) -> dict:
    cfg = {
        "$schema": "https://opencode.ai/config.json",
        "autoupdate": False,
        "share": "disabled",
        "compaction": {"auto": True, "prune": prune},
        # The git snapshot of the work tree at every step: prune needs it,
        # the other runs are quicker without.
        "snapshot": prune,
    }
    if provider == "anthropic":
        p = {"options": {"baseURL": base_url + "/v1", "apiKey": "sk-ant-test-not-a-real-key"}}
        if context:
            p["models"] = {MODEL: {"limit": {"context": context, "output": 4000}}}
        cfg["model"] = f"anthropic/{MODEL}"
        cfg["provider"] = {"anthropic": p}
    else:
        cfg["model"] = "oceancode/gpt-4.1"
        cfg["provider"] = {"oceancode": {
            "npm": "@ai-sdk/openai-compatible",
            "name": "OpenAI-compatible via oceancode-proxy",
            "options": {"baseURL": base_url + "/v1", "apiKey": "sk-test-not-a-real-key"},
            "models": {"gpt-4.1": {"name": "gpt-4.1", "limit": {"context": 1_000_000, "output": 32_768}}},
        }}
    return cfg


class Run:
    pass


def run_opencode(st, cfg: dict, args: list[str], name: str) -> Run:
    o = Run()
    o.proj = st.work / "proj"
    cfg_path = st.work / "opencode.json"
    cfg_path.write_text(json.dumps(cfg, indent=1))
    env = h.base_env(st.home)
    env.update({
        "OPENCODE_CONFIG": str(cfg_path),
        "OPENCODE_DISABLE_MODELS_FETCH": "true",
        "OPENCODE_DISABLE_AUTOUPDATE": "true",
        "OPENCODE_DISABLE_SHARE": "true",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "true",
    })
    cmd = [str(opencode_bin()), "run", "--format", "json", "--print-logs", *args]
    o.run = h.run(cmd, env, o.proj, TIMEOUT, log=st.work / f"{name}-client.log")
    o.events = [json.loads(l) for l in o.run.stdout.splitlines() if l.startswith("{")]
    return o


def check_run(o: Run, tools: int):
    r = o.run
    assert not r.timed_out, f"opencode hung:\n{r.tail()}"
    assert r.code == 0, r.tail()
    assert not [e for e in o.events if e.get("type") == "error"], r.tail()
    used = [e for e in o.events if e.get("type") == "tool_use"]
    assert len(used) == tools, f"{len(used)} tool steps, expected {tools}\n{r.tail()}"
    assert all(e["part"]["state"]["status"] == "completed" for e in used), used[:1]
    texts = [e["part"]["text"] for e in o.events if e.get("type") == "text"]
    assert texts and "FINAL_ANSWER_MARKER" in texts[-1], texts[-3:]


def session_id(o: Run) -> str:
    ids = {e["sessionID"] for e in o.events if "sessionID" in e}
    assert len(ids) == 1, ids
    return ids.pop()


def one_session(st, client_key: str):
    sessions = st.ledger.sessions()
    assert [(s["client"], s["client_session"]) for s in sessions] == [("opencode", client_key)], \
        [dict(s) for s in sessions]
    sid = sessions[0]["id"]
    return sid, st.data / "sessions" / sid


def upstream_ok(st):
    bad = [(q["seq"], q["status"], q["response"][:300]) for q in st.tap.model_requests() if q["status"] != 200]
    assert not bad, f"the upstream refused a request: {bad}"
    assert not st.fake_errors(), st.fake_errors()


@pytest.fixture(scope="module")
def anthropic_runs(tmp_path_factory):
    import conftest
    work = tmp_path_factory.mktemp("opencode")
    script = {"replies": steps(1, 20, "Steps 1-20 done. FINAL_ANSWER_MARKER")
              + steps(21, 2, "Steps 21-22 done. FINAL_ANSWER_MARKER")
              + steps(23, 2, "Steps 23-24 done. FINAL_ANSWER_MARKER")
              + steps(25, 2, "Steps 25-26 done. FINAL_ANSWER_MARKER"),
              "default": {"text": "Nothing left. FINAL_ANSWER_MARKER"}}
    st = conftest.Stack(work, script=script, tideline=LINE)
    make_project(work / "proj")
    cfg = config(st.url, prune=True)
    runs = [run_opencode(st, cfg, ["--title", "numbered steps", PROMPT], "run1")]
    for n, ask in enumerate(["Two more steps, please.", "And two more.", "The last two."], start=2):
        if runs[-1].run.code != 0:
            break
        runs.append(run_opencode(st, cfg, ["--continue", ask], f"run{n}"))
    st.settle()
    yield st, runs
    st.close()


def test_opencode_26_steps_in_one_session_across_cuts(anthropic_runs):
    st, runs = anthropic_runs
    assert len(runs) == 4
    for o, n in zip(runs, (20, 2, 2, 2)):
        check_run(o, n)
    assert len({session_id(o) for o in runs}) == 1, "opencode started another session"
    upstream_ok(st)
    sid, sdir = one_session(st, f"opencode:{session_id(runs[0])}")
    cuts = st.ledger.cuts(sid)
    assert len(cuts) >= 4, f"expected several cuts at a {LINE} line: {[dict(c) for c in cuts]}"
    reqs = st.tap.model_requests()
    assert len(reqs) == 26 + 4, len(reqs)
    info = ac.check_stub_upstream("anthropic", reqs, sdir)
    assert set(info["cut_seqs"]) <= {c["upto_seq"] for c in cuts}
    ac.check_transcripts(sdir, ["10000\n10001", "line 299 of notes 2"])
    ac.check_gauge_follows_usage(st.ledger, sid)
    # opencode's own usage view is the cut window's: it never compacts.
    assert not [q for q in reqs if not q["json"].get("tools")], "opencode sent a tool-less (summary) request"


def test_opencode_prune_is_not_a_branch(anthropic_runs):
    """opencode cleared old tool outputs after the third run; the fourth run's
    resend carries "[Old tool result content cleared]" in their place: the
    proxy takes them as the recorded rows (no branch, no row appended twice),
    keeps the outputs in the ledger and forwards the client's bytes."""
    st, runs = anthropic_runs
    pruned = [n for n, o in enumerate(runs, start=1) if re.search(r"message=pruned count=\d+", o.run.stderr)]
    assert pruned, "opencode pruned nothing: the test proves nothing\n" + runs[-1].run.stderr[-2000:]
    assert pruned[0] < len(runs), f"opencode pruned only after the last run ({pruned})"
    sid, _ = one_session(st, f"opencode:{session_id(runs[0])}")
    branches = st.ledger.q("SELECT * FROM branches WHERE session=?", sid)
    assert not branches, f"the pruned resend was taken for a rewind: {[dict(b) for b in branches]}"
    rows = st.ledger.rows(sid)
    assert [r["seq"] for r in rows] == list(range(1, len(rows) + 1))
    assert not [r["seq"] for r in rows if r["hidden"]]
    assert not [r for r in rows if CLEARED in r["raw"]], "a cleared output replaced the recorded one"
    results = [r for r in rows if r["kind"] == "tool_result"]
    assert len(results) == 26, f"{len(results)} tool-result rows for 26 steps (appended twice?)"
    assert any("line 299 of notes 2" in r["raw"] for r in results)


def test_opencode_openai_compatible_provider_across_cuts(make_stack):
    st = make_stack(script={"replies": steps(1, 10, "Ten steps done. FINAL_ANSWER_MARKER")}, tideline=LINE)
    make_project(st.work / "proj")
    o = run_opencode(st, config(st.url, provider="openai"), ["--title", "numbered steps", PROMPT], "chat")
    check_run(o, 10)
    upstream_ok(st)
    reqs = st.tap.model_requests()
    assert {q["path"] for q in reqs} == {"/v1/chat/completions"}
    sid, sdir = one_session(st, f"opencode:{session_id(o)}")
    assert st.ledger.sessions()[0]["dialect"] == "openai_chat"
    assert len(st.ledger.cuts(sid)) >= 2
    ac.check_stub_upstream("chat", reqs, sdir)


def test_opencode_compaction_is_a_branch_of_its_session(make_stack):
    """opencode believes the model's context is 24k (usable 20k) and the line is
    30k: opencode compacts before the proxy cuts."""
    script = {"replies": steps(1, 10, "Ten steps done. FINAL_ANSWER_MARKER"), "no_tools": {"text": SUMMARY}}
    st = make_stack(script=script, tideline="30k")
    make_project(st.work / "proj")
    o = run_opencode(st, config(st.url, context=24_000), ["--title", "numbered steps", PROMPT], "compact")
    check_run(o, 10)
    upstream_ok(st)
    reqs = st.tap.model_requests()
    summaries = [q for q in reqs if not q["json"].get("tools")]
    assert summaries, "opencode never compacted: the test proves nothing"
    for q in summaries:
        assert "summarization" in json.dumps(q["json"]["system"]), q["json"]["system"]
        assert h.STUB_PREFIX not in q["body"], "the summary request was windowed"
    st.settle()
    sid, _ = one_session(st, f"opencode:{session_id(o)}")
    branches = st.ledger.q("SELECT * FROM branches WHERE session=? ORDER BY branch", sid)
    assert len(branches) == len(summaries), (len(branches), len(summaries))
    rows = st.ledger.rows(sid)
    assert not [r for r in rows if "Here is the conversation so far" in r["raw"]], "the summary request was recorded"
    assert [r for r in rows if SUMMARY in r["raw"] and not r["hidden"]], "the summary is not on the active line"
    first = next(r for r in rows if "Work through the numbered steps" in r["raw"])
    assert first["hidden"], "the pre-compaction line is still active"
