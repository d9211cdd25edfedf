"""Claude Code switching models and back, through `oceancode-proxy run`.

Prompt caches are per model, and the fake upstream keeps one per model as a
provider does. Three runs of one session: `--model` A, then `--continue`
with B, then `--continue` with A again within the 5-minute TTL (what
Claude Code's `opusplan` does between planning and acting). The first
request on B finds B's cache cold; the first one back on A finds A's cache
warm. Each run is its own proxy (`oceancode-proxy run`), so the third one
knows when A was last sent only from the ledger. `status --json` must say
exactly that: one `model_switch` miss, at B's first step; and the step
back on A read from the cache and was not taken for a cold one.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import harness as h
from test_claude_code import Upstream, cc_env, events
from test_claude_code_agent_features import run_cc

A, B = "claude-sonnet-4-5", "claude-haiku-4-5"


def step(i: int) -> dict:
    return {"text": f"Step {i}.", "tool_calls": [{"name": "Bash", "input": {
        "command": f"seq {i * 1000} {i * 1000 + 300}", "description": f"Print the numbers of step {i}"}}]}


def run(work: Path, up: Upstream, name: str, prompt: str, *extra: str) -> h.Run:
    """One `oceancode-proxy run` of Claude Code at a 100k line (no cut)."""
    r, _ = run_cc(work, up, prompt, "--allowedTools", "Bash,Read", *extra, line="100k",
                  log=f"{name}-client.log")
    assert not r.timed_out and r.code == 0, r.tail()
    result = [e for e in events(r.stdout) if e.get("type") == "result"]
    assert result and not result[-1].get("is_error"), r.tail()
    return r


def test_claude_code_switching_back_within_the_ttl_finds_the_cache_warm(tmp_path):
    script = {"replies": [step(1), step(2), {"text": "First part done."},
                          step(3), {"text": "Planned."},
                          step(4), step(5)],
              "default": {"text": "All steps done. FINAL_ANSWER_MARKER"}}
    up = Upstream(tmp_path, script, "switch")
    try:
        run(tmp_path, up, "a", "Work through the first part.", "--model", A)
        n_a = len(up.tap.model_requests())
        run(tmp_path, up, "b", "Plan the next part.", "--model", B, "--continue")
        n_b = len(up.tap.model_requests())
        run(tmp_path, up, "a2", "Carry the plan out.", "--model", A, "--continue")
        reqs = up.tap.model_requests()
    finally:
        up.stop()
    models = [q["json"]["model"] for q in reqs]
    # (Claude Code may send B under a newer name of the same family.)
    assert set(models[:n_a]) == {A} and set(models[n_b:]) == {A}, models
    assert len(set(models[n_a:n_b])) == 1 and models[n_a] != A, models

    out = h.run([str(h.PROXY_BIN), "--data-dir", str(tmp_path / "data"), "status", "--json"],
                cc_env(tmp_path / "home"), tmp_path, 60)
    assert out.code == 0, out.tail()
    st = json.loads(out.stdout)
    sessions = st if isinstance(st, list) else st.get("sessions", [st])
    assert len(sessions) == 1, [s.get("id") for s in sessions]
    cache = sessions[0]["cache"]
    misses = {m["cause"]: m["steps"] for m in cache.get("misses", [])}
    # B's first request is the only one whose cache was cold; back on A
    # the fake read A's prefix from its cache, and nothing was labelled.
    assert misses.get("model_switch") == 1, cache
    assert cache["last_miss"]["cause"] == "model_switch", cache
    assert cache["last_miss"]["step"] == n_a + 1, (cache, n_a, n_b)
    # The proxy's own view of the step back on A: not cold (before, a
    # resumed session remembered only its last model, and flagged it).
    db = sqlite3.connect(tmp_path / "data" / "oceancode.db")
    back = db.execute("SELECT detail FROM steps WHERE step = ?", (n_b + 1,)).fetchone()
    cache_note = (json.loads(back[0] or "{}") if back else {}).get("cache") or {}
    assert "cold" not in cache_note, cache_note
