"""The Python `anthropic` SDK through oceancode-proxy (`serve`), against the fake upstream:
non-streaming and streaming Messages, tool use, count_tokens, a long tool loop over the
tideline, and errors surfacing as the SDK's typed exceptions."""

from __future__ import annotations

import json
from pathlib import Path

import anthropic
import pytest

import agentcheck as ac
import harness as h
import sdkutil as su

MODEL = "claude-opus-5-5"
TOOLS = [{
    "name": "get_weather",
    "description": "Weather of a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}]


def test_messages_non_streaming(make_stack):
    st = make_stack(script=[{"text": "Hello from the fake. FINAL_ANSWER_MARKER"}])
    cap = su.Captured()
    c = su.anthropic_client(st.url, cap)
    msgs = [{"role": "user", "content": "Say hello."}]
    r = c.messages.create(model=MODEL, max_tokens=256, system="Be brief.", messages=msgs)
    assert r.content[0].type == "text" and "FINAL_ANSWER_MARKER" in r.content[0].text
    assert r.stop_reason == "end_turn"
    assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0
    # Under the line the proxy forwards the SDK's bytes untouched.
    up = su.upstream_bodies(st, "/v1/messages")
    assert [e["body"].encode() for e in up] == cap.bodies
    s, rows = su.session_rows(st, "anthropic-sdk")
    su.assert_rows_equal(rows, msgs + [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]}])
    steps = st.ledger.steps(s["id"])
    assert [x["status"] for x in steps] == [200]
    assert steps[0]["output"] == r.usage.output_tokens


def test_messages_streaming_with_thinking(make_stack):
    st = make_stack(script=[{"thinking": "Let me think.", "text": "Streamed answer. FINAL_ANSWER_MARKER",
                             "pad_text_bytes": 3000}])
    c = su.anthropic_client(st.url)
    msgs = [{"role": "user", "content": "Stream something long."}]
    kinds = set()
    with c.messages.stream(model=MODEL, max_tokens=2048, messages=msgs,
                           thinking={"type": "enabled", "budget_tokens": 1024}) as s:
        text = ""
        for ev in s:
            kinds.add(ev.type)
            if ev.type == "text":
                text += ev.text
        final = s.get_final_message()
    assert text.startswith("Streamed answer.") and len(text) == 3000
    assert {"message_start", "content_block_start", "content_block_stop", "message_stop"} <= kinds
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].signature
    assert final.usage.output_tokens > 0 and final.usage.input_tokens > 0
    _, rows = su.session_rows(st, "anthropic-sdk")
    assert len(rows) == 2
    assistant = json.loads(rows[1]["raw"])
    # The assistant row is reassembled from the SSE: thinking with its signature, the full text.
    assert assistant["content"][0]["type"] == "thinking"
    assert assistant["content"][0]["signature"] == final.content[0].signature
    assert assistant["content"][1]["text"] == text


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_tool_use_round_trip(make_stack, stream):
    st = make_stack(script=[
        {"text": "Checking.", "tool_calls": [{"name": "get_weather", "input": {"city": "Paris"}}]},
        {"text": "It is sunny in Paris. FINAL_ANSWER_MARKER"},
    ])
    c = su.anthropic_client(st.url)

    def call(messages):
        if stream:
            with c.messages.stream(model=MODEL, max_tokens=512, tools=TOOLS, messages=messages) as s:
                return s.get_final_message()
        return c.messages.create(model=MODEL, max_tokens=512, tools=TOOLS, messages=messages)

    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    r1 = call(msgs)
    assert r1.stop_reason == "tool_use"
    use = [b for b in r1.content if b.type == "tool_use"][0]
    assert use.name == "get_weather" and use.input == {"city": "Paris"}
    msgs.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r1.content]})
    msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "22C, sunny"}]})
    r2 = call(msgs)
    assert "FINAL_ANSWER_MARKER" in r2.content[0].text and r2.stop_reason == "end_turn"
    # Prompt caching upstream: the second request re-read the first one's prefix.
    assert r2.usage.cache_read_input_tokens > 0
    _, rows = su.session_rows(st, "anthropic-sdk")
    su.assert_rows_equal(rows, msgs + [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r2.content]}])


