"""One SDK agent, as a script started several times at once: a tool loop with the
`anthropic` or `openai` (Chat Completions) SDK against `base_url`, no session header,
the same system prompt and first message as every other copy; its tool results carry
its own marker. Prints one JSON line: the window the SDK was told of at each step
and the messages it ended with.

    python sdk_agent.py anthropic|openai BASE_URL MARKER
"""

from __future__ import annotations

import json
import sys

import sdkutil as su

SYSTEM = "You are a test agent. Use the tool until the task is done."
FIRST = "Check the weather in every city on the list."
ANT_TOOLS = [{"name": "get_weather", "description": "Weather of a city",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
CHAT_TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


def result(marker: str, step: int) -> str:
    return f"{marker} step {step}\n" + su.big_text(step, 300)


def anthropic_agent(url: str, marker: str) -> dict:
    c = su.anthropic_client(url)
    msgs = [{"role": "user", "content": FIRST}]
    windows = []
    for step in range(100):
        r = c.messages.create(model="claude-opus-5-5", max_tokens=512, system=SYSTEM, tools=ANT_TOOLS,
                              messages=msgs)
        u = r.usage
        windows.append(u.input_tokens + (u.cache_read_input_tokens or 0) + (u.cache_creation_input_tokens or 0))
        msgs.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]})
        uses = [b for b in r.content if b.type == "tool_use"]
        if not uses:
            break
        msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": b.id,
                                                  "content": result(marker, step)} for b in uses]})
    return {"windows": windows, "messages": len(msgs)}


def openai_agent(url: str, marker: str) -> dict:
    c = su.openai_client(url)
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": FIRST}]
    windows = []
    for step in range(100):
        r = c.chat.completions.create(model="gpt-4o-mini", messages=msgs, tools=CHAT_TOOLS)
        windows.append(r.usage.prompt_tokens)
        m = r.choices[0].message
        echo = {"role": "assistant", "content": m.content}
        if m.tool_calls:
            echo["tool_calls"] = [{"id": t.id, "type": "function",
                                   "function": {"name": t.function.name, "arguments": t.function.arguments}}
                                  for t in m.tool_calls]
        msgs.append(echo)
        if not m.tool_calls:
            break
        for t in m.tool_calls:
            msgs.append({"role": "tool", "tool_call_id": t.id, "content": result(marker, step)})
    return {"windows": windows, "messages": len(msgs)}


if __name__ == "__main__":
    sdk, url, marker = sys.argv[1:4]
    out = anthropic_agent(url, marker) if sdk == "anthropic" else openai_agent(url, marker)
    print(json.dumps(out))
