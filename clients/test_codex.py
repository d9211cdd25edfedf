"""Codex CLI (`codex exec --json`, custom provider, wire_api = "responses")
through `oceancode-proxy run`.

A 20-step exec_command session (seq / cat, a few thousand tokens per output) with
a fixed 20k tideline: cut several times, Codex finishes and never compacts, the
ledger holds every item verbatim (checked against Codex's own rollout file), and
`codex exec resume --last` lands in the same ledger session.

`model_auto_compact_token_limit = 60000`: the whole session is ~100k tokens, so
without the proxy Codex compacts (test_control_without_proxy_codex_compacts);
through the proxy the usage it sees is that of the cut window (< 35k).

Codex learns the proxy's port from OPENAI_BASE_URL (set by `run`) through a
`-c model_providers.oceancode.base_url=...` override: a custom provider's
base_url does not read the environment.
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
CALLS = STEPS
LINE = "20k"
LINE_TOKENS = 20_000
BLOCK_TOKENS = 14_000
TIMEOUT = 240
PROMPT = "Work through the numbered steps in this directory."
PROMPT2 = "Now do four more steps, please."
MODEL = "gpt-5-codex"
# The fake's streams end a moment after their last event (see tap.py), as a
# provider's may: Codex stops reading at `response.completed` and closes the
# connection, so every response ends, for the proxy, with the client cancelling.
END_DELAY_MS = 200

CONFIG = """\
model = "{model}"
model_provider = "oceancode"
model_auto_compact_token_limit = 60000
# No network beyond the provider: no curated-plugin sync (github.com, chatgpt.com).
[features]
plugins = false
remote_plugin = false

