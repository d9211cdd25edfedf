#!/usr/bin/env python3
"""Lists import cycles among a crate's top-level modules (issue 35: no
cycle among proxy's modules). A module's edges are the `crate::<name>`
paths its files name outside comments and `#[cfg(test)] mod tests`
blocks (tests may reach across). Prints each cycle (a strongly connected
set of two or more modules) and exits 1 when there is one.

usage: .ci/cycles.py [CRATE_SRC ...]   (default: proxy/src)
"""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
USE = re.compile(r"\bcrate::([a-z_][a-z0-9_]*)")


def strip(text):
    # Drop line comments (doc comments included) and a trailing test module.
    text = re.split(r"\n#\[cfg\(test\)\]\s*\nmod tests\b", text)[0]
    return "\n".join(line.split("//", 1)[0] for line in text.splitlines())


def graph(src):
    edges = {}
    for f in sorted(src.rglob("*.rs")):
        rel = f.relative_to(src)
        top = rel.parts[0].removesuffix(".rs")
        if top in ("lib", "main"):
            continue
        if rel.name == "tests.rs":
            continue
        deps = edges.setdefault(top, set())
        for m in USE.findall(strip(f.read_text())):
            if m != top and (src / f"{m}.rs").exists() or (src / m).is_dir():
                if m != top:
                    deps.add(m)
    return edges


def sccs(edges):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def main():
    srcs = [ROOT / a for a in sys.argv[1:]] or [ROOT / "proxy" / "src"]
    bad = 0
    for src in srcs:
        edges = graph(src)
        for comp in sccs(edges):
            bad += 1
            links = [f"{a} → {b}" for a in comp for b in sorted(edges[a]) if b in comp]
            print(f"{src.relative_to(ROOT)}: cycle {{{', '.join(comp)}}}: {'; '.join(links)}")
    print(f"{bad} cycle(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
