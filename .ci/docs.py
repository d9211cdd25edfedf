#!/usr/bin/env python3
"""Fails when docs/ARCHITECTURE.md names a file or folder of the tree that
does not exist (issue 35: keep ARCHITECTURE.md true to the tree).

A name is a backticked token with a slash or a source-file ending
(`sessions/sent.rs`, `store/pg/`, `server.rs`); it holds when some tracked
file's path ends with it (a folder: contains it). Braces expand
(`sessions/{budget,compress}.rs`); tokens with placeholders (<…>, *, $, ~,
…) and paths of the ledger's data dir (listed in RUNTIME) are not files
of the tree. Prints `N passed, N failed` and exits 1 on a miss.
"""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "docs" / "ARCHITECTURE.md"]
# Names of files the proxy writes at run time (the data dir), not of the tree.
RUNTIME = re.compile(
    r"^(target/|transcript/|sessions/[0-9a-z-]*\d|proxies/|admin-token|context\.txt|SESSION\.md|index\.md|"
    r"ledger\.sqlite|events|steps|rows|turns/|\d{4}\.md|.*\.jsonl$|/v1/|/_oceancode|/s/|/metrics|/health)"
)
EXT = (".rs", ".md", ".sh", ".py", ".toml", ".mjs", ".json", ".sql", ".svg", ".txt")


def expand(tok):
    m = re.search(r"\{([^{}]*)\}", tok)
    if not m:
        return [tok]
    out = []
    for alt in m.group(1).split(","):
        out += expand(tok[: m.start()] + alt.strip() + tok[m.end():])
    return out


TREE_ROOTS = ("window/src/", "ledger/src/", "proxy/src/", "invariants/src/", "fuzz/",
              "config/src/", "fakeup/src/")


def check_trees(doc, text, paths):
    """The file trees in fenced blocks: each `name.rs` or `dir/` under its
    folder (by indentation) must exist; a name on a folder's own line is
    inside that folder."""
    out = []
    for block in re.findall(r"```\n(.*?)```", text, re.S):
        stack = []  # (indent, folder path)
        for line in block.splitlines():
            m = re.match(r"^(\s*)([\w.-]+(?:/[\w.-]+)*/?)(\s|$)", line)
            if not m:
                continue
            indent, first = len(m.group(1)), m.group(2)
            if indent == 0 and first in TREE_ROOTS:
                stack = [(0, first.rstrip("/"))]
                continue
            if not stack:
                continue
            while len(stack) > 1 and stack[-1][0] >= indent:
                stack.pop()
            here = stack[-1][1]
            names = re.findall(r"(?<![\w/<.-])([\w-]+(?:/[\w-]+)*(?:\.rs|/))(?=[\s,;)]|$)", line)
            own = None
            if first.endswith("/") and first in names:
                own = here + "/" + first.rstrip("/")
                stack.append((indent, own))
            for name in names:
                bases = [here] + ([own] if own and name != first else [])
                cands = [b + "/" + name.rstrip("/") for b in bases]
                if name.endswith("/"):
                    ok = any(any(p.startswith(c + "/") for p in paths) for c in cands)
                else:
                    ok = any(c in paths for c in cands)
                if not ok:
                    out.append(f"{doc.relative_to(ROOT)}: the tree names `{cands[-1]}`, which is not in the tree")
    return out


LISTED = ("proxy/src/", "ledger/src/", "window/src/")


def check_listed(doc, text, paths):
    """Every source file of the proxy, ledger and window crates is named in
    the document (as `dir/name.rs`, `name.rs`, or `name` in a folder's
    module table), so a new module cannot go unlisted."""
    out = []
    for p in sorted(paths):
        if not p.endswith(".rs") or not p.startswith(LISTED):
            continue
        parts = p.split("/")
        base, rel = parts[-1], "/".join(parts[2:])
        if base in ("mod.rs", "lib.rs", "main.rs", "tests.rs"):
            continue
        if rel in text or re.search(r"(?<![\w/])" + re.escape(base) + r"\b", text):
            continue
        folder = "/".join(parts[:-1]) + "/"
        if folder in text and f"`{base[:-3]}`" in text:
            continue
        out.append(f"{doc.relative_to(ROOT)}: `{p}` is not named")
    return out


def main():
    files = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    files += [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and ".git" not in p.parts
              and "target" not in p.parts and "node_modules" not in p.parts and ".deps" not in p.parts]
    paths = set(files)
    passed, missing = 0, []
    for doc in DOCS:
        text = doc.read_text()
        for tok in set(re.findall(r"`([^`\s]+)`", text)):
            if re.search(r"[<>*$~…|:=()]|^\.|^-|://|\.\.\.", tok):
                continue
            if "/" not in tok and not tok.endswith(EXT):
                continue
            if RUNTIME.match(tok) or tok.startswith("/"):
                continue
            for name in expand(tok.rstrip(".,;")):
                name = name.split("#")[0]
                if not name:
                    continue
                if name.endswith("/"):
                    ok = any(("/" + p).find("/" + name) >= 0 for p in paths)
                else:
                    ok = any(p == name or p.endswith("/" + name) for p in paths) or \
                        any(("/" + p).find("/" + name + "/") >= 0 for p in paths)
                if ok:
                    passed += 1
                else:
                    missing.append(f"{doc.relative_to(ROOT)}: `{tok}` names `{name}`, which is not in the tree")
        missing += check_trees(doc, text, paths)
        missing += check_listed(doc, text, paths)
    for m in sorted(missing):
        print(m)
    print(f"docs: {passed} passed, {len(missing)} failed")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
