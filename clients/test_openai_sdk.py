"""The Python `openai` SDK through oceancode-proxy (`serve`), against the fake upstream:
Chat Completions and Responses, streaming and not, `stream_options.include_usage`,
tool calls, long tool loops over the tideline, and errors surfacing as the SDK's
typed exceptions."""

from __future__ import annotations

import json

import openai
import pytest

import agentcheck as ac
import harness as h
import sdkutil as su

CHAT_MODEL = "gpt-4o-mini"
RESP_MODEL = "gpt-5"
CHAT_TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
RESP_TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather of a city",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]


def assistant_message(msg) -> dict:
    """A Chat assistant message as an agent echoes it back."""
    m = {"role": "assistant", "content": msg.content}
    if msg.tool_calls:
        m["tool_calls"] = [{"id": t.id, "type": "function",
                            "function": {"name": t.function.name, "arguments": t.function.arguments}}
                           for t in msg.tool_calls]
    return m


# ---------------------------------------------------------------- Chat Completions

def test_chat_non_streaming(make_stack):
    st = make_stack(script=[{"text": "Hello from fake chat. FINAL_ANSWER_MARKER"}])
    cap = su.Captured()
    c = su.openai_client(st.url, cap)
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    r = c.chat.completions.create(model=CHAT_MODEL, messages=msgs)
    assert "FINAL_ANSWER_MARKER" in r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0
    up = su.upstream_bodies(st, "/v1/chat/completions")
    assert [e["body"].encode() for e in up] == cap.bodies, "under the line the body is forwarded untouched"
    s, rows = su.session_rows(st, "openai-sdk")
    assert s["dialect"] in ("openai_chat", "chat", "OpenaiChat"), dict(s)
    su.assert_rows_equal(rows[:-1], msgs)
    # The answer row is the upstream's message, verbatim.
    assert json.loads(rows[-1]["raw"]) == json.loads(up[0]["response"])["choices"][0]["message"]
    assert st.ledger.steps(s["id"])[0]["input"] == r.usage.prompt_tokens