def test_count_tokens(make_stack):
    st = make_stack(script=[])
    c = su.anthropic_client(st.url)
    r = c.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "How many tokens is this?"}],
                                tools=TOOLS)
    assert r.input_tokens > 0
    up = su.upstream_bodies(st, "/v1/messages/count_tokens")
    assert len(up) == 1 and up[0]["status"] == 200
    st.settle()
    assert not st.ledger.q("SELECT * FROM rows"), "count_tokens must not be recorded as a conversation"


ERRORS = [
    (400, "invalid_request_error", anthropic.BadRequestError),
    (401, "authentication_error", anthropic.AuthenticationError),
    (403, "permission_error", anthropic.PermissionDeniedError),
    (404, "not_found_error", anthropic.NotFoundError),
    (413, "request_too_large", anthropic.ContentTooLargeError),
    (429, "rate_limit_error", anthropic.RateLimitError),
    (500, "api_error", anthropic.InternalServerError),
    (529, "overloaded_error", anthropic.OverloadedError),
]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("status,etype,exc", ERRORS, ids=[str(e[0]) for e in ERRORS])
def test_upstream_errors_are_typed_exceptions(make_stack, status, etype, exc, stream):
    body = {"type": "error", "error": {"type": etype, "message": f"fake {etype}"}, "request_id": "req_fake_err1"}
    st = make_stack(script=[{"error": {"status": status, "body": body,
                                       "headers": {"request-id": "req_fake_err1", "retry-after": "1"}}}])
    c = su.anthropic_client(st.url)
    with pytest.raises(exc) as ei:
        if stream:
            with c.messages.stream(model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "hi"}]) as s:
                s.get_final_message()
        else:
            c.messages.create(model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "hi"}])
    e = ei.value
    assert e.status_code == status
    assert e.body == body, "the provider's error body must be relayed unchanged"
    assert f"fake {etype}" in e.message
    assert e.request_id == "req_fake_err1"
    if status == 429:
        assert e.response.headers.get("retry-after") == "1"


def test_prompt_too_long_with_nothing_to_cut_is_relayed(make_stack):
    st = make_stack(script=[{"too_long": 1000}])
    c = su.anthropic_client(st.url)
    with pytest.raises(anthropic.BadRequestError) as ei:
        c.messages.create(model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "hi"}])
    assert "prompt is too long" in ei.value.message
    assert ei.value.body["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_proxy_made_error_uses_the_anthropic_envelope(make_stack, stream):
    st = make_stack(script=[], upstream_override=su.dead_url())
    c = su.anthropic_client(st.url)
    with pytest.raises(anthropic.APIStatusError) as ei:
        if stream:
            with c.messages.stream(model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "hi"}]) as s:
                s.get_final_message()
        else:
            c.messages.create(model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "hi"}])
    e = ei.value
    assert isinstance(e, anthropic.InternalServerError), type(e)
    assert e.status_code == 502
    assert e.body["type"] == "error" and e.body["error"]["type"] == "api_error", e.body
    assert "upstream" in e.message