[model_providers.oceancode]
name = "OpenAI via oceancode-proxy"
base_url = "{base_url}"
env_key = "OPENAI_API_KEY"
wire_api = "responses"
"""


def codex_bin() -> Path:
    p = h.NODE_BIN / "codex"
    require_client(p)
    return p


def make_project(proj: Path) -> None:
    proj.mkdir(parents=True, exist_ok=True)
    for i in range(2, 64, 2):
        (proj / f"notes{i}.txt").write_text("".join(
            f"line {j} of notes {i}: the quick brown fox jumps over the lazy dog\n" for j in range(300)))


def script_for(steps: int, first: int = 1, final: str = "All steps done. FINAL_ANSWER_MARKER",
               parallel_every: int = 0):
    replies = []
    for i in range(first, first + steps):
        cmd = f"seq {i * 10000} {i * 10000 + 1500}" if i % 2 else f"cat notes{i}.txt"
        calls = [{"name": "exec_command", "input": {"cmd": cmd}}]
        if parallel_every and i % parallel_every == 0:  # a second, tiny call in parallel
            calls.append({"name": "exec_command", "input": {"cmd": f"echo done {i}"}})
        replies.append({"text": f"Step {i}.", "thinking": f"Step {i} of the plan comes next.", "tool_calls": calls})
    return {"replies": replies, "default": {"text": final}}


class Upstream:
    def __init__(self, work: Path, script: dict, name: str, end_delay_ms: int = 0):
        self.work = work
        self.fake = h.start_fake(work, script, name=f"{name}-fakeup")
        self.tap = h.start_tap(work, self.fake.url, name=f"{name}-tap", end_delay_ms=end_delay_ms)

    def stop(self):
        self.tap.stop()
        self.fake.stop()


class CodexRun:
    pass


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


def run_codex(work: Path, name: str, up: Upstream, args: list[str], proxy: bool = True) -> CodexRun:
    o = CodexRun()
    o.work, o.home, o.proj, o.data = work, work / "home", work / "proj", work / "data"
    o.codex_home = work / "codex_home"
    o.home.mkdir(exist_ok=True)
    o.codex_home.mkdir(exist_ok=True)
    (o.codex_home / "config.toml").write_text(CONFIG.format(model=MODEL, base_url="http://127.0.0.1:9/v1"))
    env = h.base_env(o.home)
    env.update({"OPENAI_API_KEY": "sk-test-not-a-real-key", "CODEX_HOME": str(o.codex_home),
                "RUST_LOG": "warn", "OCEANCODE_LOG": "info,oceancode_proxy=debug"})
    codex = [str(codex_bin()), "exec", "--skip-git-repo-check", "--json", *args]
    before = len(up.tap.model_requests(quiesce=False))
    if proxy:
        # The provider's base_url comes from OPENAI_BASE_URL, which `run` sets.
        wrapped = ["sh", "-c", 'exec "$0" "$@" -c "model_providers.oceancode.base_url=\\"$OPENAI_BASE_URL\\""']
        cmd = [str(h.PROXY_BIN), "--data-dir", str(o.data), "run", "--tideline", LINE,
               "--anthropic-upstream", up.tap.url, "--openai-upstream", up.tap.url, "--",
               *wrapped, *codex]
    else:
        cmd = [*codex, "-c", f'model_providers.oceancode.base_url="{up.tap.url}/v1"']
    o.run = h.run(cmd, env, o.proj, TIMEOUT, log=work / f"{name}-client.log")
    o.events = events(o.run.stdout)
    o.reqs = up.tap.model_requests()[before:]
    o.fake_log = up.fake.read_log()
    o.session_dirs = [Path(x) for x in re.findall(r"oceancode-proxy: ledger (\S+)", o.run.stderr)]
    return o


def compaction_requests(reqs: list[dict]) -> list[int]:
    """Codex's own compaction: `request_kind: compaction` in its turn metadata,
    or the checkpoint-compaction prompt as the last input item."""
    found = []
    for r in reqs:
        meta = r["headers"].get("x-codex-turn-metadata") or "{}"
        try:
            kind = json.loads(meta).get("request_kind")
        except ValueError:
            kind = None
        items = (r["json"] or {}).get("input") or []
        last = ac.message_text(items[-1]) if items and isinstance(items[-1], dict) else ""
        if kind == "compaction" or "COMPACTION" in last or re.search(r"handoff summary", last, re.I):
            found.append(r["seq"])
    return found


def rollout_tools(codex_home: Path):
    calls, outputs = {}, {}
    files = sorted((codex_home / "sessions").rglob("rollout-*.jsonl"))
    assert files, f"Codex wrote no rollout under {codex_home}/sessions"
    for f in files:
        for line in f.read_text().splitlines():
            x = json.loads(line)
            p = x.get("payload") or {}
            if x.get("type") != "response_item":
                continue
            if p.get("type") == "function_call":
                calls[p["call_id"]] = (p["name"], p["arguments"])
            elif p.get("type") == "function_call_output":
                outputs[p["call_id"]] = p["output"]
    return calls, outputs


def ledger_tools(rows):
    calls, outputs = {}, {}
    for r in rows:
        m = json.loads(r["raw"])
        if m.get("type") == "function_call":
            calls[m["call_id"]] = (m["name"], m["arguments"])
        elif m.get("type") == "function_call_output":
            outputs[m["call_id"]] = m["output"]
    return calls, outputs


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    work = tmp_path_factory.mktemp("codex")
    make_project(work / "proj")
    first = script_for(STEPS)
    second = script_for(4, first=STEPS + 1)
    script = {"replies": first["replies"] + [first["default"]] + second["replies"],
              "default": second["default"]}
    up = Upstream(work, script, "codex", end_delay_ms=END_DELAY_MS)
    yield up
    up.stop()


@pytest.fixture(scope="module")
def first(upstream):
    return run_codex(upstream.work, "first", upstream, [PROMPT])


@pytest.fixture(scope="module")
def resumed(first, upstream):
    assert first.run.code == 0, first.run.tail()
    return run_codex(upstream.work, "resume", upstream, ["resume", "--last", PROMPT2])


def final_message(o: CodexRun) -> str:
    msgs = [e["item"].get("text", "") for e in o.events
            if e.get("type") == "item.completed" and e.get("item", {}).get("type") == "agent_message"]
    return msgs[-1] if msgs else ""


def check_completed(o: CodexRun):
    r = o.run
    assert not r.timed_out, f"Codex hung:\n{r.tail()}"
    assert r.code == 0, r.tail()
    assert any(e.get("type") == "turn.completed" for e in o.events), r.tail()
    assert not [e for e in o.events if e.get("type") in ("turn.failed", "error")], r.tail()
    assert "FINAL_ANSWER_MARKER" in final_message(o)
    compacted = [e for e in o.events if "compact" in json.dumps(e.get("item", {}).get("type", ""))]
    assert not compacted, f"Codex compacted: {compacted}"
    assert not compaction_requests(o.reqs), "Codex sent a compaction request upstream"


def main_session(o: CodexRun, led: h.Ledger):
    assert len(o.session_dirs) == 1, f"expected one ledger session, `run` printed {o.session_dirs}\n{o.run.tail()}"
    sid = o.session_dirs[0].name
    rows = led.rows(sid)
    assert rows, f"no rows for {sid}"
    return sid, rows


def test_codex_completes_without_compacting(first):
    check_completed(first)
    cmds = [e["item"] for e in first.events
            if e.get("type") == "item.completed" and e.get("item", {}).get("type") == "command_execution"]
    assert len(cmds) == CALLS, [c.get("command") for c in cmds]
    assert all(c.get("exit_code") == 0 for c in cmds), cmds[:2]


def test_codex_tideline_cuts_and_upstream_sees_stub(first):
    check_completed(first)
    led = h.Ledger(first.data)
    sid, rows = main_session(first, led)
    s = led.q("SELECT * FROM sessions WHERE id=?", sid)[0]
    assert s["client"] == "codex" and s["dialect"] in ("openai_responses", "responses", "OpenaiResponses"), dict(s)
    cuts = led.cuts(sid)
    assert len(cuts) >= 3, f"expected several cuts at a {LINE} line, got {[dict(c) for c in cuts]}"
    info = ac.check_stub_upstream("responses", first.reqs, first.session_dirs[0])
    assert set(info["cut_seqs"]) <= {c["upto_seq"] for c in cuts}
    bad = [(q["seq"], q["status"]) for q in first.reqs if q["status"] != 200]
    assert not bad, f"upstream errors: {bad}"
    assert not re.search(r"-> [45]\d\d", first.fake_log), "the fake answered an error"
    totals = [int(x) for x in re.findall(r"POST /v1/responses -> 200 .*total_input_tokens: (\d+)", first.fake_log)]
    totals = totals[: len(first.reqs)]
    assert max(totals) < LINE_TOKENS + BLOCK_TOKENS, f"upstream window overshot: {max(totals)}"
    # Row estimates are calibrated to the provider's own count (the fake counts
    # text, not JSON punctuation): the conversation is over 3x the line.
    assert sum(r["tokens"] for r in rows) > 3 * LINE_TOKENS
    ac.check_transcripts(first.session_dirs[0], ["10000\n10001", "line 299 of notes 2"])
    ac.check_gauge_follows_usage(led, sid)
    led.close()


def test_codex_ledger_holds_every_item_verbatim(first):
    check_completed(first)
    led = h.Ledger(first.data)
    sid, rows = main_session(first, led)
    assert not led.q("SELECT * FROM branches WHERE session=?", sid), "unexpected branch"
    ac.check_rows_verbatim(rows, [q["json"]["input"] for q in first.reqs], "responses")
    r_calls, r_outputs = rollout_tools(first.codex_home)
    l_calls, l_outputs = ledger_tools(rows)
    assert len(r_calls) == CALLS
    assert l_calls == r_calls
    assert l_outputs == r_outputs
    assert any(PROMPT in r["raw"] for r in rows if r["kind"] == "prompt")
    assert "FINAL_ANSWER_MARKER" in rows[-1]["raw"]
    led.close()


def test_codex_resume_maps_to_the_same_session(first, resumed):
    check_completed(resumed)
    assert resumed.session_dirs == first.session_dirs, (resumed.session_dirs, first.session_dirs)
    led = h.Ledger(resumed.data)
    sid = first.session_dirs[0].name
    assert [s["id"] for s in led.sessions() if s["client"] == "codex"] == [sid]
    rows = led.rows(sid)
    assert [x for x in rows if PROMPT2 in x["raw"] and x["kind"] == "prompt"], "the resume prompt is not a row"
    calls, outputs = ledger_tools(rows)
    assert len(calls) == CALLS + 4 and len(outputs) == CALLS + 4
    branches = led.q("SELECT * FROM branches WHERE session=?", sid)
    assert not branches, f"resume recorded a branch: {[dict(b) for b in branches]}"
    ac.check_rows_verbatim(rows, [q["json"]["input"] for q in first.reqs + resumed.reqs], "responses")
    ac.check_stub_upstream("responses", first.reqs + resumed.reqs, first.session_dirs[0])
    ac.check_gauge_follows_usage(led, sid)
    led.close()


def test_codex_parallel_tool_calls_across_cuts(tmp_path):
    """Every step makes two exec_command calls at once (a big output and a tiny
    one): in the Responses input they are four separate items, and no cut may
    start the window between them."""
    make_project(tmp_path / "proj")
    up = Upstream(tmp_path, script_for(14, parallel_every=1), "parallel", end_delay_ms=END_DELAY_MS)
    try:
        o = run_codex(tmp_path, "parallel", up, [PROMPT])
    finally:
        up.stop()
    bad = [(q["seq"], q["status"], q["response"][:200]) for q in o.reqs if q["status"] != 200]
    assert not bad, f"the upstream rejected a cut window: {bad}"
    check_completed(o)
    led = h.Ledger(o.data)
    sid, rows = main_session(o, led)
    assert len(led.cuts(sid)) >= 2
    ac.check_stub_upstream("responses", o.reqs, o.session_dirs[0])
    led.close()


def serve_codex(st, args: list[str]) -> CodexRun:
    """Codex against `oceancode-proxy serve` (a static base_url in config.toml)."""
    o = CodexRun()
    o.work, o.home, o.proj, o.data = st.work, st.home, st.work / "proj", st.data
    o.codex_home = st.work / "codex_home"
    o.codex_home.mkdir(exist_ok=True)
    (o.codex_home / "config.toml").write_text(CONFIG.format(model=MODEL, base_url=st.url + "/v1"))
    env = h.base_env(o.home)
    env.update({"OPENAI_API_KEY": "sk-test-not-a-real-key", "CODEX_HOME": str(o.codex_home), "RUST_LOG": "warn"})
    o.run = h.run([str(codex_bin()), "exec", "--skip-git-repo-check", "--json", *args], env, o.proj, TIMEOUT,
                  log=st.work / "client.log")
    o.events = events(o.run.stdout)
    o.reqs = st.tap.model_requests()
    return o


def test_codex_context_length_exceeded_is_absorbed_by_the_proxy(make_stack):
    """`serve` at its default line, against an upstream whose real context is only
    40k: the proxy learns the ceiling from `context_length_exceeded`, cuts and
    retries once; Codex never sees the error and never compacts."""
    st = make_stack(script=script_for(STEPS), max_context=40_000)
    make_project(st.work / "proj")
    o = serve_codex(st, [PROMPT])
    check_completed(o)
    statuses = [q["status"] for q in o.reqs]
    assert 400 in statuses, "the upstream never said the context was exceeded: the test proves nothing"
    i = statuses.index(400)
    assert "context_length_exceeded" in o.reqs[i]["response"]
    assert statuses[i + 1] == 200 and h.STUB_PREFIX in o.reqs[i + 1]["body"]
    assert h.metrics(st.proxy.url).get("oceancode_too_long_retries_total", 0) >= 1


def test_codex_context_overflow_inside_the_stream_is_absorbed_by_the_proxy(make_stack):
    """The same 40k upstream, which now reports the overflow inside its 200 stream
    (`response.created`, `response.in_progress`, `response.failed` with
    `context_length_exceeded`, what Codex turns into `turn.failed`): the proxy holds
    back only the stream's opening events, cuts and retries once, and Codex never
    sees the failure nor compacts."""
    st = make_stack(script=script_for(STEPS), max_context=40_000, fake_args=["--overflow-in-stream"])
    make_project(st.work / "proj")
    o = serve_codex(st, [PROMPT])
    check_completed(o)
    failed = [k for k, q in enumerate(o.reqs) if "response.failed" in q["response"]]
    assert failed, "the upstream never overflowed: the test proves nothing"
    for k in failed:
        assert "context_length_exceeded" in o.reqs[k]["response"]
        assert o.reqs[k]["status"] == 200
        assert h.STUB_PREFIX in o.reqs[k + 1]["body"] and "response.completed" in o.reqs[k + 1]["response"]
    assert h.metrics(st.proxy.url).get("oceancode_too_long_retries_total", 0) >= len(failed)


def test_control_without_proxy_codex_fails_on_an_overflow_inside_the_stream(make_stack):
    """Not a proxy test: proves the check above can fail. Straight to the same
    upstream, Codex gets the failed stream (and fails the turn, or compacts)."""
    st = make_stack(script=script_for(STEPS), max_context=40_000, fake_args=["--overflow-in-stream"],
                    proxy=False)
    make_project(st.work / "proj")
    o = serve_codex(st, [PROMPT])
    assert not o.run.timed_out, o.run.tail()
    assert [q for q in o.reqs if "response.failed" in q["response"]], "no overflow: the control proves nothing"
    failed = [e for e in o.events if e.get("type") in ("turn.failed", "error")]
    assert failed or compaction_requests(o.reqs), o.run.tail()


def test_codex_upstream_error_exit_code(tmp_path):
    """An upstream 400 reaches Codex unchanged (`turn.failed` with the provider's
    message) and `run` exits with Codex's exit code, as without the proxy."""
    body = {"error": {"message": "FAKE_BAD_REQUEST: input.0 is wrong", "type": "invalid_request_error",
                      "param": "input", "code": None}}
    (tmp_path / "proj").mkdir()
    up = Upstream(tmp_path, {"replies": [], "default": {"error": {"status": 400, "body": body}}}, "err")
    try:
        o = run_codex(tmp_path, "err", up, [PROMPT])
        direct = run_codex(tmp_path, "err-direct", up, [PROMPT], proxy=False)
    finally:
        up.stop()
    assert not o.run.timed_out and direct.run.code != 0, direct.run.tail()
    assert o.run.code == direct.run.code
    failed = [e for e in o.events if e.get("type") == "turn.failed"]
    assert failed and "FAKE_BAD_REQUEST: input.0 is wrong" in json.dumps(failed), o.run.tail()