def test_chat_stream_include_usage(make_stack):
    st = make_stack(script=[{"text": "A streamed reply. FINAL_ANSWER_MARKER", "pad_text_bytes": 2000}])
    c = su.openai_client(st.url)
    msgs = [{"role": "user", "content": "stream please"}]
    chunks = list(c.chat.completions.create(model=CHAT_MODEL, messages=msgs, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text.startswith("A streamed reply.") and len(text) == 2000
    assert len(chunks) > 5, "the stream must arrive in pieces"
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None, last
    assert last.usage.prompt_tokens > 0 and last.usage.completion_tokens > 0
    assert all(ch.usage is None for ch in chunks[:-1])
    _, rows = su.session_rows(st, "openai-sdk")
    su.assert_rows_equal(rows[:-1], msgs)
    assert json.loads(rows[-1]["raw"])["content"] == text


def test_chat_stream_without_include_usage(make_stack):
    st = make_stack(script=[{"text": "No usage asked. FINAL_ANSWER_MARKER"}])
    cap = su.Captured()
    c = su.openai_client(st.url, cap)
    msgs = [{"role": "user", "content": "hi"}]
    chunks = list(c.chat.completions.create(model=CHAT_MODEL, messages=msgs, stream=True))
    assert all(getattr(ch, "usage", None) is None for ch in chunks), "the proxy must not add a usage chunk"
    assert all(ch.choices for ch in chunks)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks)
    assert "FINAL_ANSWER_MARKER" in text
    up = su.upstream_bodies(st, "/v1/chat/completions")
    assert [e["body"].encode() for e in up] == cap.bodies, "the request must not be rewritten (no stream_options added)"
    _, rows = su.session_rows(st, "openai-sdk")
    su.assert_rows_equal(rows[:-1], msgs)
    assert json.loads(rows[-1]["raw"])["content"] == text


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_chat_tool_calls(make_stack, stream):
    st = make_stack(script=[
        {"text": "", "tool_calls": [{"name": "get_weather", "input": {"city": "Paris"}},
                                    {"name": "get_weather", "input": {"city": "Oslo"}}]},
        {"text": "Sunny and snowy. FINAL_ANSWER_MARKER"},
    ])
    c = su.openai_client(st.url)

    def call(messages):
        if stream:
            with c.chat.completions.stream(model=CHAT_MODEL, messages=messages, tools=CHAT_TOOLS,
                                           stream_options={"include_usage": True}) as s:
                for _ in s:
                    pass
                return s.get_final_completion()
        return c.chat.completions.create(model=CHAT_MODEL, messages=messages, tools=CHAT_TOOLS)

    msgs = [{"role": "user", "content": "Weather in Paris and Oslo?"}]
    r1 = call(msgs)
    m1 = r1.choices[0].message
    assert r1.choices[0].finish_reason == "tool_calls"
    assert [(t.function.name, json.loads(t.function.arguments)) for t in m1.tool_calls] == [
        ("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Oslo"})]
    msgs.append(assistant_message(m1))
    for t, out in zip(m1.tool_calls, ["22C sunny", "-5C snow"]):
        msgs.append({"role": "tool", "tool_call_id": t.id, "content": out})
    r2 = call(msgs)
    assert "FINAL_ANSWER_MARKER" in r2.choices[0].message.content
    assert r2.usage.prompt_tokens_details.cached_tokens > 0
    _, rows = su.session_rows(st, "openai-sdk")
    assert len(rows) == len(msgs) + 1
    # The client's own messages are recorded byte for byte; the assistant rows match
    # what the SDK reassembled (compared on the fields the client echoes).
    su.assert_rows_equal([r for r in rows if r["role"] != "assistant"], [m for m in msgs if m["role"] != "assistant"])
    recorded = [json.loads(r["raw"]) for r in rows if r["role"] == "assistant"]
    assert [[(t["function"]["name"], t["function"]["arguments"]) for t in x.get("tool_calls") or []]
            for x in recorded][0] == [(t.function.name, t.function.arguments) for t in m1.tool_calls]
    assert recorded[-1]["content"] == r2.choices[0].message.content


