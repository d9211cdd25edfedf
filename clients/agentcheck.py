"""Checks shared by the Claude Code and Codex end-to-end tests."""

from __future__ import annotations

import json
import re
from pathlib import Path

import harness as h

STUB_RX = re.compile(r"every row up to seq (\d+) left this window\. The verbatim record is (\S+)/transcript/")


def stub_of(dialect: str, body: dict) -> str | None:
    """The stub line of an upstream request, or None (Anthropic: first message;
    OpenAI: a user message among the leading ones)."""
    msgs = conversation(dialect, body)
    if not isinstance(msgs, list):
        return None
    for m in msgs:
        text = message_text(m)
        if text.startswith(h.STUB_PREFIX):
            return text
        if m.get("role") in ("assistant", "model") or m.get("type") in ("function_call", "function_call_output"):
            break
    return None


def message_text(m: dict) -> str:
    c = m.get("content", m.get("parts"))
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        return "".join(b.get("text", "") for b in c if isinstance(b, dict))
    return ""


def without_stub(dialect: str, msgs: list) -> list:
    return [m for m in msgs if not message_text(m).startswith(h.STUB_PREFIX)]


def key(v) -> str:
    return json.dumps(h.canon(v), sort_keys=True, ensure_ascii=False)


def check_stub_upstream(dialect: str, reqs: list[dict], session_dir: Path) -> dict:
    """Every upstream request after the first cut carries one stub; the stub is
    byte-identical between cuts and points into the session's ledger directory.
    Returns {"first_cut_index", "cut_seqs", "stubs"}."""
    stubs = [stub_of(dialect, r["json"]) for r in reqs]
    first = next((i for i, s in enumerate(stubs) if s), None)
    assert first is not None, "the upstream never saw a tideline stub"
    missing = [i for i in range(first, len(stubs)) if not stubs[i]]
    assert not missing, f"requests {missing} after the first cut carry no stub"
    seqs = []
    for s in stubs[first:]:
        m = STUB_RX.search(s)
        assert m, f"stub does not match the spec wording: {s[:300]}"
        seqs.append(int(m.group(1)))
        assert Path(m.group(2)).resolve() == session_dir.resolve(), (m.group(2), session_dir)
    # Stable between cuts: the same cut point means the same bytes.
    by_seq = {}
    for s, n in zip(stubs[first:], seqs):
        by_seq.setdefault(n, set()).add(s)
    unstable = {n: len(v) for n, v in by_seq.items() if len(v) > 1}
    assert not unstable, f"stub text changed without a cut: {unstable}"
    back = [(a, b) for a, b in zip(seqs, seqs[1:]) if b < a]
    assert not back, (f"a cut was undone: the stub went from 'up to seq {back[0][0]}' back to "
                      f"'up to seq {back[0][1]}' (rows past the tideline re-entered the window); "
                      f"stub seqs: {sorted(set(seqs))}")
    check_append_only(dialect, reqs, stubs)
    return {"first_cut_index": first, "cut_seqs": sorted(set(seqs)), "stubs": stubs}


def conversation(dialect: str, body: dict) -> list:
    key = {"responses": "input", "gemini": "contents"}.get(dialect, "messages")
    return body.get(key) or []


def check_append_only(dialect: str, reqs: list[dict], stubs: list):
    """SPEC §4: between cuts the outgoing request only appends, so the provider's
    prompt cache keeps hitting (normalized per SPEC §2: Claude Code moves its
    cache_control marker)."""
    for i in range(1, len(reqs)):
        if stubs[i] != stubs[i - 1]:
            continue
        prev = [key(m) for m in conversation(dialect, reqs[i - 1]["json"])]
        cur = [key(m) for m in conversation(dialect, reqs[i]["json"])]
        first_diff = next((j for j, (a, b) in enumerate(zip(prev, cur)) if a != b), len(prev))
        assert cur[: len(prev)] == prev, (
            f"upstream request {reqs[i]['seq']} rewrote the window without a cut "
            f"(first difference at message {first_diff})")


def check_gauge_follows_usage(led: h.Ledger, sid: str, exempt_steps=()):
    """SPEC §4: the gauge at a request is the previous step's real usage (input +
    cache read + cache write + output) plus the estimate of the rows this request
    adds. Every cut records its gauge: it must match that sum (the proxy's own row
    estimates, so only a small tolerance), else the line is judged on stale or
    invented numbers (over-cutting: cache misses, context lost for nothing).
    Steps in `exempt_steps` (the first request a fresh proxy sees of a restored
    session is seeded from estimates) are not checked."""
    steps = led.steps(sid)
    by_step = {s["step"]: s for s in steps}
    added = {}
    for r in led.rows(sid):
        if not r["from_response"]:
            added[r["step"]] = added.get(r["step"], 0) + r["tokens"]
    bad = []
    for c in led.cuts(sid):
        step = next((s["step"] for s in steps if s["ts_ms"] >= c["ts_ms"]), None)
        prev = by_step.get(step - 1) if step else None
        if step is None or step in exempt_steps or prev is None or prev["status"] != 200:
            continue
        real = prev["input"] + prev["cache_read"] + prev["cache_write"] + prev["output"]
        expected = real + added.get(step, 0)
        if abs(c["gauge"] - expected) > 0.15 * expected + 500:
            bad.append({"step": step, "cut_upto": c["upto_seq"], "recorded_gauge": c["gauge"],
                        "prev_step_real_usage": real, "rows_added_estimate": added.get(step, 0),
                        "expected_gauge": expected})
    assert not bad, f"cuts made on a gauge that is not the real usage + the new rows: {bad}"