def test_control_without_proxy_codex_compacts(tmp_path):
    """Not a proxy test: proves the no-compaction check can fail. The same
    session straight to the fake upstream makes Codex compact."""
    make_project(tmp_path / "proj")
    up = Upstream(tmp_path, script_for(STEPS), "control")
    try:
        o = run_codex(tmp_path, "control", up, [PROMPT], proxy=False)
    finally:
        up.stop()
    assert o.run.code == 0, o.run.tail()
    assert compaction_requests(o.reqs), "without the proxy Codex did not compact: the check proves nothing"


# ---------------------------------------------------------------- remote compaction

BUILTIN_CONFIG = """\
model = "{model}"
# Codex's built-in OpenAI provider, pointed at the proxy: the one that
# compacts remotely (a custom provider compacts locally, with a summary turn).
openai_base_url = "{base_url}"
model_auto_compact_token_limit = 25000
[features]
plugins = false
remote_plugin = false
"""


def compaction_script() -> dict:
    """22 steps; step 7's output alone is bigger than the window Codex
    accepts (25k), so Codex compacts although the proxy keeps the line
    (with `ledger.compress` the windows Codex is billed for are smaller, so
    it compacts later: the steps after it still reach the line)."""
    replies = []
    for i in range(1, 23):
        cmd = "seq 1 9000" if i == 7 else (f"seq {i * 10000} {i * 10000 + 1500}" if i % 2 else f"cat notes{i}.txt")
        replies.append({"text": f"Step {i}.", "tool_calls": [{"name": "exec_command", "input": {"cmd": cmd}}]})
    return {"replies": replies, "default": {"text": "All steps done. FINAL_ANSWER_MARKER"}}