@pytest.mark.parametrize("parallel", [1, 2], ids=["one-call", "parallel-calls"])
def test_chat_long_tool_loop_crosses_the_tideline(make_stack, parallel):
    steps = 16
    script = {"replies": [{"text": f"Step {i}.", "tool_calls": [{"name": "get_weather", "input": {"city": f"c{i}-{k}"}}
                                                               for k in range(parallel)]}
                          for i in range(1, steps + 1)],
              "default": {"text": "All done. FINAL_ANSWER_MARKER"}}
    st = make_stack(script=script, tideline="20k")
    c = su.openai_client(st.url)
    msgs = [{"role": "system", "content": "You are a test agent."},
            {"role": "user", "content": "Check the weather everywhere."}]
    usages = []
    for i in range(1, steps + 2):
        chunks = list(c.chat.completions.create(model=CHAT_MODEL, messages=msgs, tools=CHAT_TOOLS, stream=True,
                                                stream_options={"include_usage": True}))
        usages.append(chunks[-1].usage.prompt_tokens)
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        calls = {}
        for ch in chunks:
            for tc in (ch.choices[0].delta.tool_calls or []) if ch.choices else []:
                d = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                d["id"] = tc.id or d["id"]
                d["name"] += (tc.function.name or "") if tc.function else ""
                d["arguments"] += (tc.function.arguments or "") if tc.function else ""
        m = {"role": "assistant", "content": text}
        if calls:
            m["tool_calls"] = [{"id": d["id"], "type": "function",
                                "function": {"name": d["name"], "arguments": d["arguments"]}} for d in calls.values()]
        msgs.append(m)
        if not calls:
            break
        for d in calls.values():
            msgs.append({"role": "tool", "tool_call_id": d["id"], "content": su.big_text(i, 400 // parallel)})
    assert "FINAL_ANSWER_MARKER" in msgs[-1]["content"]
    reqs = st.tap.model_requests()
    assert all(q["status"] == 200 for q in reqs), [(q["seq"], q["status"], q["response"][:200]) for q in reqs]
    s, rows = su.session_rows(st, "openai-sdk")
    assert len(st.ledger.cuts(s["id"])) >= 2
    ac.check_stub_upstream("chat", reqs, st.data / "sessions" / s["id"])
    ac.check_gauge_follows_usage(st.ledger, s["id"])
    assert max(usages) < 20_000 + 14_000, usages
    assert sum(r["tokens"] for r in rows) > 3 * 20_000
    su.assert_rows_equal([r for r in rows if r["role"] != "assistant"], [m for m in msgs if m["role"] != "assistant"])
    assert len(rows) == len(msgs)
    ac.check_rows_verbatim(rows, [q["json"]["messages"] for q in reqs], "chat")


# ---------------------------------------------------------------- Responses

def test_responses_non_streaming(make_stack):
    st = make_stack(script=[{"text": "Hello from responses. FINAL_ANSWER_MARKER", "thinking": "hmm"}])
    cap = su.Captured()
    c = su.openai_client(st.url, cap)
    r = c.responses.create(model=RESP_MODEL, input=[{"role": "user", "content": "hi"}], instructions="be brief")
    assert "FINAL_ANSWER_MARKER" in r.output_text
    assert r.status == "completed"
    assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0
    assert r.usage.output_tokens_details.reasoning_tokens > 0
    up = su.upstream_bodies(st, "/v1/responses")
    assert [e["body"].encode() for e in up] == cap.bodies
    s, rows = su.session_rows(st, "openai-sdk")
    assert rows[0]["kind"] == "prompt"
    assert any("FINAL_ANSWER_MARKER" in r["raw"] for r in rows[1:])


def test_responses_streaming(make_stack):
    st = make_stack(script=[{"text": "Streamed responses text. FINAL_ANSWER_MARKER", "pad_text_bytes": 2000}])
    c = su.openai_client(st.url)
    types, text, final = [], "", None
    for ev in c.responses.create(model=RESP_MODEL, input=[{"role": "user", "content": "hi"}], stream=True):
        types.append(ev.type)
        if ev.type == "response.output_text.delta":
            text += ev.delta
        if ev.type == "response.completed":
            final = ev.response
    assert types[0] == "response.created" and types[-1] == "response.completed"
    assert len(text) == 2000 and final.output_text == text
    assert final.usage.input_tokens > 0
    _, rows = su.session_rows(st, "openai-sdk")
    assert json.loads(rows[-1]["raw"])["content"][0]["text"] == text


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_responses_function_calls(make_stack, stream):
    st = make_stack(script=[
        {"text": "Checking.", "tool_calls": [{"name": "get_weather", "input": {"city": "Paris"}}]},
        {"text": "Sunny. FINAL_ANSWER_MARKER"},
    ])
    c = su.openai_client(st.url)

    def call(items):
        if stream:
            with c.responses.stream(model=RESP_MODEL, input=items, tools=RESP_TOOLS) as s:
                for _ in s:
                    pass
                return s.get_final_response()
        return c.responses.create(model=RESP_MODEL, input=items, tools=RESP_TOOLS)

    items = [{"role": "user", "content": "Weather in Paris?"}]
    r1 = call(items)
    fc = [o for o in r1.output if o.type == "function_call"]
    assert len(fc) == 1 and fc[0].name == "get_weather" and json.loads(fc[0].arguments) == {"city": "Paris"}
    items += [o.model_dump(exclude_none=True) for o in r1.output]
    items.append({"type": "function_call_output", "call_id": fc[0].call_id, "output": "22C sunny"})
    r2 = call(items)
    assert "FINAL_ANSWER_MARKER" in r2.output_text
    assert r2.usage.input_tokens_details.cached_tokens > 0
    _, rows = su.session_rows(st, "openai-sdk")
    su.assert_rows_equal(rows, items + [o.model_dump(exclude_none=True) for o in r2.output])


@pytest.mark.parametrize("parallel", [1, 2], ids=["one-call", "parallel-calls"])
def test_responses_long_tool_loop_crosses_the_tideline(make_stack, parallel):
    """With parallel calls every function_call is its own input item: a cut must not
    start the window between two calls of one response (orphaning an output)."""
    steps = 16
    script = {"replies": [{"text": f"Step {i}.", "thinking": "Next step.",
                           "tool_calls": [{"name": "get_weather", "input": {"city": f"c{i}-{k}"}} for k in range(parallel)]}
                          for i in range(1, steps + 1)],
              "default": {"text": "All done. FINAL_ANSWER_MARKER"}}
    st = make_stack(script=script, tideline="20k")
    c = su.openai_client(st.url)
    items = [{"role": "user", "content": "Check the weather everywhere."}]
    usages = []
    for i in range(1, steps + 2):
        with c.responses.stream(model=RESP_MODEL, input=items, tools=RESP_TOOLS, instructions="You are a test agent.") as s:
            for _ in s:
                pass
            r = s.get_final_response()
        usages.append(r.usage.input_tokens)
        items += [o.model_dump(exclude_none=True) for o in r.output]
        fc = [o for o in r.output if o.type == "function_call"]
        if not fc:
            break
        for f in fc:
            items.append({"type": "function_call_output", "call_id": f.call_id, "output": su.big_text(i, 400 // parallel)})
    assert "FINAL_ANSWER_MARKER" in r.output_text
    reqs = st.tap.model_requests()
    assert all(q["status"] == 200 for q in reqs), [(q["seq"], q["status"], q["response"][:200]) for q in reqs]
    s, rows = su.session_rows(st, "openai-sdk")
    assert len(st.ledger.cuts(s["id"])) >= 2
    ac.check_stub_upstream("responses", reqs, st.data / "sessions" / s["id"])
    ac.check_gauge_follows_usage(st.ledger, s["id"])
    assert max(usages) < 20_000 + 14_000, usages
    su.assert_rows_equal(rows, items)
    ac.check_rows_verbatim(rows, [q["json"]["input"] for q in reqs], "responses")


def test_responses_compact_v1_is_the_clients_own_compaction_across_the_tideline(make_stack):
    """`client.responses.compact(...)` (POST /v1/responses/compact, remote
    compaction V1, what Codex used before V2) in a Responses tool loop that
    crossed the tideline: the whole history goes upstream byte for byte (no
    stub, nothing recorded), the compacted output continues the same session
    as a branch, and the tideline cuts the new line again, keeping the opaque
    compaction item in every window."""
    steps = 24
    script = {"replies": [{"text": f"Step {i}.", "tool_calls": [{"name": "get_weather", "input": {"city": f"c{i}"}}]}
                          for i in range(1, steps + 1)],
              "default": {"text": "All done. FINAL_ANSWER_MARKER"}}
    st = make_stack(script=script, tideline="20k")
    cap = su.Captured()
    c = su.openai_client(st.url, cap)
    hdr = {"x-oceancode-session": "compact-v1"}

    def loop(items: list, n: int, first: int) -> list:
        for i in range(first, first + n):
            r = c.responses.create(model=RESP_MODEL, input=items, tools=RESP_TOOLS,
                                   instructions="You are a test agent.", extra_headers=hdr)
            items += [o.model_dump(exclude_none=True) for o in r.output]
            fc = [o for o in r.output if o.type == "function_call"]
            assert fc, r.output_text
            items.append({"type": "function_call_output", "call_id": fc[0].call_id, "output": su.big_text(i, 300)})
        return items

    items = loop([{"role": "user", "content": "Check the weather everywhere."}], 12, 1)
    reqs = st.tap.model_requests()
    assert any(h.STUB_PREFIX in q["body"] for q in reqs), "no cut before the compaction: the test proves nothing"
    raw = c.responses.with_raw_response.compact(model=RESP_MODEL, input=items, instructions="You are a test agent.",
                                                extra_headers=hdr)
    compacted = raw.parse()
    assert compacted.object == "response.compaction"
    assert compacted.output[-1].type == "compaction"
    # The items as the API returned them (the SDK's types model output items:
    # the user messages here would not round-trip through them unchanged).
    output = json.loads(raw.text)["output"]
    up = [e for e in st.tap.entries() if e["path"] == "/v1/responses/compact"]
    assert len(up) == 1 and up[0]["status"] == 200
    assert up[0]["body"].encode() == cap.bodies[cap.paths.index("/v1/responses/compact")], \
        "the compact request was not forwarded byte for byte"
    assert h.STUB_PREFIX not in up[0]["body"]

    items = loop(output, 12, 13)
    reqs = st.tap.model_requests()
    assert all(q["status"] == 200 for q in reqs), [(q["seq"], q["status"], q["response"][:200]) for q in reqs]
    s, rows = su.session_rows(st, "openai-sdk")
    assert s["client_session"] == "name:compact-v1"
    branches = st.ledger.q("SELECT * FROM branches WHERE session=?", s["id"])
    assert len(branches) == 1, [dict(b) for b in branches]
    item = [r for r in rows if json.loads(r["raw"]).get("type") == "compaction"]
    assert len(item) == 1 and not item[0]["hidden"]
    cuts = st.ledger.cuts(s["id"])
    assert [c_ for c_ in cuts if c_["upto_seq"] > item[0]["seq"]], f"no cut after the compaction: {[dict(x) for x in cuts]}"
    last = reqs[-1]
    assert h.STUB_PREFIX in last["body"] and '"type":"compaction"' in last["body"].replace(" ", ""), \
        "the window after the cut lost the compaction item"


# ---------------------------------------------------------------- errors

ERRORS = [
    (400, "invalid_request_error", None, openai.BadRequestError),
    (401, "invalid_request_error", "invalid_api_key", openai.AuthenticationError),
    (403, "invalid_request_error", None, openai.PermissionDeniedError),
    (404, "invalid_request_error", "model_not_found", openai.NotFoundError),
    (409, "invalid_request_error", None, openai.ConflictError),
    (422, "invalid_request_error", None, openai.UnprocessableEntityError),
    (429, "rate_limit_exceeded", "rate_limit_exceeded", openai.RateLimitError),
    (500, "server_error", None, openai.InternalServerError),
    (503, "server_error", None, openai.InternalServerError),
]


@pytest.mark.parametrize("api", ["chat", "chat-stream", "responses", "responses-stream"])
@pytest.mark.parametrize("status,etype,code,exc", ERRORS, ids=[str(e[0]) for e in ERRORS])
def test_upstream_errors_are_typed_exceptions(make_stack, status, etype, code, exc, api):
    body = {"error": {"message": f"fake {status}", "type": etype, "param": None, "code": code}}
    st = make_stack(script=[{"error": {"status": status, "body": body,
                                       "headers": {"x-request-id": "req_fake_e1", "retry-after": "1"}}}])
    c = su.openai_client(st.url)
    with pytest.raises(exc) as ei:
        call(c, api)
    e = ei.value
    assert e.status_code == status
    assert e.body == body["error"], "the provider's error must be relayed unchanged"
    assert e.code == code and e.type == etype
    assert e.request_id == "req_fake_e1"


def call(c, api: str):
    if api == "chat":
        return c.chat.completions.create(model=CHAT_MODEL, messages=[{"role": "user", "content": "hi"}])
    if api == "chat-stream":
        return list(c.chat.completions.create(model=CHAT_MODEL, messages=[{"role": "user", "content": "hi"}],
                                              stream=True, stream_options={"include_usage": True}))
    if api == "responses":
        return c.responses.create(model=RESP_MODEL, input="hi")
    return list(c.responses.create(model=RESP_MODEL, input="hi", stream=True))


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_context_length_exceeded_is_relayed(make_stack, api):
    st = make_stack(script=[{"too_long": 1000}])
    c = su.openai_client(st.url)
    with pytest.raises(openai.BadRequestError) as ei:
        call(c, api)
    assert ei.value.code == "context_length_exceeded"


@pytest.mark.parametrize("api", ["chat", "chat-stream", "responses", "responses-stream"])
def test_proxy_made_error_uses_the_openai_envelope(make_stack, api):
    st = make_stack(script=[], upstream_override=su.dead_url())
    c = su.openai_client(st.url)
    with pytest.raises(openai.InternalServerError) as ei:
        call(c, api)
    e = ei.value
    assert e.status_code == 502
    assert e.code == "upstream_unreachable" and e.type == "server_error", e.body
    assert "upstream" in e.message


# ---------------------------------------------------------------- proxy restart

@pytest.mark.parametrize("api", ["chat", "responses"])
def test_parallel_calls_survive_a_proxy_restart(make_stack, api):
    """Parallel tool calls (one big output, one tiny) and a proxy restart half way:
    the restarted proxy rebuilds its blocks from the ledger (row estimates), so a
    block may end between the two outputs of one step. The window it cuts must
    still pair every output with its call (the fake rejects orphans with the
    provider's 400)."""
    steps = 16
    script = {"replies": [{"text": f"Step {i}.", "thinking": "Next step.",
                           "tool_calls": [{"name": "get_weather", "input": {"city": f"c{i}-{k}"}} for k in range(2)]}
                          for i in range(1, steps + 1)],
              "default": {"text": "All done. FINAL_ANSWER_MARKER"}}
    st = make_stack(script=script, tideline="20k")
    convo = ([{"role": "system", "content": "You are a test agent."}] if api == "chat" else []) + [
        {"role": "user", "content": "Check the weather everywhere."}]
    for i in range(1, steps + 2):
        if i == steps // 2:
            st.proxy.stop()
            st.proxy = h.start_proxy(st.work, st.tap.url, st.data, "20k", name="proxy-restarted")
            st.procs.append(st.proxy)
        c = su.openai_client(st.url)
        if api == "chat":
            r = c.chat.completions.create(model=CHAT_MODEL, messages=convo, tools=CHAT_TOOLS)
            m = r.choices[0].message
            convo.append(assistant_message(m))
            calls = [(t.id, t) for t in m.tool_calls or []]
            for n, (cid, _) in enumerate(calls):
                convo.append({"role": "tool", "tool_call_id": cid, "content": su.big_text(i, 400 if n == 0 else 1)})
            done = not calls and "FINAL_ANSWER_MARKER" in (m.content or "")
        else:
            r = c.responses.create(model=RESP_MODEL, input=convo, tools=RESP_TOOLS, instructions="You are a test agent.")
            convo += [o.model_dump(exclude_none=True) for o in r.output]
            fc = [o for o in r.output if o.type == "function_call"]
            for n, f in enumerate(fc):
                convo.append({"type": "function_call_output", "call_id": f.call_id,
                              "output": su.big_text(i, 400 if n == 0 else 1)})
            done = not fc and "FINAL_ANSWER_MARKER" in r.output_text
        if done:
            break
    assert done
    reqs = st.tap.model_requests()
    assert all(q["status"] == 200 for q in reqs)
    s, rows = su.session_rows(st, "openai-sdk")
    assert len(st.ledger.cuts(s["id"])) >= 2
    ac.check_stub_upstream(api, reqs, st.data / "sessions" / s["id"])
    ac.check_gauge_follows_usage(st.ledger, s["id"])


# ---------------------------------------------------------------- stream endings, gzip, string input

def stream_once(c, api: str) -> str:
    if api == "chat":
        chunks = c.chat.completions.create(model=CHAT_MODEL, messages=[{"role": "user", "content": "hi"}], stream=True)
        return "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    if api == "chat-include-usage":
        chunks = c.chat.completions.create(model=CHAT_MODEL, messages=[{"role": "user", "content": "hi"}], stream=True,
                                           stream_options={"include_usage": True})
        return "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    events = c.responses.create(model=RESP_MODEL, input=[{"role": "user", "content": "hi"}], stream=True)
    return "".join(ev.delta for ev in events if ev.type == "response.output_text.delta")


@pytest.mark.parametrize("api", ["chat", "chat-include-usage", "responses"])
def test_answer_recorded_when_the_stream_ends_after_its_last_event(make_stack, api):
    """The provider's body ends a moment after its terminal event (`data: [DONE]`,
    `response.completed`); the SDK stops reading at the terminal event and closes
    the stream. The answer was delivered whole: the ledger must hold it, and the
    step its usage."""
    st = make_stack(script=[{"text": "The whole answer. FINAL_ANSWER_MARKER"}], end_delay_ms=300)
    c = su.openai_client(st.url)
    text = stream_once(c, api)
    assert text == "The whole answer. FINAL_ANSWER_MARKER"
    st.tap.wait(1)
    import time
    time.sleep(0.5)  # past the end of the upstream body
    s, rows = su.session_rows(st, "openai-sdk")
    assert len(rows) == 2, f"the answer row is missing: {[r['raw'][:80] for r in rows]}"
    assert "FINAL_ANSWER_MARKER" in rows[1]["raw"]
    steps = st.ledger.steps(s["id"])
    if api != "chat":  # plain chat streams carry no usage
        assert steps and steps[0]["output"] > 0, [dict(x) for x in steps]


@pytest.mark.parametrize("api", ["chat-include-usage", "responses"])
def test_gzip_upstream_stream(make_stack, api):
    """A gzip-encoded upstream stream: the client gets it as sent, the proxy's tap
    still reads the usage and the answer."""
    st = make_stack(script=[{"text": "Zipped answer. FINAL_ANSWER_MARKER", "pad_text_bytes": 3000}], gzip=True)
    c = su.openai_client(st.url)
    text = stream_once(c, api)
    assert text.startswith("Zipped answer.") and len(text) == 3000
    s, rows = su.session_rows(st, "openai-sdk")
    assert len(rows) == 2
    row = json.loads(rows[1]["raw"])
    assert (row.get("content") if api.startswith("chat") else row["content"][0]["text"]) == text
    steps = st.ledger.steps(s["id"])
    assert steps[0]["input"] + steps[0]["cache_read"] > 0 and steps[0]["output"] > 0


def test_responses_string_input_is_recorded(make_stack):
    """`input` may be a plain string (the SDK's first example): it is a conversation
    like any other and belongs in the ledger."""
    st = make_stack(script=[{"text": "Hello. FINAL_ANSWER_MARKER"}])
    c = su.openai_client(st.url)
    r = c.responses.create(model=RESP_MODEL, input="Say hello.")
    assert "FINAL_ANSWER_MARKER" in r.output_text
    st.settle()
    sessions = st.ledger.sessions()
    assert sessions, "a Responses request with a string input was not recorded at all"
    rows = st.ledger.rows(sessions[0]["id"])
    assert any("Say hello." in x["raw"] for x in rows)
    assert any("FINAL_ANSWER_MARKER" in x["raw"] for x in rows)


@pytest.mark.parametrize("how", ["header", "path"])
def test_named_session(make_stack, how):
    """Two SDK conversations that share their first message stay apart when the
    client names its session (`x-oceancode-session` header or `/s/<name>/` prefix)."""
    st = make_stack(script={"replies": [], "default": {"text": "ok. FINAL_ANSWER_MARKER"}})
    for name in ("task-a", "task-b"):
        if how == "header":
            c = su.openai_client(st.url, default_headers={"x-oceancode-session": name})
        else:
            c = su.openai_client(f"{st.url}/s/{name}")
        c.chat.completions.create(model=CHAT_MODEL, messages=[{"role": "user", "content": "same first message"}])
    up = su.upstream_bodies(st, "/v1/chat/completions", 2)
    assert [e["path"] for e in up] == ["/v1/chat/completions"] * 2, "the /s/<name> prefix must be stripped"
    st.settle()
    keys = sorted(s["client_session"] for s in st.ledger.sessions())
    assert keys == ["name:task-a", "name:task-b"], keys


# ---------------------------------------------------------------- context limits and usage shapes

def test_responses_stream_failing_before_output_is_cut_and_retried(make_stack):
    """A Responses stream that fails inside its 200 with `context_length_exceeded`
    (`response.failed`, what Codex turns into `turn.failed`) before any output: the
    proxy holds back only the opening events, cuts and retries once; the SDK's
    streams all complete."""
    script = {"replies": [], "default": {"text": "Checking.",
                                         "tool_calls": [{"name": "get_weather", "input": {"city": "Paris"}}]}}
    st = make_stack(script=script, max_context=20_000, fake_args=["--overflow-in-stream"])
    c = su.openai_client(st.url)
    items = [{"role": "user", "content": "Check the weather, again and again."}]
    for i in range(1, 12):
        with c.responses.stream(model=RESP_MODEL, input=items, tools=RESP_TOOLS) as s:
            kinds = [ev.type for ev in s]
            r = s.get_final_response()
        assert r.status == "completed" and "response.failed" not in kinds, kinds
        assert kinds.count("response.created") == 1
        items += [o.model_dump(exclude_none=True) for o in r.output]
        for f in [o for o in r.output if o.type == "function_call"]:
            items.append({"type": "function_call_output", "call_id": f.call_id, "output": su.big_text(i, 200)})
    reqs = st.tap.model_requests()
    failed = [k for k, q in enumerate(reqs) if "response.failed" in q["response"]]
    assert failed, "the upstream never overflowed: the test proves nothing"
    for k in failed:
        assert "context_length_exceeded" in reqs[k]["response"]
        assert h.STUB_PREFIX in reqs[k + 1]["body"] and "response.completed" in reqs[k + 1]["response"]
    assert len(reqs) == 11 + len(failed), "one retry per overflow"


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_cached_and_reasoning_tokens_in_the_meter(make_stack, api):
    """OpenAI's cached tokens are a part of the prompt tokens (Anthropic's cache
    reads are not a part of input_tokens): the ledger takes them out of the
    uncached input, so the window is prompt + completion, never more; reasoning
    tokens are a part of the completion."""
    st = make_stack(script={"replies": [], "default": {"text": "Done. FINAL_ANSWER_MARKER", "thinking": "Think first."}})
    c = su.openai_client(st.url)
    system = su.big_text(0, 150)
    usages = []
    if api == "chat":
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": "hi"}]
        for _ in range(2):
            r = c.chat.completions.create(model=CHAT_MODEL, messages=msgs)
            u = r.usage
            usages.append((u.prompt_tokens, u.prompt_tokens_details.cached_tokens, u.completion_tokens,
                           u.completion_tokens_details.reasoning_tokens))
            msgs += [assistant_message(r.choices[0].message), {"role": "user", "content": "again"}]
    else:
        items = [{"role": "user", "content": "hi"}]
        for _ in range(2):
            r = c.responses.create(model=RESP_MODEL, instructions=system, input=items)
            u = r.usage
            usages.append((u.input_tokens, u.input_tokens_details.cached_tokens, u.output_tokens,
                           u.output_tokens_details.reasoning_tokens))
            items += [o.model_dump(exclude_none=True) for o in r.output] + [{"role": "user", "content": "again"}]
    s, _ = su.session_rows(st, "openai-sdk")
    steps = st.ledger.steps(s["id"])
    prompt, cached, out, reasoning = usages[1]
    assert cached > 0 and reasoning > 0
    x = steps[1]
    assert (x["input"], x["cache_read"], x["output"]) == (prompt - cached, cached, out)
    assert x["input"] + x["cache_read"] + x["cache_write"] + x["output"] == prompt + out
    assert json.loads(x["detail"])["reasoning"] == reasoning
