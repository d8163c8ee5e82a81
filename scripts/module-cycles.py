#!/usr/bin/env python3
"""Fail when modules inside a crate depend on each other in a circle.

For every module folder of the crates named on the command line (default: agent,
gateway, sidecar), the modules directly inside it must form a directed acyclic
graph: sibling `a` depends on sibling `b` when any file under `a` names a path
under `b` (`crate::…`, `super::…`, `self::…`, in `use` trees or inline). A child
naming items of its parent module is not an edge (the parent is a layer above),
nor is a parent naming its children. Test code (`#[cfg(test)] mod …` blocks and
files of modules named `tests`) is left out: it may reach across layers.

Usage: scripts/module-cycles.py [crate-dir ...]   (exit 1 on a cycle)
       scripts/module-cycles.py --self-test       (the checker on made-up crates)
"""
import os
import re
import sys
from collections import defaultdict

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strip_comments_and_strings(text):
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and (i == 0 or not re.match(r"\w", text[i - 1])):
            m = re.match(r'r(#*)"', text[i:])
            end = '"' + m.group(1)
            j = text.find(end, i + len(m.group(0)))
            out.append('""')
            i = n if j < 0 else j + len(end)
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""')
            i = j + 1
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:i + 4]) or text.startswith("'\\", i):
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\x..|\\.|[^\\'])'", text[i:])
            if m:
                out.append("' '")
                i += len(m.group(0))
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def strip_test_blocks(text):
    """Remove `#[cfg(test)] mod name { ... }` blocks (their bodies are test code)."""
    while True:
        m = re.search(r"#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?mod\s+" + IDENT + r"\s*\{", text)
        if not m:
            return text
        depth, j = 1, m.end()
        while j < len(text) and depth:
            if text[j] == "{":
                depth += 1
            elif text[j] == "}":
                depth -= 1
            j += 1
        text = text[: m.start()] + text[j:]


def expand_use_tree(tree):
    """`a::{b, c::{d, e}}` -> ['a::b', 'a::c::d', 'a::c::e']."""
    tree = re.sub(r"\s+", "", tree)

    def split_top(s):
        parts, depth, cur = [], 0, ""
        for ch in s:
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
            else:
                cur += ch
        if cur:
            parts.append(cur)
        return parts

    def go(prefix, s):
        i = s.find("{")
        if i < 0:
            s = re.sub(r"\bas\b.*$", "", s)
            return [prefix + s]
        head, body = s[:i], s[i + 1 : s.rfind("}")]
        res = []
        for part in split_top(body):
            res.extend(go(prefix + head, part))
        return res

    return go("", tree)


def module_path(rel):
    parts = rel[:-3].split("/")
    if parts[-1] in ("lib", "main") and len(parts) == 1:
        return ()
    if parts[-1] == "mod":
        parts = parts[:-1]
    return tuple(parts)


def referenced_paths(text):
    paths = []
    for m in re.finditer(r"\buse\s+([^;]*);", text):
        for p in expand_use_tree(m.group(1)):
            paths.append(p)
    text = re.sub(r"\buse\s+[^;]*;", "", text)
    for m in re.finditer(r"\b(crate|super|self)((?:::" + IDENT + r")+)", text):
        paths.append(m.group(1) + m.group(2))
    return paths


def resolve(module, path):
    segs = [s for s in path.split("::") if s]
    if not segs:
        return None
    if segs[0] == "crate":
        base, segs = [], segs[1:]
    elif segs[0] in ("super", "self"):
        base = list(module)
        while segs and segs[0] in ("super", "self"):
            if segs[0] == "super":
                if not base:
                    return None
                base.pop()
            segs = segs[1:]
    else:
        return None  # an extern crate, a prelude name or the module's own child
    return tuple(base + segs)


def check_crate(crate_dir):
    src = os.path.join(crate_dir, "src")
    files = {}
    for root, _, names in os.walk(src):
        for name in names:
            if name.endswith(".rs"):
                full = os.path.join(root, name)
                files[module_path(os.path.relpath(full, src))] = full
    modules = set(files)
    # Every prefix of a module is a module too (folders without mod.rs use foo.rs).
    for m in list(modules):
        for k in range(len(m)):
            modules.add(m[:k])
    # Inline `mod name {` blocks outside tests are modules as well.
    edges = defaultdict(lambda: defaultdict(set))  # level -> a -> {b}
    why = {}
    for mod, full in sorted(files.items()):
        if "tests" in mod or (mod and mod[-1].endswith("_tests")):
            continue
        with open(full, encoding="utf-8") as f:
            text = strip_test_blocks(strip_comments_and_strings(f.read()))
        for inline in re.finditer(r"\bmod\s+(" + IDENT + r")\s*\{", text):
            modules.add(mod + (inline.group(1),))
        for p in referenced_paths(text):
            target = resolve(mod, p)
            if target is None:
                continue
            k = 0
            while k < len(mod) and k < len(target) and mod[k] == target[k]:
                k += 1
            if k == len(mod) or k == len(target):
                continue  # into its own subtree, or an item of an ancestor
            level, a, b = mod[:k], mod[k], target[k]
            if level + (b,) not in modules:
                continue  # an item of the common ancestor, not a sibling module
            edges[level][a].add(b)
            why.setdefault((level, a, b), (os.path.relpath(full, crate_dir), p))
    cycles = []
    for level, graph in edges.items():
        for scc in strongly_connected(graph):
            if len(scc) > 1:
                cycles.append((level, sorted(scc)))
    for level, scc in sorted(cycles):
        where = "::".join(("crate",) + level)
        print(f"{crate_dir}: modules in {where} form a cycle: {' <-> '.join(scc)}")
        members = set(scc)
        for a in scc:
            for b in sorted(edges[level][a] & members):
                f, p = why[(level, a, b)]
                print(f"    {a} -> {b}   ({f}: {p})")
    return len(cycles)


def strongly_connected(graph):
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]
    nodes = set(graph) | {b for bs in graph.values() for b in bs}

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            out.append(scc)

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def self_test():
    """The checker finds a cycle where there is one, and only there."""
    import tempfile

    def crate(files):
        root = tempfile.mkdtemp()
        for path, text in files.items():
            full = os.path.join(root, "src", path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w", encoding="utf-8") as f:
                f.write(text)
        return root

    import contextlib
    import io

    def cycles(files):
        with contextlib.redirect_stdout(io.StringIO()):
            return check_crate(crate(files))

    # Siblings naming each other, through `crate::`, `super::` and a use tree.
    assert cycles({
        "lib.rs": "pub mod a;\npub mod b;\n",
        "a.rs": "use crate::{b::{Beta, other}};\n",
        "b.rs": "fn f() { super::a::alpha(); }\n",
    }) == 1
    # Nested: the cycle is inside `engine/`.
    assert cycles({
        "lib.rs": "pub mod engine;\n",
        "engine/mod.rs": "pub mod conn;\npub mod link;\n",
        "engine/conn.rs": "use super::link::Link;\n",
        "engine/link.rs": "use crate::engine::conn::Conn;\n",
    }) == 1
    # Not cycles: a child using its parent's items, the parent using its
    # children, one-way siblings, test code, comments and strings.
    assert cycles({
        "lib.rs": "pub mod a;\npub mod b;\npub struct Shared;\nuse a::Alpha;\n",
        "a.rs": "use crate::Shared;\nuse crate::b::Beta;\n",
        "b.rs": "// crate::a::Alpha\nconst S: &str = \"crate::a::x\";\n"
        "#[cfg(test)]\nmod tests { use crate::a::Alpha; }\n",
    }) == 0
    print("module-cycles self-test: ok")
    return 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    crates = sys.argv[1:] or ["agent", "gateway", "sidecar"]
    total = sum(check_crate(os.path.join(root, c) if not os.path.isabs(c) else c) for c in crates)
    if total:
        print(f"{total} module cycle(s)")
        return 1
    print("no module cycles in " + ", ".join(crates))
    return 0


if __name__ == "__main__":
    sys.exit(main())