@pytest.mark.parametrize("parallel", [1, 2], ids=["one-call", "parallel-calls"])
def test_long_tool_loop_crosses_the_tideline(make_stack, parallel):
    """An SDK agent loop (streaming, thinking, tool results of ~4k tokens) at a 20k
    line: every call succeeds, the upstream sees the stub, the usage the SDK reads is
    that of the cut window, and the ledger holds the whole conversation verbatim."""
    steps = 16
    script = {"replies": [{"text": f"Step {i}.", "thinking": "Next step.",
                           "tool_calls": [{"name": "get_weather", "input": {"city": f"city{i}-{k}"}} for k in range(parallel)]}
                          for i in range(1, steps + 1)],
              "default": {"text": "All done. FINAL_ANSWER_MARKER"}}
    st = make_stack(script=script, tideline="20k")
    c = su.anthropic_client(st.url)
    msgs = [{"role": "user", "content": "Check the weather everywhere."}]
    usages = []
    for i in range(1, steps + 2):
        with c.messages.stream(model=MODEL, max_tokens=1024, system="You are a test agent.", tools=TOOLS,
                               messages=msgs) as s:
            r = s.get_final_message()
        u = r.usage
        usages.append(u.input_tokens + (u.cache_read_input_tokens or 0) + (u.cache_creation_input_tokens or 0))
        msgs.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]})
        if r.stop_reason != "tool_use":
            break
        uses = [b for b in r.content if b.type == "tool_use"]
        msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": u.id,
                                                  "content": su.big_text(i, 400 // parallel)} for u in uses]})
    assert "FINAL_ANSWER_MARKER" in msgs[-1]["content"][0]["text"]
    assert len(msgs) == 2 * steps + 2
    reqs = st.tap.model_requests()
    assert all(q["status"] == 200 for q in reqs)
    s, rows = su.session_rows(st, "anthropic-sdk")
    cuts = st.ledger.cuts(s["id"])
    assert len(cuts) >= 2, [dict(x) for x in cuts]
    ac.check_stub_upstream("anthropic", reqs, st.data / "sessions" / s["id"])
    ac.check_gauge_follows_usage(st.ledger, s["id"])
    assert max(usages) < 20_000 + 14_000, usages
    assert sum(r["tokens"] for r in rows) > 3 * 20_000
    su.assert_rows_equal(rows, msgs)
    ac.check_rows_verbatim(rows, [q["json"]["messages"] for q in reqs], "anthropic")


def test_gzip_upstream_stream(make_stack):
    st = make_stack(script=[{"text": "Zipped answer. FINAL_ANSWER_MARKER", "pad_text_bytes": 3000}], gzip=True)
    c = su.anthropic_client(st.url)
    with c.messages.stream(model=MODEL, max_tokens=2048, messages=[{"role": "user", "content": "zip"}]) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text.startswith("Zipped answer.") and len(text) == 3000
    s_, rows = su.session_rows(st, "anthropic-sdk")
    assert len(rows) == 2 and json.loads(rows[1]["raw"])["content"][0]["text"] == text
    step = st.ledger.steps(s_["id"])[0]
    assert step["output"] == final.usage.output_tokens


def test_answer_recorded_when_the_stream_ends_after_its_last_event(make_stack):
    st = make_stack(script=[{"text": "The whole answer. FINAL_ANSWER_MARKER"}], end_delay_ms=300)
    c = su.anthropic_client(st.url)
    with c.messages.stream(model=MODEL, max_tokens=256, messages=[{"role": "user", "content": "hi"}]) as s:
        text = "".join(s.text_stream)
    assert text == "The whole answer. FINAL_ANSWER_MARKER"
    st.tap.wait(1)
    _, rows = su.session_rows(st, "anthropic-sdk")
    assert len(rows) == 2 and "FINAL_ANSWER_MARKER" in rows[1]["raw"]


def test_named_session_by_path_prefix(make_stack):
    st = make_stack(script={"replies": [], "default": {"text": "ok. FINAL_ANSWER_MARKER"}})
    c = su.anthropic_client(f"{st.url}/s/nightly-42")
    c.messages.create(model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "hi"}])
    up = su.upstream_bodies(st, "/v1/messages")
    assert up and up[0]["path"] == "/v1/messages"
    st.settle()
    assert [s["client_session"] for s in st.ledger.sessions()] == ["name:nightly-42"]