def check_transcripts(session_dir: Path, needles: list[str]):
    """The stub's pointer is real: transcript files exist and hold tool output verbatim."""
    tdir = session_dir / "transcript"
    files = sorted(tdir.glob("*.md"))
    assert files, f"no transcript files in {tdir}"
    text = "\n".join(f.read_text(errors="replace") for f in files)
    for n in needles:
        assert n in text, f"{n!r} is not in the transcripts under {tdir}"


POINTER_RX = re.compile(r"^\[pruned tool output: seq (\d+) · ")
PRUNED = "<pruned>"


def pointer_seq(text) -> int | None:
    """The seq a `ledger.compress` pointer names, or None."""
    m = POINTER_RX.match(text) if isinstance(text, str) else None
    return int(m.group(1)) if m else None


def unpointed(m: dict):
    """(seq, m with its pruned tool outputs masked, the parts masked) when
    `ledger.compress` sent some of m's tool output as pointers, else None."""
    m = json.loads(json.dumps(m))
    if m.get("type") in ("function_call_output", "custom_tool_call_output"):
        seq = pointer_seq(m.get("output"))
        if seq is None:
            return None
        m["output"] = PRUNED
        return seq, m, None
    if m.get("role") == "tool":
        seq = pointer_seq(message_text(m))
        if seq is None:
            return None
        m["content"] = PRUNED
        return seq, m, None
    if isinstance(m.get("parts"), list):  # Gemini: functionResponse.response.output
        seq, parts = None, []
        for i, p in enumerate(m["parts"]):
            r = p.get("functionResponse", {}).get("response") if isinstance(p, dict) else None
            n = pointer_seq(r.get("output")) if isinstance(r, dict) else None
            if n is not None:
                seq, parts = n, parts + [i]
                r["output"] = PRUNED
        return (seq, m, ["gemini"] + parts) if seq is not None else None
    c = m.get("content")
    if not isinstance(c, list):
        return None
    seq, parts = None, []
    for i, b in enumerate(c):
        if isinstance(b, dict) and b.get("type") == "tool_result":
            inner = b.get("content")
            n = pointer_seq(inner if isinstance(inner, str) else message_text(b))
            if n is not None:
                seq, parts = n, parts + [i]
                b["content"] = PRUNED
    return (seq, m, parts) if seq is not None else None


def masked(raw: dict, parts) -> dict:
    """A ledger row with the tool outputs at `parts` masked like `unpointed`."""
    r = json.loads(json.dumps(raw))
    if parts and parts[0] == "gemini":
        for i in parts[1:]:
            r["parts"][i]["functionResponse"]["response"]["output"] = PRUNED
        return r
    if parts is None:
        r["output" if "output" in r else "content"] = PRUNED
    else:
        for i in parts:
            r["content"][i]["content"] = PRUNED
    return r


def check_rows_verbatim(ledger_rows: list, upstream_msgs_per_req: list[list], dialect: str):
    """The ledger holds every message verbatim:
    - seqs are gap-free from 1, none hidden (no rewinds here);
    - every message any upstream request carried (the stub aside) is a ledger row
      (normalized per SPEC §2: cache_control moves, string ≡ one text block),
      or one whose old tool output `ledger.compress` sent as a pointer: the
      row the pointer names, equal but for that output;
    - every row the client sent reached the upstream at least once.
    """
    seqs = [r["seq"] for r in ledger_rows]
    assert seqs == list(range(1, len(seqs) + 1)), f"seq gaps: {seqs[:5]}..{seqs[-5:]}"
    hidden = [r["seq"] for r in ledger_rows if r["hidden"]]
    assert not hidden, f"rows hidden by a branch: {hidden}"
    row_keys = {}
    for r in ledger_rows:
        row_keys.setdefault(key(json.loads(r["raw"])), r["seq"])
    by_seq = {r["seq"]: json.loads(r["raw"]) for r in ledger_rows}
    sent = set()
    for msgs in upstream_msgs_per_req:
        for m in without_stub(dialect, msgs):
            k = key(m)
            if k not in row_keys and (p := unpointed(m)):
                seq, got, parts = p
                assert seq in by_seq, f"a pointer names no ledger row: {k[:300]}"
                assert key(masked(by_seq[seq], parts)) == key(got), (
                    f"a pointer names seq {seq}, whose row differs from the message but for its "
                    f"tool output: {k[:300]} vs {json.dumps(by_seq[seq])[:300]}")
                sent.add(seq)
                continue
            assert k in row_keys, f"an upstream message is not in the ledger: {k[:300]}"
            sent.add(row_keys[k])
    # Response rows never echoed back (the final answer) are the only rows
    # allowed not to reach the upstream.
    unsent = [r["seq"] for r in ledger_rows if r["seq"] not in sent and not r["from_response"]]
    assert not unsent, f"rows that never reached the upstream: {unsent}"
