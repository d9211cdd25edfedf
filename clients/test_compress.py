"""`ledger.compress` through the real clients (issue 15): Claude Code and Codex.

    real client ──► oceancode-proxy run ──► tap (records) ──► fakeup

A config file puts the tideline low (a 40k line, blocks of 35% of it, the
default protected zone: 10% of the line), so a 60-step tool session of
~1k-token `seq` outputs is cut several times and at each cut compress sends
the old outputs of the retained window upstream as one pointer line each.
Asserted on what the upstream received (the tap's log):

- every request valid (200: the fake validates every conversation), the
  stub stable between cuts and the window append-only there, the ledger
  holding every row verbatim (a pointer stands for its row's output only);
- every pointer names a transcript file of the session and lines A–B whose
  section is the row's (its anchor first, the next row's after) and holds
  exactly the original output, as `oceancode-proxy recall entry N --raw`
  prints the row;
- between cuts (a request whose stub is the previous request's) the request
  reads the whole previous request back from the prompt cache (the proxy
  changed none of its bytes), and Σ cache read ÷ Σ input over those requests
  is ≥ 0.94, overall and after the first cut (the fake's usage);
- an agent that follows a pointer gets the original: every few steps the
  fake's `follow_pointer` reply (`fresh`: a pointer not followed before)
  makes the agent open a pointer's lines (Claude Code: `Read` with offset A,
  limit B−A+1; Codex: `sed -n 'A,Bp' FILE`), and the tool result the client
  sends back holds the original output.

The ratio between cuts is 1 − (a step's new tokens ÷ the window): with every
request read back whole it measures the session's shape, not the proxy. At
a 30k line with a 2k zone the compressed windows were 13.5k–21k (Codex; 8k
of it instructions and tools) against ~1.05k new tokens a step, 0.938 with
nothing missed; at a 40k line with the default zone they are ~17k–31k and
the ratio ~0.95 (a real session at a 200k model's 80k line, with 56k blocks,
has far larger windows per step). The steps that follow a pointer are the
heaviest (the transcript's lines back in the window, ~2k tokens): a few of
them, as an agent would.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import agentcheck as ac
import harness as h
import test_claude_code as tcc
import test_codex as tcx

TIMEOUT = 240
PROMPT = "Work through the numbered steps in this directory."
FINAL = "All steps done. FINAL_ANSWER_MARKER"
LINE = 40_000
PROTECT = "10%"
MIN_CACHE_RATIO = 0.94
CONFIG = {"ledger": {"tideline": {"tokens": LINE, "block": "35%"},
                     "compress": {"enabled": True, "protect": PROTECT, "min_tokens": 500}}}
# The pointer line (window/src/compress.rs `pointer_text`), its lines form.
POINTER_RX = re.compile(r"^\[pruned tool output: seq (\d+) · (\d+) tokens · (transcript/\d{4}\.md) "
                        r"lines (\d+)–(\d+) · oceancode-proxy recall entry (\d+)\]$")
FENCE_RX = re.compile(r"^(`{3,})[\w-]*$")
SYSTEM_REMINDER = re.compile(r"<system-reminder>.*?</system-reminder>", re.S)


def write_config(work: Path) -> Path:
    p = work / "oceancode.json"
    p.write_text(json.dumps(CONFIG, indent=1))
    return p


def seq_cmd(i: int) -> str:
    # ~1k tokens of output a step (the fake counts o200k tokens; the proxy's
    # estimate, bytes ÷ 4, is ~580, over `min_tokens`): ~13 steps a block.
    return f"seq {i * 10000} {i * 10000 + 330}"


# ---------------------------------------------------------------- the upstream's view

def conv(dialect: str, q: dict) -> list:
    return ac.conversation(dialect, q["json"] or {})


def pointers_of(dialect: str, m: dict) -> list[tuple[int | None, str]]:
    """(part, pointer text) of every output of `m` sent as a pointer (part: the
    block's index in an Anthropic message, None for a Responses item)."""
    out = []
    if dialect == "responses":
        o = m.get("output")
        if m.get("type") in ("function_call_output", "custom_tool_call_output") and isinstance(o, str) \
                and ac.pointer_seq(o) is not None:
            out.append((None, o))
        return out
    c = m.get("content")
    for i, b in enumerate(c if isinstance(c, list) else []):
        if isinstance(b, dict) and b.get("type") == "tool_result" and ac.pointer_seq(b.get("content")) is not None:
            out.append((i, b["content"]))
    return out


def parse_pointer(text: str) -> dict:
    m = POINTER_RX.match(text)
    assert m, f"a pointer without a line range, or not in the documented form: {text}"
    seq, tokens, path, a, b, entry = m.groups()
    assert seq == entry, text
    return {"seq": int(seq), "tokens": int(tokens), "path": path, "from": int(a), "to": int(b), "text": text}


def newest_pointer(dialect: str, q: dict, skip: set) -> dict | None:
    """The pointer the fake's `follow_pointer` (`fresh`) follows: the last in
    the conversation not followed before (with its part)."""
    found = [(part, t) for m in conv(dialect, q) for part, t in pointers_of(dialect, m) if t not in skip]
    if not found:
        return None
    part, text = found[-1]
    return {**parse_pointer(text), "part": part}


def usage_of(dialect: str, q: dict) -> tuple[int, int]:
    """(cache read, total input) of the fake's answer, from the tap's record."""
    events = []
    for line in q["response"].splitlines():
        if line.startswith("data: "):
            try:
                events.append(json.loads(line[6:]))
            except ValueError:
                pass
    if not events:
        events = [json.loads(q["response"])]
    for e in reversed(events):
        if dialect == "responses":
            u = (e.get("response") or e).get("usage")
            if u:
                return (u.get("input_tokens_details") or {}).get("cached_tokens", 0), u["input_tokens"]
        else:
            u = e.get("usage") or (e.get("message") or {}).get("usage")
            if u and "input_tokens" in u:
                read = u.get("cache_read_input_tokens") or 0
                return read, u["input_tokens"] + read + (u.get("cache_creation_input_tokens") or 0)
    raise AssertionError(f"no usage in the answer to request {q['seq']}: {q['response'][:300]}")


def fences(lines: list[str]) -> list[str]:
    """The bodies of the fenced code blocks among `lines` (a fence closes with
    the same run of backticks it opened with)."""
    out, i = [], 0
    while i < len(lines):
        m = FENCE_RX.match(lines[i])
        if not m:
            i += 1
            continue
        ticks, body, i = m.group(1), [], i + 1
        while i < len(lines) and lines[i] != ticks:
            body.append(lines[i])
            i += 1
        out.append("\n".join(body))
        i += 1
    return out


def output_texts(dialect: str, raw: dict, part: int | None) -> list[str]:
    """The original output of a ledger row as the transcript fences it: a
    string is one fence, each text part of a list one fence (ends without
    the newline the fence adds)."""
    c = raw.get("output") if part is None else raw["content"][part].get("content")
    parts = [c] if isinstance(c, str) else [p.get("text", "") for p in c or [] if isinstance(p, dict)]
    return [p[:-1] if p.endswith("\n") else p for p in parts]


def holds(bodies: list[str], want: list[str]) -> bool:
    """`want` is a contiguous run of `bodies`."""
    n = len(want)
    return any(bodies[i:i + n] == want for i in range(len(bodies) - n + 1))


def recall_raw(data: Path, home: Path, sid: str, seq: int) -> dict:
    """The row as `oceancode-proxy recall entry N --raw` prints it (the command
    every pointer names)."""
    r = h.run([str(h.PROXY_BIN), "--data-dir", str(data), "recall", "entry", str(seq), "--session", sid, "--raw"],
              h.base_env(home), data.parent, 30)
    assert r.code == 0, r.tail()
    return json.loads(r.stdout)


def check_pointers(dialect: str, reqs: list[dict], session_dir: Path, data: Path, home: Path) -> dict:
    """Every pointer the upstream saw names lines of a transcript file of the
    session whose section is its row's and holds exactly the original output.
    Returns {(seq, part): (pointer, original texts)}."""
    sid = session_dir.name
    seen: dict = {}
    raws: dict[int, dict] = {}
    for q in reqs:
        for m in conv(dialect, q):
            for part, text in pointers_of(dialect, m):
                p = parse_pointer(text)
                key = (p["seq"], part)
                if key in seen:
                    assert seen[key][0]["text"] == text, f"the pointer for {key} changed: {text}"
                    continue
                if p["seq"] not in raws:
                    raws[p["seq"]] = recall_raw(data, home, sid, p["seq"])
                want = output_texts(dialect, raws[p["seq"]], part)
                assert want and all(want), f"seq {p['seq']}: no original output in the row"
                assert not any(ac.pointer_seq(w) is not None for w in want), "the ledger keeps the original"
                f = session_dir / p["path"]
                assert f.is_file(), f"{text}: {f} does not exist"
                lines = f.read_text().split("\n")
                a, b = p["from"], p["to"]
                assert 1 <= a <= b <= len(lines), f"{text}: {f.name} has {len(lines)} lines"
                section = lines[a - 1:b]
                assert section[0].startswith(f"## seq {p['seq']} ·"), f"{text}: line {a} is {section[0]!r}"
                # The range ends with the row: the next section (or the end) follows.
                after = lines[b:b + 2]
                assert after in ([""], []) or (after[0] == "" and after[1].startswith("## seq ")), \
                    f"{text}: lines {b + 1}… are {after!r}, not the next row"
                assert holds(fences(section), want), (
                    f"{text}: lines {a}–{b} of {f} do not hold the original output exactly\n"
                    f"section: {section[:6]}…\nwant: {[w[:200] for w in want]}")
                seen[key] = (p, want)
    return seen


def check_cache_between_cuts(dialect: str, reqs: list[dict]) -> dict:
    """Between cuts (a request whose stub is the previous request's) the
    request reads the whole previous request back from the prompt cache: the
    proxy changed none of its bytes. Returns Σ cache read ÷ Σ input over
    those requests, overall and after the first cut."""
    stubs = [ac.stub_of(dialect, q["json"]) for q in reqs]
    usage = [usage_of(dialect, q) for q in reqs]
    read = total = read_cut = total_cut = n = 0
    missed = []
    for i in range(1, len(reqs)):
        if stubs[i] != stubs[i - 1]:
            continue
        r, t = usage[i]
        if r != usage[i - 1][1]:
            missed.append((reqs[i]["seq"], r, usage[i - 1][1]))
        read, total, n = read + r, total + t, n + 1
        if stubs[i]:
            read_cut, total_cut = read_cut + r, total_cut + t
    assert not missed, f"between cuts a request did not read the previous one back (seq, read, previous): {missed}"
    return {"ratio": read / total if total else 0.0, "ratio_cut": read_cut / total_cut if total_cut else 0.0,
            "requests": n, "cuts": len({s for s in stubs if s})}


def common_checks(dialect: str, reqs: list[dict], session_dir: Path, data: Path, home: Path) -> dict:
    bad = [(q["seq"], q["status"], q["response"][:300]) for q in reqs if q["status"] != 200]
    assert not bad, f"the upstream rejected a request: {bad}"
    ac.check_stub_upstream(dialect, reqs, session_dir)
    led = h.Ledger(data)
    try:
        rows = led.rows(session_dir.name)
        ac.check_rows_verbatim(rows, [conv(dialect, q) for q in reqs], dialect)
    finally:
        led.close()
    pointers = check_pointers(dialect, reqs, session_dir, data, home)
    cache = check_cache_between_cuts(dialect, reqs)
    return {"pointers": pointers, "cache": cache}


def followed(dialect: str, reqs: list[dict], is_follow, result_text) -> list[tuple[dict, dict, str]]:
    """(pointer followed, the call's input, the tool result the client sent
    back) for each call the fake made from a pointer: a call first seen in
    request j answered request j−1, whose newest pointer not followed
    before it follows."""
    out, seen, done = [], set(), set()
    for j, q in enumerate(reqs):
        msgs = conv(dialect, q)
        for k, m in enumerate(msgs):
            for call_id, inp in is_follow(m):
                if call_id in seen:
                    continue
                seen.add(call_id)
                p = newest_pointer(dialect, reqs[j - 1], done)
                assert p, f"request {reqs[j - 1]['seq']} holds no pointer to follow, yet the fake followed one"
                done.add(p["text"])
                res = result_text(msgs[k + 1:], call_id)
                assert res is not None, f"no result for {call_id} in request {q['seq']}"
                out.append((p, inp, res))
    return out


def checked_session(label: str, tool: str, dialect: str, reqs: list[dict], session_dir: Path, data: Path,
                    home: Path, is_follow, result_text, t0: float):
    """The checks both clients' sessions get (common_checks, and the cuts,
    pointers and follows that prove something), with one line of figures:
    (pointers, cache figures, follows)."""
    got = common_checks(dialect, reqs, session_dir, data, home)
    cache, pointers = got["cache"], got["pointers"]
    follows = followed(dialect, reqs, is_follow, result_text)
    print(f"{label}: {len(reqs)} requests, {cache['cuts']} cuts, {len(pointers)} outputs sent as pointers, "
          f"{len(follows)} pointers followed with {tool} ({len(distinct(follows))} distinct); cache read / input between cuts {cache['ratio']:.3f} "
          f"({cache['requests']} requests; after the first cut {cache['ratio_cut']:.3f}); "
          f"{time.monotonic() - t0:.0f}s")
    assert cache["cuts"] >= 3, f"the session must cross the line several times: {cache['cuts']} cuts"
    assert len(pointers) >= 5, f"compress pruned too little to prove anything: {len(pointers)}"
    assert len(distinct(follows)) >= 3, f"only {len(distinct(follows))} distinct pointers were followed"
    return pointers, cache, follows


def check_opened(tool: str, p: dict, lines: list[str], res: str, pointers: dict):
    """What the agent's `tool` printed of pointer `p` (its `lines`) is the
    row's section: its anchor first, the original output inside."""
    assert lines and lines[0].startswith(f"## seq {p['seq']} ·"), f"{tool} did not land on the row: {res[:400]}"
    want = pointers[(p["seq"], p["part"])][1]
    assert holds(fences(lines), want), f"{tool} of {p['text']} did not return the original:\n{res[:1500]}"


def check_ratio(cache: dict):
    for k in ("ratio", "ratio_cut"):
        assert cache[k] >= MIN_CACHE_RATIO, f"cache read / input between cuts ({k}): {cache[k]:.3f}"


def distinct(follows) -> set:
    return {(p["seq"], p["part"]) for p, _, _ in follows}


# ---------------------------------------------------------------- Claude Code

CC_STEPS = 60
CC_FOLLOW = set(range(31, CC_STEPS + 1, 6))


def cc_script(proj: Path) -> dict:
    replies = []
    for i in range(1, CC_STEPS + 1):
        r = {"text": f"Step {i}.", "tool_calls": [{"name": "Bash", "input": {
            "command": seq_cmd(i), "description": f"Print the numbers of step {i}"}}]}
        if i in CC_FOLLOW:
            # With a pointer in the request: Read its lines too (two calls);
            # without one the step is only its Bash call.
            r["follow_pointer"] = {"name": "Read", "fresh": True, "input": {
                "file_path": "{file}", "offset": "{from}", "limit": "{count}"}}
        replies.append(r)
    return {"replies": replies, "default": {"text": FINAL}}


def cc_reads(m: dict):
    c = m.get("content") if m.get("role") == "assistant" else None
    for b in c if isinstance(c, list) else []:
        if b.get("type") == "tool_use" and b.get("name") == "Read" and "/transcript/" in str(
                (b.get("input") or {}).get("file_path")):
            yield b["id"], b["input"]


def cc_result(msgs: list, call_id: str) -> str | None:
    for m in msgs:
        for b in m.get("content") if isinstance(m.get("content"), list) else []:
            if b.get("type") == "tool_result" and b.get("tool_use_id") == call_id:
                c = b.get("content")
                return c if isinstance(c, str) else "".join(x.get("text", "") for x in c or [])
    return None


def read_lines(text: str) -> list[str]:
    """Claude Code's Read result as the file's lines: its reminders dropped and
    each line's `   N→` number taken off."""
    text = SYSTEM_REMINDER.sub("", text)
    out = []
    for line in text.split("\n"):
        m = re.match(r"^\s*\d+(?:→|\t)(.*)$", line)
        if m:
            out.append(m.group(1))
    return out


def test_claude_code_compress_pointers_are_valid_cached_and_followed(tmp_path):
    t0 = time.monotonic()
    work = tmp_path
    proj = work / "proj"
    proj.mkdir()
    (work / "home").mkdir()
    up = tcc.Upstream(work, cc_script(proj), "compress")
    data = work / "data"
    try:
        cmd = [str(h.PROXY_BIN), "--config", str(write_config(work)), "--data-dir", str(data), "run",
               "--anthropic-upstream", up.tap.url, "--openai-upstream", up.tap.url, "--",
               *tcc.cc_cmd(PROMPT, "--allowedTools", "Bash,Read")]
        r = h.run(cmd, tcc.cc_env(work / "home"), proj, TIMEOUT, log=work / "client.log")
        reqs = up.tap.model_requests()
    finally:
        up.stop()
    assert not r.timed_out and r.code == 0, r.tail()
    assert FINAL in r.stdout, r.tail()
    dirs = [Path(x) for x in re.findall(r"oceancode-proxy: ledger (\S+)", r.stderr)]
    assert len(dirs) == 1, r.tail()
    loop = [q for q in reqs if (q.get("json") or {}).get("tools")]
    assert len(loop) >= CC_STEPS, len(loop)
    assert all(q["status"] == 200 for q in reqs), [(q["seq"], q["status"]) for q in reqs]
    assert not tcc.compaction_requests(reqs), "Claude Code compacted"

    pointers, cache, follows = checked_session("claude code", "Read", "anthropic", loop, dirs[0], data,
                                               work / "home", cc_reads, cc_result, t0)

    # Claude Code's Read at the pointer's lines gets the original output.
    for p, inp, res in follows:
        assert inp == {"file_path": str(dirs[0] / p["path"]), "offset": p["from"],
                       "limit": p["to"] - p["from"] + 1}, (inp, p)
        check_opened("Read", p, read_lines(res), res, pointers)

    check_ratio(cache)


# ---------------------------------------------------------------- Codex

CX_STEPS = 60
CX_FOLLOW = set(range(31, CX_STEPS + 1, 6))


def cx_script() -> dict:
    replies = []
    for i in range(1, CX_STEPS + 1):
        r = {"text": f"Step {i}.", "tool_calls": [{"name": "exec_command", "input": {"cmd": seq_cmd(i)}}]}
        if i in CX_FOLLOW:
            r["follow_pointer"] = {"name": "exec_command", "fresh": True,
                                   "input": {"cmd": "sed -n '{from},{to}p' {file}"}}
        replies.append(r)
    return {"replies": replies, "default": {"text": FINAL}}


def cx_seds(m: dict):
    if m.get("type") == "function_call" and m.get("name") == "exec_command":
        args = json.loads(m.get("arguments") or "{}")
        if "/transcript/" in args.get("cmd", "") and args["cmd"].startswith("sed -n"):
            yield m["call_id"], args


def cx_result(msgs: list, call_id: str) -> str | None:
    for m in msgs:
        if m.get("type") == "function_call_output" and m.get("call_id") == call_id:
            o = m.get("output")
            return o if isinstance(o, str) else "".join(x.get("text", "") for x in o or [])
    return None


def test_codex_compress_pointers_are_valid_cached_and_followed(tmp_path):
    t0 = time.monotonic()
    work = tmp_path
    (work / "proj").mkdir()
    up = tcx.Upstream(work, cx_script(), "compress", end_delay_ms=tcx.END_DELAY_MS)
    try:
        o = run_codex(work, up)
    finally:
        up.stop()
    tcx.check_completed(o)
    assert len(o.session_dirs) == 1, o.run.tail()
    loop = [q for q in o.reqs if (q.get("json") or {}).get("tools")]
    assert len(loop) >= CX_STEPS, len(loop)
    assert all(q["status"] == 200 for q in o.reqs), [(q["seq"], q["status"]) for q in o.reqs]

    pointers, cache, follows = checked_session("codex", "sed", "responses", loop, o.session_dirs[0], o.data,
                                               o.home, cx_seds, cx_result, t0)

    for p, args, res in follows:
        assert args["cmd"] == f"sed -n '{p['from']},{p['to']}p' {o.session_dirs[0] / p['path']}", (args, p)
        # exec_command's output: a header, then `Output:` and what sed printed.
        assert "\nOutput:\n" in res, res[:500]
        check_opened("sed", p, res.split("\nOutput:\n", 1)[1].split("\n"), res, pointers)

    check_ratio(cache)


def run_codex(work: Path, up) -> tcx.CodexRun:
    """`oceancode-proxy --config … run -- codex exec`, as test_codex.run_codex
    but with the compress config."""
    o = tcx.CodexRun()
    o.work, o.home, o.proj, o.data = work, work / "home", work / "proj", work / "data"
    o.codex_home = work / "codex_home"
    o.home.mkdir(exist_ok=True)
    o.codex_home.mkdir(exist_ok=True)
    (o.codex_home / "config.toml").write_text(tcx.CONFIG.format(model=tcx.MODEL, base_url="http://127.0.0.1:9/v1"))
    env = h.base_env(o.home)
    env.update({"OPENAI_API_KEY": "sk-test-not-a-real-key", "CODEX_HOME": str(o.codex_home),
                "RUST_LOG": "warn", "OCEANCODE_LOG": "info,oceancode_proxy=debug"})
    codex = [str(tcx.codex_bin()), "exec", "--skip-git-repo-check", "--json", PROMPT]
    wrapped = ["sh", "-c", 'exec "$0" "$@" -c "model_providers.oceancode.base_url=\\"$OPENAI_BASE_URL\\""']
    cmd = [str(h.PROXY_BIN), "--config", str(write_config(work)), "--data-dir", str(o.data), "run",
           "--anthropic-upstream", up.tap.url, "--openai-upstream", up.tap.url, "--", *wrapped, *codex]
    o.run = h.run(cmd, env, o.proj, TIMEOUT, log=work / "client.log")
    o.events = tcx.events(o.run.stdout)
    o.reqs = up.tap.model_requests()
    o.fake_log = up.fake.read_log()
    o.session_dirs = [Path(x) for x in re.findall(r"oceancode-proxy: ledger (\S+)", o.run.stderr)]
    return o