def test_stub_points_to_an_absolute_path_with_a_relative_data_dir(make_stack):
    """`--data-dir ledger` (relative): the stub tells the model where the transcripts
    are; the model's working directory is not the proxy's, so the path must be absolute."""
    steps = 6
    script = {"replies": [{"text": f"Step {i}.", "tool_calls": [{"name": "get_weather", "input": {"city": f"c{i}"}}]}
                          for i in range(1, steps + 1)], "default": {"text": "Done. FINAL_ANSWER_MARKER"}}
    st = make_stack(script=script, proxy=False)
    proxy = h.start_proxy(st.work, st.tap.url, Path("ledger"), "20k", cwd=st.work, name="proxy-reldir")
    st.procs.append(proxy)
    c = su.anthropic_client(proxy.url)
    msgs = [{"role": "user", "content": "go"}]
    for i in range(1, steps + 2):
        r = c.messages.create(model=MODEL, max_tokens=256, tools=TOOLS, messages=msgs)
        msgs.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]})
        uses = [b for b in r.content if b.type == "tool_use"]
        if not uses:
            break
        msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                                  "content": su.big_text(i, 600)}]})
    stubs = [ac.stub_of("anthropic", q["json"]) for q in st.tap.model_requests()]
    stubs = [s for s in stubs if s]
    assert stubs, "no cut happened: the test proves nothing"
    where = ac.STUB_RX.search(stubs[0]).group(2)
    assert Path(where).is_absolute(), f"the stub points to a relative path: {where!r}"
    assert (Path(where) / "transcript").is_dir()


# ---------------------------------------------------------------- context limits and usage shapes

def cli(st, *args: str) -> str:
    """`oceancode-proxy --data-dir <the stack's> ARGS` (the ledger CLI)."""
    r = h.run([str(h.PROXY_BIN), "--data-dir", str(st.data), *args], h.base_env(st.home), st.work, 60)
    assert r.code == 0 and not r.timed_out, r.tail()
    return r.stdout


def tool_loop_script() -> dict:
    return {"replies": [], "default": {"text": "Checking.",
                                       "tool_calls": [{"name": "get_weather", "input": {"city": "Paris"}}]}}


def push_tool_step(msgs: list, r, step: int, lines: int = 200) -> None:
    msgs.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]})
    uses = [b for b in r.content if b.type == "tool_use"]
    msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": u.id,
                                              "content": su.big_text(step, lines)} for u in uses]})


def test_input_and_max_tokens_over_the_context_is_cut_and_retried(make_stack):
    """Anthropic's other context error, `input length and max_tokens exceed context
    limit: N + T > M`: the proxy learns M, cuts every closed block and retries once;
    the SDK never sees the error, and every request keeps the SDK's max_tokens."""
    st = make_stack(script=tool_loop_script(), max_context=30_000, fake_args=["--count-max-tokens"])
    c = su.anthropic_client(st.url)
    msgs = [{"role": "user", "content": "Check the weather, again and again."}]
    for i in range(1, 13):
        with c.messages.stream(model=MODEL, max_tokens=8000, tools=TOOLS, messages=msgs) as s:
            r = s.get_final_message()
        push_tool_step(msgs, r, i)
    reqs = st.tap.model_requests()
    statuses = [q["status"] for q in reqs]
    assert 400 in statuses, "the upstream never refused: the test proves nothing"
    for i, q in enumerate(reqs):
        if q["status"] == 400:
            assert "input length and `max_tokens` exceed context limit" in q["response"], q["response"]
            assert reqs[i + 1]["status"] == 200 and h.STUB_PREFIX in reqs[i + 1]["body"], \
                "the retry carries a cut window"
    assert {q["json"]["max_tokens"] for q in reqs} == {8000}, "max_tokens is never changed"
    assert len(reqs) == 12 + statuses.count(400), "one retry per error"
    sessions = h.http_json(st.proxy.url + "/_oceancode/sessions")["sessions"]
    assert [x["meter"]["context"] for x in sessions if x["client"] == "anthropic-sdk"] == [30_000]


def test_input_and_max_tokens_with_nothing_to_cut_is_relayed(make_stack):
    st = make_stack(script=[{"context_limit": 1000}])
    c = su.anthropic_client(st.url)
    with pytest.raises(anthropic.BadRequestError) as ei:
        c.messages.create(model=MODEL, max_tokens=900, messages=[{"role": "user", "content": "hi"}])
    assert "input length and `max_tokens` exceed context limit:" in ei.value.message, ei.value.message
    assert "+ 900 > 1000" in ei.value.message, ei.value.message
    assert len(st.tap.model_requests()) == 1, "no retry"


