"""Codex CLI and the OpenAI Python SDK edit their own context through the proxy.

Codex (`codex exec`, Responses API, scripted by the fake upstream) reads a
large build log with its shell, then in one shell command exports its
context (`oceancode-proxy context --json`) and edits context.txt: the log's
block deleted (`[[delete]]` put under its header) and a note added before
the last line. A script driving the `openai` SDK (Chat Completions, a tool
loop) does the same by editing the file directly. In both, the next upstream
request lacks the log and its call, carries the note as the assistant's
words, stays valid (the fake's validator answers 200); the receipt says
taken; the ledger still holds the log verbatim.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import harness as h
import sdkutil as su
from test_codex import CONFIG, MODEL, Upstream, codex_bin, events

TIMEOUT = 240
NOTE = "The build log said: only net/ fails; everything else builds."
LOG_LAST = "build log line 1199"

# Put `[[delete]]` under the header of the block whose tool result holds
# LOG_LAST, and the note before the last line (what an agent's shell does).
EDIT_PY = r"""
import json, re, sys
p = json.load(open(sys.argv[1]))["path"]
t = open(p).read()
blocks = re.split(r"(?m)^(?=\[\[m:)", t)
for i, b in enumerate(blocks):
    if b.startswith("[[m:") and "\n[[tool_result " in b and sys.argv[2] in b:
        head, rest = b.split("\n", 1)
        blocks[i] = head + "\n[[delete]]\n" + rest
        break
else:
    sys.exit("no block holds the log")
