"""Session limits (`run --max-steps/--max-spend/--max-time`) stop the real
Claude Code and Codex cleanly.

Each run is a long tool session (the fake scripts 30 tool steps, a 20k
tideline keeps the window small); the proxy refuses the session's request
after the run reached its bound (`x-should-retry: false`): Anthropic's 402
`billing_error` (a 400 `invalid_request_error` Claude Code 2.1.332 sends five
more times), OpenAI's 400 `invalid_request_error` (Codex retries other 4xx). The agent must stop at once:
no retry of the refused request (the proxy logs one refusal per request it
refuses: exactly one), no compaction, nothing more upstream; `run` exits with
its limit code (8) and names the limit.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import harness as h
import test_claude_code as tcc
import test_codex as tcx

LIMIT_EXIT = 8
STEPS = 30
TIMEOUT = 180
# Prices high enough that a few steps of the fake reach the spend cap. The
# output price is low: each request reserves its `max_tokens` (Codex sends
# none: the model's whole allowance) at it before it is let through.
PRICE = {"input": 100.0, "output": 5.0, "cache_read": 10.0, "cache_write": 125.0}
CC_MODEL = "claude-sonnet-4-5"
CODEX_MODEL = tcx.MODEL


def write_config(work: Path) -> Path:
    cfg = work / "config.json"
    cfg.write_text(json.dumps({"providers": {
        "anthropic": {"models": [{"id": CC_MODEL, "price": PRICE}]},
        "openai": {"models": [{"id": CODEX_MODEL, "price": PRICE}]},
    }}))
    return cfg


def refusals(stderr: str) -> int:
    """Requests the proxy refused (one debug line each)."""
    return len(re.findall(r"refused: the session reached a limit", stderr))


def main_requests(reqs: list[dict]) -> list[dict]:
    """The agent loop's requests (tools declared), not titles or summaries."""
    return [r for r in reqs if (r.get("json") or {}).get("tools")]


def run_cmd(work: Path, flags: list[str], up_url: str, client: list[str]) -> list[str]:
    """`oceancode-proxy run` with the limit `flags` around `client`, both upstreams at the fake."""
    return [str(h.PROXY_BIN), "--data-dir", str(work / "data"), "--config", str(write_config(work)),
            "run", "--tideline", "20k", *flags, "--anthropic-upstream", up_url, "--openai-upstream", up_url, "--",
            *client]


def run_claude(work: Path, flags: list[str]):
    proj = work / "proj"
    tcc.make_project(proj)
    up = tcc.Upstream(work, tcc.script_for(proj, STEPS), "lim")
    try:
        env = tcc.cc_env(work / "home")
        (work / "home").mkdir(exist_ok=True)
        cmd = run_cmd(work, flags, up.tap.url, tcc.cc_cmd(tcc.PROMPT, "--model", CC_MODEL))
        r = h.run(cmd, env, proj, TIMEOUT, log=work / "client.log")
        reqs = up.tap.model_requests()
    finally:
        up.stop()
    return r, reqs


def run_codex(work: Path, flags: list[str]):
    proj = work / "proj"
    tcx.make_project(proj)
    up = tcx.Upstream(work, tcx.script_for(STEPS), "lim", end_delay_ms=tcx.END_DELAY_MS)
    try:
        home, codex_home = work / "home", work / "codex_home"
        home.mkdir(exist_ok=True)
        codex_home.mkdir(exist_ok=True)
        (codex_home / "config.toml").write_text(
            tcx.CONFIG.format(model=CODEX_MODEL, base_url="http://127.0.0.1:9/v1"))
        env = h.base_env(home)
        env.update({"OPENAI_API_KEY": "sk-test-not-a-real-key", "CODEX_HOME": str(codex_home),
                    "RUST_LOG": "warn", "OCEANCODE_LOG": "info,oceancode_proxy=debug"})
        wrapped = ["sh", "-c", 'exec "$0" "$@" -c "model_providers.oceancode.base_url=\\"$OPENAI_BASE_URL\\""']
        cmd = run_cmd(work, flags, up.tap.url,
                      [*wrapped, str(tcx.codex_bin()), "exec", "--skip-git-repo-check", "--json", tcx.PROMPT])
        r = h.run(cmd, env, proj, TIMEOUT, log=work / "client.log")
        reqs = up.tap.model_requests()
    finally:
        up.stop()
    return r, reqs


LIMITS = {
    "steps": (["--max-steps", "4"], "reached its step limit: 4 steps made of 4 steps"),
    "spend": (["--max-spend", "6"], "spend limit: $"),
    "time": (["--max-time", "1s"], "reached its time limit: "),
}


