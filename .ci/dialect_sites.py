#!/usr/bin/env python3
"""Counts where a provider dialect lives (issue 35 part 2): for each
`Dialect::` variant and each wire literal ("tool_use", "function_call", ...),
the production files (src/ of each crate, tests and benches excluded) that
name it, and how many `match` arms over `Dialect` exist outside window/src/dialect/.

Usage: python3 .ci/dialect_sites.py [--files] [--all]
  --files  list the files per name
  --all    count tests/benches too
"""
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CRATES = ("window", "ledger", "proxy", "fakeup", "config", "invariants", "bench", "tests")
VARIANTS = ("Anthropic", "OpenaiChat", "OpenaiResponses", "Gemini")
LITERALS = ("tool_use", "tool_result", "tool_use_id", "function_call", "function_call_output",
            "functionCall", "functionResponse", "tool_calls", "tool_call_id", "call_id",
            "is_error", "prompt is too long", "context_length_exceeded",
            "input_tokens", "prompt_tokens", "promptTokenCount", "usageMetadata")


def files(all_):
    out = subprocess.run(["git", "ls-files", "*.rs"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.split()
    keep = []
    for p in out:
        if p.split("/")[0] not in CRATES:
            continue
        if not all_ and ("/src/" not in p or p.startswith("tests/") or "/tests/" in p
                         or "/benches/" in p or p.endswith("/tests.rs")):
            continue
        keep.append(p)
    return keep


def main():
    all_ = "--all" in sys.argv
    show = "--files" in sys.argv
    hits = defaultdict(set)
    uses = defaultdict(int)
    for p in files(all_):
        text = (ROOT / p).read_text(encoding="utf-8", errors="replace")
        crate = p.split("/")[0]
        for v in VARIANTS:
            n = len(re.findall(r"\bDialect::%s\b" % v, text))
            if n:
                hits["Dialect::" + v].add(p)
                uses["Dialect::" + v] += n
        for lit in LITERALS:
            n = text.count('"%s"' % lit)
            if n:
                hits['"%s"' % lit].add(p)
                uses['"%s"' % lit] += n
        hits["crate:" + crate]
    print("%-28s %6s %6s  %s" % ("name", "files", "uses", "crates"))
    for name in ["Dialect::" + v for v in VARIANTS] + ['"%s"' % l for l in LITERALS]:
        fs = sorted(hits.get(name, ()))
        crates = sorted({f.split("/")[0] for f in fs})
        print("%-28s %6d %6d  %s" % (name, len(fs), uses[name], ",".join(crates)))
        if show:
            for f in fs:
                print("    " + f)
    union = set()
    for v in VARIANTS:
        union |= hits.get("Dialect::" + v, set())
    print("files naming any Dialect:: variant: %d" % len(union))
    if show:
        for f in sorted(union):
            print("    " + f)


if __name__ == "__main__":
    main()
