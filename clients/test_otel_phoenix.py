"""OpenTelemetry export against a real backend: Arize Phoenix (clients/install.sh
installs it in its own venv and sets OCEANCODE_PHOENIX) on loopback takes the
proxy's OTLP/HTTP spans; a tool loop of the anthropic SDK crosses a 20k tideline.
Asserted through Phoenix's REST API: one GenAI span per step with the
conventions' attributes and the proxy's own, the cut as a span event, and
neither the API key nor any message text (content capture is off)."""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.request
from pathlib import Path

import pytest

import harness as h
import sdkutil as su

PHOENIX = os.environ.get("OCEANCODE_PHOENIX", "")
MODEL = "claude-opus-5-5"
ASK = "Check the weather everywhere. OTEL_ASK_MARKER"
TOOLS = [{
    "name": "get_weather",
    "description": "Weather of a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}]


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def get_json(url: str, timeout: float = 10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


@pytest.fixture
def phoenix(tmp_path):
    if not PHOENIX or not Path(PHOENIX).exists():
        pytest.skip("Arize Phoenix is not installed (clients/install.sh installs it and sets "
                    "OCEANCODE_PHOENIX); the OTLP export is also tested in tests/tests/telemetry.rs")
    work = tmp_path / "phoenix"
    work.mkdir()
    port = free_port()
    env = h.base_env(work)
    env.update({
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(free_port()),
        "PHOENIX_WORKING_DIR": str(work),
        "PHOENIX_TELEMETRY_ENABLED": "false",
        "PHOENIX_ALLOW_EXTERNAL_RESOURCES": "false",
    })
    p = h.Proc("phoenix", [PHOENIX, "serve"], work, env, r"Uvicorn running on (http://\S+)",
               "stderr", timeout=240)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while True:
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=5) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        assert time.time() < deadline, p.read_log()[-3000:]
        time.sleep(0.5)
    yield url
    p.stop()


def spans_of(url: str) -> list[dict]:
    out, cursor = [], None
    while True:
        q = f"{url}/v1/projects/default/spans?limit=1000" + (f"&cursor={cursor}" if cursor else "")
        try:
            page = get_json(q)
        except urllib.error.HTTPError as e:
            if e.code == 404:  # no span yet: the project does not exist
                return []
            raise
        out += page["data"]
        cursor = page.get("next_cursor")
        if not cursor:
            return out


def test_a_session_s_steps_and_cut_arrive_in_phoenix(make_stack, phoenix):
    steps = 12
    script = {"replies": [{"text": f"Step {i}. OTEL_ANSWER_MARKER",
                           "tool_calls": [{"name": "get_weather", "input": {"city": f"city{i}"}}]}
                          for i in range(1, steps + 1)],
              "default": {"text": "All done."}}
    st = make_stack(script=script, tideline="20k", proxy_env={"OCEANCODE_OTLP_ENDPOINT": phoenix})
    c = su.anthropic_client(st.url)
    msgs = [{"role": "user", "content": ASK}]
    for i in range(1, steps + 1):
        r = c.messages.create(model=MODEL, max_tokens=1024, system="You are a test agent.", tools=TOOLS,
                              messages=msgs)
        msgs.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]})
        uses = [b for b in r.content if b.type == "tool_use"]
        msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": u.id,
                                                  "content": su.big_text(i, 400)} for u in uses]})
    st.settle()
    s, _rows = su.session_rows(st, "anthropic-sdk")
    assert len(st.ledger.cuts(s["id"])) >= 1, "the session was cut"
    deadline = time.time() + 60
    spans = []
    while time.time() < deadline:
        spans = [x for x in spans_of(phoenix) if x["name"] == f"chat {MODEL}"]
        if len(spans) >= steps:
            break
        time.sleep(0.5)
    assert len(spans) == steps, [x["name"] for x in spans]
    cut_events = []
    for x in spans:
        a = x["attributes"]
        assert x["parent_id"] is None
        assert a["gen_ai.operation.name"] == "chat"
        assert a["gen_ai.provider.name"] == "anthropic"
        assert a["gen_ai.request.model"] == MODEL
        assert a["gen_ai.response.model"]
        assert a["gen_ai.response.id"]
        assert a["gen_ai.conversation.id"] == s["id"]
        assert a["gen_ai.usage.input_tokens"] > 0 and a["gen_ai.usage.output_tokens"] > 0
        assert "gen_ai.usage.cache_read.input_tokens" in a
        assert "gen_ai.usage.cache_creation.input_tokens" in a
        reasons = a.get("gen_ai.response.finish_reasons", a.get("gen_ai.response.finish_reasons.0"))
        assert reasons in (["tool_use"], "tool_use"), a
        assert a["oceancode.line.tokens"] == 20_000
        assert a["oceancode.window.rows"] > 0
        for k in ("oceancode.state_block.tokens", "oceancode.compress.pointers", "oceancode.context_edit",
                  "oceancode.cut.made", "oceancode.step"):
            assert k in a, (k, a)
        ev = [e for e in x["events"] if e["name"] == "oceancode.cut"]
        assert bool(ev) == a["oceancode.cut.made"], x
        if ev:
            assert a["oceancode.cut.rows"] > 0
            assert ev[0]["attributes"]["oceancode.cut.upto_seq"] > 0
        cut_events += ev
    assert cut_events, "a cut shows up as a span event"
    assert sorted(x["attributes"]["oceancode.step"] for x in spans) == list(range(1, steps + 1))
    # Neither the API key nor message text reached Phoenix.
    dump = json.dumps(spans_of(phoenix))
    assert "sk-ant-test-not-a-real-key" not in dump
    assert "OTEL_ASK_MARKER" not in dump and "OTEL_ANSWER_MARKER" not in dump
    m = h.metrics(st.proxy.url)
    assert m.get("oceancode_otlp_spans_exported_total", 0) >= steps
    assert m.get("oceancode_otlp_spans_dropped_total", 0) == 0
