#!/usr/bin/env python3
"""Counts where a provider dialect lives (issue 35 part 2): for each
`Dialect::` variant and each wire literal ("tool_use", "function_call", ...),
the production files (src/ of each crate, tests and benches excluded) that
name it, and how many `match` arms over `Dialect` exist outside window/src/dialect/.

Usage: python3 .ci/dialect_sites.py [--files] [--all] [--sites] [--rev REV]
  --files  list the files per name
  --all    count tests/benches too
  --sites  the places a new `Dialect` variant must be added by hand: each
           `match` over the window crate's `Dialect` (a line with a
           `Dialect::Anthropic ... =>` arm; every exhaustive match names it)
           and each `== / != Dialect::` or `matches!(.., Dialect::..)` test,
           outside test modules; fakeup (its own `Dialect` enum) apart
  --rev    read the files of a commit instead of the work tree
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


REV = sys.argv[sys.argv.index("--rev") + 1] if "--rev" in sys.argv else None


def read(p):
    if REV:
        return subprocess.run(["git", "show", "%s:%s" % (REV, p)], cwd=ROOT, capture_output=True,
                              text=True).stdout
    return (ROOT / p).read_text(encoding="utf-8", errors="replace")


def files(all_):
    cmd = ["git", "ls-tree", "-r", "--name-only", REV] if REV else ["git", "ls-files"]
    out = [p for p in subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                                     check=True).stdout.split() if p.endswith(".rs")]
    keep = []
    for p in out:
        if p.split("/")[0] not in CRATES:
            continue
        if not all_ and ("/src/" not in p or p.startswith("tests/") or "/tests/" in p
                         or "/benches/" in p or p.endswith("/tests.rs")):
            continue
        keep.append(p)
    return keep


ARM = re.compile(r"^\s*(?:\w+::)*Dialect::Anthropic\b[^\n]*=>", re.M)
TEST = re.compile(r"[=!]= (?:\w+::)*Dialect::|matches!\([^)]*Dialect::")


def sites():
    total, per = 0, []
    for p in files(False):
        if p.startswith("fakeup/"):
            continue
        text = read(p).split("#[cfg(test)]")[0]
        n = len(ARM.findall(text)) + len(TEST.findall(text))
        if n:
            per.append((n, p))
            total += n
    for n, p in sorted(per, reverse=True):
        print("%4d  %s" % (n, p))
    print("hand-written dialect sites: %d in %d files" % (total, len(per)))


def main():
    if "--sites" in sys.argv:
        return sites()
    all_ = "--all" in sys.argv
    show = "--files" in sys.argv
    hits = defaultdict(set)
    uses = defaultdict(int)
    for p in files(all_):
        text = read(p)
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