def test_codex_remote_compaction_v2_passes_through_and_is_a_branch_across_the_tideline(make_stack):
    """Codex 0.171.0 compacts remotely with a `compaction_trigger` as the last
    input item of a /v1/responses request (V2; `remote_compaction_v2` is
    "removed", i.e. always on, so V1's POST /v1/responses/compact is tested
    through the SDK in test_openai_sdk.py). Through the proxy, at a 20k line:
    the compaction request goes upstream untouched (the whole history, no
    stub), is not recorded, and the compacted history Codex continues with is
    a branch of the same session, cut again by the tideline."""
    st = make_stack(script=compaction_script(), tideline=LINE)
    make_project(st.work / "proj")
    o = CodexRun()
    o.work, o.home, o.proj, o.data = st.work, st.home, st.work / "proj", st.data
    o.codex_home = st.work / "codex_home"
    o.codex_home.mkdir()
    (o.codex_home / "config.toml").write_text(BUILTIN_CONFIG.format(model=MODEL, base_url=st.proxy.url + "/v1"))
    env = h.base_env(o.home)
    env.update({"OPENAI_API_KEY": "sk-test-not-a-real-key", "CODEX_HOME": str(o.codex_home), "RUST_LOG": "warn"})
    o.run = h.run([str(codex_bin()), "exec", "--skip-git-repo-check", "--json", PROMPT], env, o.proj, TIMEOUT,
                  log=st.work / "client.log")
    o.events = events(o.run.stdout)
    r = o.run
    assert not r.timed_out and r.code == 0, r.tail()
    assert not [e for e in o.events if e.get("type") in ("turn.failed", "error")], r.tail()
    assert "FINAL_ANSWER_MARKER" in final_message(o)

    # The WebSocket Codex tries first got 426 from the proxy: never upstream.
    assert all(e["method"] == "POST" for e in st.tap.entries()), [e["method"] for e in st.tap.entries()]
    reqs = st.tap.model_requests()
    assert all(q["status"] == 200 for q in reqs), [(q["seq"], q["status"], q["response"][:200]) for q in reqs]
    kinds = [json.loads(q["headers"].get("x-codex-turn-metadata") or "{}").get("request_kind") for q in reqs]
    comp = [i for i, k in enumerate(kinds) if k == "compaction"]
    assert comp, "Codex never compacted: the test proves nothing"
    first_cut = next((i for i, q in enumerate(reqs) if h.STUB_PREFIX in q["body"]), None)
    assert first_cut is not None and first_cut < comp[0], "no cut before the first compaction"
    for i in comp:
        inp = reqs[i]["json"]["input"]
        assert inp[-1] == {"type": "compaction_trigger"}
        assert h.STUB_PREFIX not in reqs[i]["body"], "the compaction request was windowed"
        assert "10000\\n10001" in reqs[i]["body"] or i > comp[0], "the compaction request lost the cut rows"
    # Codex's own record: the compaction replaced its history.
    rollout = "\n".join(p.read_text() for p in (o.codex_home / "sessions").rglob("rollout-*.jsonl"))
    assert '"type":"compacted"' in rollout

    st.settle()
    led = st.ledger
    sessions = led.sessions()
    assert [s["client"] for s in sessions] == ["codex"], [dict(s) for s in sessions]
    sid = sessions[0]["id"]
    branches = led.q("SELECT * FROM branches WHERE session=? ORDER BY branch", sid)
    assert len(branches) == len(comp), ([dict(b) for b in branches], comp)
    assert all(b["at_seq"] > 0 for b in branches), "the compacted history lost the session's root"
    rows = led.rows(sid)
    assert not [x for x in rows if "compaction_trigger" in x["raw"]], "the compaction request was recorded"
    items = [x for x in rows if json.loads(x["raw"]).get("type") == "compaction"]
    assert len(items) == len(comp) and not items[-1]["hidden"]
    cuts = led.cuts(sid)
    assert [c for c in cuts if c["upto_seq"] > items[0]["seq"]], f"no cut after the compaction: {[dict(c) for c in cuts]}"
    # Every cut window after a compaction still carries that compaction's item.
    enc = [json.loads(x["raw"])["encrypted_content"] for x in items]
    cut_after = 0
    for j, q in enumerate(reqs):
        k = sum(1 for i in comp if i < j) - 1
        if k >= 0 and h.STUB_PREFIX in q["body"]:
            cut_after += 1
            assert enc[k] in q["body"], f"request {q['seq']} (a cut window) lost the compaction item"
    assert cut_after, "no cut window after a compaction"