def test_server_side_compaction_is_billed_and_the_window_starts_at_its_block(make_stack):
    """`context_management` with `compact_20260112` (beta `compact-2026-01-12`): the
    summary step's tokens are in `usage.iterations[]`, not in the top-level usage;
    the ledger bills them beyond the window, keeps the compaction block verbatim, and
    from the next request on the window starts at the block (the stub accounts for
    what the API drops anyway)."""
    st = make_stack(script=tool_loop_script())
    c = su.anthropic_client(st.url)
    cm = {"edits": [{"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 12000}}]}
    msgs = [{"role": "user", "content": "Check the weather, again and again."}]
    compacted = None
    for i in range(1, 12):
        r = c.beta.messages.create(betas=["compact-2026-01-12"], model=MODEL, max_tokens=1024, tools=TOOLS,
                                   messages=msgs, context_management=cm)
        if compacted is None and r.content[0].type == "compaction":
            compacted = (i, r)
        push_tool_step(msgs, r, i)
        if compacted and i >= compacted[0] + 2:
            break
    assert compacted, "the trigger was never reached"
    i, r = compacted
    its = r.usage.iterations
    assert [x.type for x in its] == ["compaction", "message"]
    assert r.usage.input_tokens == its[1].input_tokens
    s, rows = su.session_rows(st, "anthropic-sdk")
    steps = st.ledger.steps(s["id"])
    d = json.loads(steps[i - 1]["detail"])
    assert d["compactions"] == 1
    assert d["extra"]["input"] == its[0].input_tokens and d["extra"]["output"] == its[0].output_tokens
    assert steps[i - 1]["input"] == r.usage.input_tokens, "the step's usage is the window (the message)"
    block = [x for x in rows if '"compaction"' in x["raw"]]
    assert json.loads(block[0]["raw"])["content"][0] == r.content[0].model_dump(exclude_none=True)
    nxt = st.tap.model_requests()[i]["json"]["messages"]
    assert h.STUB_PREFIX in json.dumps(nxt[0])
    assert f"every row up to seq {block[0]['seq'] - 1} left" in json.dumps(nxt[0])
    assert nxt[1]["content"][0]["type"] == "compaction"
    out = cli(st, "status", s["id"])
    assert "1 compaction by the provider" in out, out
    md = cli(st, "export", "--md", s["id"])
    assert "provider_compactions: 1" in md


def test_applied_context_edits_are_in_status_and_exports(make_stack):
    """Context editing requested by the client (`clear_tool_uses_20250919`): the
    answer's `context_management.applied_edits` shows in `status` and both exports;
    the window is the real input after the edits."""
    st = make_stack(script=tool_loop_script())
    c = su.anthropic_client(st.url)
    cm = {"edits": [{"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 6000},
                     "keep": {"type": "tool_uses", "value": 2}}]}
    msgs = [{"role": "user", "content": "Check the weather, again and again."}]
    applied = []
    for i in range(1, 8):
        with c.beta.messages.stream(betas=["context-management-2025-06-27"], model=MODEL, max_tokens=1024,
                                    tools=TOOLS, messages=msgs, context_management=cm) as s:
            r = s.get_final_message()
        applied.append(r.context_management.applied_edits if r.context_management else [])
        push_tool_step(msgs, r, i)
    edited = [e for e in applied if e]
    assert len(edited) >= 2, applied
    s, _ = su.session_rows(st, "anthropic-sdk")
    steps = st.ledger.steps(s["id"])
    for step, edits in zip(steps, applied):
        got = json.loads(step["detail"]).get("edits", []) if step["detail"] else []
        assert got == [e.model_dump() for e in edits], (got, edits)
    cleared = sum(e.cleared_tool_uses for es in edited for e in es)
    out = cli(st, "status", s["id"])
    assert f"clear_tool_uses_20250919 ×{len(edited)} ({cleared} tool uses" in out, out
    md = cli(st, "export", "--md", s["id"])
    assert "provider_context_edits:" in md and "clear_tool_uses_20250919" in md
    atif = json.loads(cli(st, "export", "--atif", s["id"]))
    with_edits = [x for x in atif["steps"] if (x.get("extra") or {}).get("context_management", {}).get("applied_edits")]
    assert len(with_edits) == len(edited)