t = "".join(blocks)
t = t.replace("[[end of context", "[[note]]\n" + sys.argv[3] + "\n\n[[end of context", 1)
open(p, "w").write(t)
print("edited", p)
"""


def make_log(proj: Path) -> Path:
    p = proj / "build.log"
    p.write_text("".join(f"build log line {i}: compiling crate_{i % 37} v0.{i % 9}.0 ok\n" for i in range(1200)))
    return p


def receipt_of(data: Path) -> str:
    found = list((data / "sessions").glob("*/context.receipt.txt"))
    assert len(found) == 1, found
    return found[0].read_text()


def test_codex_edits_its_context_with_its_shell(tmp_path):
    work = tmp_path
    proj, data, home, codex_home = work / "proj", work / "data", work / "home", work / "codex_home"
    for d in (proj, home, codex_home):
        d.mkdir()
    make_log(proj)
    (proj / "edit_ctx.py").write_text(EDIT_PY)
    edit = (f"{h.PROXY_BIN} --data-dir {data} context --json > ctx.json && "
            f"python3 edit_ctx.py ctx.json '1199: compiling' '{NOTE}'")
    script = {"replies": [
        {"text": "Reading the build log.", "thinking": "Read the log first.",
         "tool_calls": [{"name": "exec_command", "input": {"cmd": "cat build.log"}}]},
        {"text": "Trimming my context.", "thinking": "The log is long; drop it, keep a note.",
         "tool_calls": [{"name": "exec_command", "input": {"cmd": edit}}]},
    ], "default": {"text": "Context trimmed. FINAL_ANSWER_MARKER"}}
    up = Upstream(work, script, "codexctx")
    try:
        (codex_home / "config.toml").write_text(CONFIG.format(model=MODEL, base_url="http://127.0.0.1:9/v1"))
        env = h.base_env(home)
        env.update({"OPENAI_API_KEY": "sk-test-not-a-real-key", "CODEX_HOME": str(codex_home),
                    "RUST_LOG": "warn", "OCEANCODE_LOG": "info,oceancode_proxy=debug"})
        codex = [str(codex_bin()), "exec", "--skip-git-repo-check", "--json",
                 # The shell reaches the proxy's admin API and writes the data dir.
                 "--dangerously-bypass-approvals-and-sandbox",
                 "Check the build log, then trim your context."]
        wrapped = ["sh", "-c", 'exec "$0" "$@" -c "model_providers.oceancode.base_url=\\"$OPENAI_BASE_URL\\""']
        cmd = [str(h.PROXY_BIN), "--data-dir", str(data), "run", "--tideline", "90%",
               "--anthropic-upstream", up.tap.url, "--openai-upstream", up.tap.url, "--", *wrapped, *codex]
        r = h.run(cmd, env, proj, TIMEOUT, log=work / "codex-client.log")
        reqs = [q for q in up.tap.model_requests() if (q["json"] or {}).get("tools")]
        fake_log = up.fake.read_log()
    finally:
        up.stop()
    assert not r.timed_out, f"Codex hung:\n{r.tail()}"
    assert r.code == 0, r.tail()
    evs = events(r.stdout)
    outputs = [e for e in evs if "edited " in json.dumps(e)]
    assert outputs, f"the shell edit ran: {r.tail()}"
    bad = [(q["seq"], q["status"]) for q in reqs if q["status"] != 200]
    assert not bad, f"upstream refused a request: {bad}"
    assert len(reqs) >= 3, len(reqs)
    text = [json.dumps(q["json"].get("input")) for q in reqs]
    before, after = text[1], text[2]
    assert LOG_LAST in before, "the log was in the window before the edit"
    assert LOG_LAST not in after, "the edit took the log out"
    items = reqs[2]["json"]["input"]
    notes = [i for i in items if i.get("role") == "assistant" and NOTE in json.dumps(i)]
    assert notes, "the note is in the window as the assistant's words"
    calls = [i for i in items if i.get("type") == "function_call" and "cat build.log" in json.dumps(i)]
    assert not calls, "the log's call left with it"
    receipt = receipt_of(data)
    assert receipt.startswith("taken · export e1"), receipt
    assert "note 1 added" in receipt, receipt
    totals = [int(x) for x in re.findall(r"total_input_tokens: (\d+)", fake_log)]
    print(f"\nCodex: tokens before → after the edit (the fake's count): {totals}\nreceipt:\n{receipt}")
    led = h.Ledger(data)
    sid = led.sessions()[0]["id"]
    assert any(LOG_LAST in x["raw"] for x in led.rows(sid)), "the ledger keeps the log"
    assert len(led.q("SELECT * FROM context_edits WHERE session=?", sid)) == 1
    led.close()


def test_openai_sdk_script_edits_its_context_file(make_stack):
    tools = [{"type": "function", "function": {
        "name": "run", "description": "Run a command",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}}]
    st = make_stack(script={"replies": [
        {"text": "Reading the log.", "tool_calls": [{"name": "run", "input": {"cmd": "cat build.log"}}]},
        {"text": "Testing.", "tool_calls": [{"name": "run", "input": {"cmd": "make test"}}]},
        {"text": "Again.", "tool_calls": [{"name": "run", "input": {"cmd": "make test"}}]},
    ], "default": {"text": "Done. FINAL_ANSWER_MARKER"}})
    c = su.openai_client(st.url)
    log = "".join(f"build log line {i}: compiling crate_{i % 37} v0.{i % 9}.0 ok\n" for i in range(1200))
    msgs = [{"role": "system", "content": "You are a build agent."},
            {"role": "user", "content": "Check the build log, then run the tests."}]
    results = iter([log, "2 tests failed in net/", "ok"])

    def step():
        r = c.chat.completions.create(model="gpt-4o-mini", messages=msgs, tools=tools)
        m = r.choices[0].message
        msgs.append({"role": "assistant", "content": m.content, "tool_calls": [
            {"id": t.id, "type": "function", "function": {"name": t.function.name, "arguments": t.function.arguments}}
            for t in m.tool_calls or []]})
        for t in m.tool_calls or []:
            msgs.append({"role": "tool", "tool_call_id": t.id, "content": next(results)})
        return r

    step()  # the log
    step()  # the request carrying the log
    # The script exports and edits the file itself.
    ans = h.http_json(st.url + "/_oceancode/context", "POST", {"session": "latest"})
    path = Path(ans["path"])
    text = path.read_text()
    assert LOG_LAST in text
    blocks = re.split(r"(?m)^(?=\[\[m:)", text)
    k = next(i for i, b in enumerate(blocks) if LOG_LAST in b)
    head, rest = blocks[k].split("\n", 1)
    assert rest.startswith("[[tool_result "), rest[:80]
    blocks[k] = head + "\n[[delete]]\n" + rest
    text = "".join(blocks).replace("[[end of context", f"[[note]]\n{NOTE}\n\n[[end of context", 1)
    path.write_text(text)
    step()
    bodies = [json.loads(e["body"]) for e in su.upstream_bodies(st, "/v1/chat/completions", 3)]
    assert len(bodies) == 3
    before, after = json.dumps(bodies[1]["messages"]), json.dumps(bodies[2]["messages"])
    assert LOG_LAST in before and LOG_LAST not in after, "the edit took the log out"
    notes = [m for m in bodies[2]["messages"] if m["role"] == "assistant" and m.get("content") == NOTE]
    assert notes, "the note is the assistant's words"
    assert not any("cat build.log" in json.dumps(m) for m in bodies[2]["messages"]), "its call left with it"
    assert not st.fake_errors(), st.fake_errors()
    # The receipt is written behind the request, with the file's refresh.
    rp = path.parent / "context.receipt.txt"
    for _ in range(100):
        if rp.exists():
            break
        time.sleep(0.05)
    receipt = rp.read_text()
    print(f"\nSDK receipt:\n{receipt}")
    assert receipt.startswith("taken · export e1"), receipt
    st.settle()
    s, rows = su.session_rows(st, "openai-sdk")
    assert any(LOG_LAST in r["raw"] for r in rows), "the ledger keeps the log"
    assert len(st.ledger.q("SELECT * FROM context_edits WHERE session=?", s["id"])) == 1