def check_stopped(r: h.Run, reqs: list[dict], says: str, limit: str, client: str):
    assert not r.timed_out, r.tail()
    assert r.code == LIMIT_EXIT, r.tail()
    assert "oceancode-proxy: the run stopped at a limit: the run (every session) " in r.stderr, r.tail()
    assert says in r.stderr, r.tail()
    # The agent stopped at the refusal: it sent the refused request once.
    n = refusals(r.stderr)
    print(f"{client} {limit}: {len(main_requests(reqs))} agent requests upstream, "
          f"{n} refused ({n - 1} retries)")
    assert n == 1, f"{n} refusals: the client retried\n{r.tail()}"
    loop = main_requests(reqs)
    assert loop, "nothing went upstream"
    if limit == "steps":
        assert len(loop) == 4, [q["seq"] for q in loop]
    if limit == "spend":
        assert len(loop) >= 2, "more than one step fits under the cap"
    # The refusal reached the agent as the provider's error, with its message.
    assert says in r.stdout, r.tail()


@pytest.mark.parametrize("limit", list(LIMITS))
def test_claude_code_stops_at_a_session_limit_without_retrying(tmp_path, limit):
    flags, says = LIMITS[limit]
    r, reqs = run_claude(tmp_path, flags)
    check_stopped(r, reqs, says, limit, "claude-code")
    evs = tcc.events(r.stdout)
    result = [e for e in evs if e.get("type") == "result"]
    assert result and result[-1].get("is_error"), r.tail()
    assert result[-1].get("api_error_status") == 402, result[-1]
    assert not tcc.compaction_requests(reqs), "Claude Code compacted"


@pytest.mark.parametrize("limit", list(LIMITS))
def test_codex_stops_at_a_session_limit_without_retrying(tmp_path, limit):
    flags, says = LIMITS[limit]
    r, reqs = run_codex(tmp_path, flags)
    check_stopped(r, reqs, says, limit, "codex")
    evs = tcx.events(r.stdout)
    failed = [e for e in evs if e.get("type") in ("turn.failed", "error")]
    assert failed and says in json.dumps(failed), r.tail()
    assert not tcx.compaction_requests(reqs), "Codex compacted"
    # Codex's own retries would show as `Reconnecting… n/5` error events.
    assert not [e for e in evs if "reconnecting" in json.dumps(e).lower()], r.tail()


def test_control_claude_code_resends_a_400_invalid_request_error(tmp_path):
    """Not a proxy test: why the Anthropic refusal is a 402 `billing_error`.
    Claude Code sends a request refused with a 400 `invalid_request_error`
    again (six requests in all), a 402 `billing_error` once."""
    counts = {}
    for status, kind in [(400, "invalid_request_error"), (402, "billing_error")]:
        work = tmp_path / str(status)
        (work / "proj").mkdir(parents=True)
        (work / "home").mkdir()
        body = {"type": "error", "error": {"type": kind, "message": "FAKE_REFUSAL"}}
        up = tcc.Upstream(work, {"replies": [], "default": {"error": {"status": status, "body": body}}}, "ctl")
        try:
            env = tcc.cc_env(work / "home")
            env["ANTHROPIC_BASE_URL"] = up.tap.url
            r = h.run(tcc.cc_cmd("hello", "--model", CC_MODEL), env, work / "proj", TIMEOUT,
                      log=work / "client.log")
            counts[status] = len(main_requests(up.tap.model_requests()))
        finally:
            up.stop()
        assert not r.timed_out and r.code != 0, r.tail()
    print(f"claude-code direct: {counts}")
    assert counts[402] == 1 and counts[400] > 1, counts


def test_control_codex_resends_a_402_and_stops_on_a_400(tmp_path):
    """Not a proxy test: why the OpenAI refusal is a 400 `invalid_request_error`.
    Codex sends a request refused with a 402 again (six requests in all), one
    refused with a 400 once."""
    counts = {}
    for status, kind in [(402, "billing_error"), (400, "invalid_request_error")]:
        work = tmp_path / str(status)
        (work / "proj").mkdir(parents=True)
        body = {"error": {"message": "FAKE_REFUSAL", "type": kind, "param": None, "code": None}}
        up = tcx.Upstream(work, {"replies": [], "default": {"error": {"status": status, "body": body}}}, "ctl")
        try:
            o = tcx.run_codex(work, "ctl", up, [tcx.PROMPT], proxy=False)
            counts[status] = len(o.reqs)
        finally:
            up.stop()
        assert not o.run.timed_out and o.run.code != 0, o.run.tail()
    print(f"codex direct: {counts}")
    assert counts[400] == 1 and counts[402] > 1, counts
