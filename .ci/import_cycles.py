#!/usr/bin/env python3
"""Fail if the source files of any crate import each other in a loop.

Usage: python3 .ci/import_cycles.py [CRATES_DIR]   (default: crates)
       python3 .ci/import_cycles.py --self-test   (the checker on crates with known answers)

Each file under a crate's src/ is one module (src/a/b.rs and src/a/b/mod.rs are
`a::b`; src/lib.rs and src/main.rs are the root; src/bin/*.rs are roots of their own).
A file depends on another when it names one of its items through `crate::`,
`super::` or `self::` paths, in a `use` or inline. Not counted: a parent handing a
child's names on (`pub use child::X`, the usual facade), and test code (files named
`tests.rs` or `*_tests.rs`, and `#[cfg(test)]` modules). Every set of files that
depend on each other in a loop is printed with the names that tie it, and the exit
status is 1 if there is any.

The parsing is textual (comments, strings and test modules removed first), which is
enough for the `use` forms rustfmt writes.
"""

import os
import re
import sys
from collections import defaultdict


def strip_comments_and_strings(text):
    """Source text without comments, string and char literals (replaced by spaces)."""
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
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            hashes = re.match(r'r(#*)"', text[i:]).group(1)
            end = text.find('"' + hashes, i + 2 + len(hashes))
            i = n if end < 0 else end + 1 + len(hashes)
            out.append('""')
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            out.append('""')
        elif c == "'" and re.match(r"'(\\.[^']*|[^\\'])'", text[i:i + 12]):
            i += len(re.match(r"'(\\.[^']*|[^\\'])'", text[i:i + 12]).group(0))
            out.append("' '")
        else:
            out.append(c)
            i += 1
    return "".join(out)


def strip_test_modules(text):
    """Remove `#[cfg(test)] mod name { ... }` blocks, and `#[cfg(all(test, ...))]` ones
    (text already without strings)."""
    pattern = re.compile(r"#\[cfg\((?:test|all\(test\b[^\]]*\))\)\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*([{;])")
    while True:
        m = pattern.search(text)
        if not m:
            return text
        if m.group(1) == ";":
            text = text[:m.start()] + text[m.end():]
            continue
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        text = text[:m.start()] + text[i:]


def expand_use_tree(tree):
    """`a::{b, c::{d, e}}` -> ['a::b', 'a::c::d', 'a::c::e'] (aliases and globs kept)."""
    tree = re.sub(r"\s*([{},]|::)\s*", r"\1", re.sub(r"\s+", " ", tree.strip()))
    brace = tree.find("{")
    if brace < 0:
        return [tree]
    prefix, inner = tree[:brace], tree[brace + 1:tree.rfind("}")]
    parts, depth, start = [], 0, 0
    for i, c in enumerate(inner):
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(inner[start:i])
            start = i + 1
    parts.append(inner[start:])
    paths = []
    for part in parts:
        if part:
            paths.extend(prefix + p for p in expand_use_tree(part))
    return paths


class Crate:
    def __init__(self, name, src):
        self.name = name
        self.src = src
        # module path (tuple) -> file, per crate root (lib, main and each bin).
        self.roots = {}

    def collect(self):
        files = []
        for dirpath, dirnames, filenames in os.walk(self.src):
            dirnames.sort()
            for f in sorted(filenames):
                if f.endswith(".rs") and f != "tests.rs" and not f.endswith("_tests.rs"):
                    files.append(os.path.join(dirpath, f))
        lib_modules = {}
        for path in files:
            rel = os.path.relpath(path, self.src)
            parts = rel[:-3].split(os.sep)
            if parts[0] == "bin":
                self.roots[path] = {(): path}
                continue
            if parts == ["main"] and os.path.exists(os.path.join(self.src, "lib.rs")):
                self.roots[path] = {(): path}
                continue
            if parts in (["lib"], ["main"]):
                module = ()
            elif parts[-1] == "mod":
                module = tuple(parts[:-1])
            else:
                module = tuple(parts)
            lib_modules[module] = path
        for path in lib_modules.values():
            self.roots[path] = lib_modules
        return files

    def module_of(self, path):
        modules = self.roots[path]
        for module, p in modules.items():
            if p == path:
                return module, modules
        raise KeyError(path)


def resolve(segments, modules):
    """The file of the deepest module named by a prefix of `segments`, and the rest."""
    best, rest = modules.get(()), segments
    for i in range(1, len(segments) + 1):
        if tuple(segments[:i]) in modules:
            best, rest = modules[tuple(segments[:i])], segments[i:]
    return best, rest


def absolute(path_segments, module):
    """Turn a `crate::`/`super::`/`self::` path into segments from the crate root."""
    head = path_segments[0]
    if head == "crate":
        return list(path_segments[1:])
    base = list(module)
    segs = list(path_segments)
    if head == "self":
        return base + segs[1:]
    while segs and segs[0] == "super":
        if not base:
            return None
        base = base[:-1]
        segs = segs[1:]
    return base + segs


def dependencies(path, crate):
    module, modules = crate.module_of(path)
    with open(path, encoding="utf-8") as f:
        text = strip_test_modules(strip_comments_and_strings(f.read()))
    edges = defaultdict(set)  # file -> names

    def add(segments, reexport):
        segments = [s for s in segments if s]
        if not segments or segments[0] not in ("crate", "super", "self"):
            return
        full = absolute(segments, module)
        if full is None:
            return
        target, rest = resolve(full, modules)
        if target is None or target == path:
            return
        target_module = next(m for m, p in modules.items() if p == target)
        if reexport and target_module[:len(module)] == module:
            return  # a parent handing its own descendant's names on
        # `use super::*` in a top-level file names the crate root itself.
        edges[target].add(rest[0] if rest else (full[-1] if full else "*"))

    use_pattern = re.compile(r"\b(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);")
    for m in use_pattern.finditer(text):
        for p in expand_use_tree(m.group(2)):
            segs = [s for s in p.split(" as ")[0].split("::") if s and s != "*"]
            add(segs, bool(m.group(1)))
    without_uses = use_pattern.sub(" ", text)
    for m in re.finditer(r"\b(?:crate|super|self)(?:\s*::\s*\w+)+", without_uses):
        segs = [s.strip() for s in m.group(0).split("::")]
        if segs[0] == "self" and len(segs) == 2 and not any(tuple(module) + (segs[1],) == k for k in modules):
            continue  # `self::name` of an item in this very file
        add(segs, False)
    return edges


def strongly_connected(graph):
    index, low, on_stack, stack, result = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                result.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return result


def find_cycles(crates_dir):
    """[(crate, [files], {(a, b): names})] for every cycle under `crates_dir`."""
    found = []
    for name in sorted(os.listdir(crates_dir)):
        src = os.path.join(crates_dir, name, "src")
        if not os.path.isdir(src):
            continue
        crate = Crate(name, src)
        files = crate.collect()
        graph, names = {}, {}
        for path in files:
            deps = dependencies(path, crate)
            graph[path] = set(deps)
            for target, used in deps.items():
                names[(path, target)] = used
        for component in strongly_connected(graph):
            members = set(component)
            ties = {(a, b): names[(a, b)] for a in component for b in sorted(graph[a] & members)}
            found.append((name, component, ties))
    return found


SELF_TEST = {
    # A parent re-exporting its children, children using the parent: no cycle.
    "facade/src/lib.rs": "mod a;\nmod b;\npub use a::A;\npub use b::{B, C as D};\npub struct Root;\n",
    "facade/src/a.rs": "use crate::Root;\nuse super::b::B;\npub struct A(Root, B);\n",
    "facade/src/b.rs": "pub struct B;\npub struct C;\n",
    # Siblings through a grouped use and an inline path: a cycle.
    "loop/src/lib.rs": "mod x;\nmod y;\n",
    "loop/src/x.rs": "use crate::{y::{Y, Z}};\npub struct X(Y, Z);\n",
    "loop/src/y.rs": "pub struct Y;\npub struct Z;\npub fn f() -> super::x::X { todo!() }\n",
    # Imports in comments, strings and test modules do not count.
    "quiet/src/lib.rs": "mod p;\nmod q;\n",
    "quiet/src/p.rs": "use crate::q::Q;\npub struct P(Q);\n",
    "quiet/src/q.rs": (
        "// use crate::p::P;\npub struct Q;\nconst S: &str = \"crate::p::P\";\n"
        "#[cfg(test)]\nmod tests {\n    use crate::p::P;\n    fn f() { let _ = '{'; }\n}\n"
        "#[cfg(all(test, loom))]\nmod model {\n    use super::*;\n    use crate::p::P;\n}\n"
    ),
    # A top-level file's `use super::*` names the crate root: no cycle, no crash.
    "glob/src/lib.rs": "mod g;\npub struct R;\n",
    "glob/src/g.rs": "use super::*;\npub struct G(R);\n",
    # A parent using (not re-exporting) its child, which uses it back: a cycle.
    "nested/src/lib.rs": "mod m;\n",
    "nested/src/m/mod.rs": "mod c;\npub struct M;\nfn g() { let _ = c::helper(); }\nuse self::c::C;\n",
    "nested/src/m/c.rs": "use super::M;\npub struct C(M);\npub fn helper() {}\n",
}


def self_test():
    """Check the checker on small crates with known answers."""
    import tempfile

    with tempfile.TemporaryDirectory() as root:
        for rel, text in SELF_TEST.items():
            path = os.path.join(root, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        found = {(crate, tuple(os.path.relpath(f, root) for f in files)): ties
                 for crate, files, ties in find_cycles(root)}
    expected = {
        ("loop", ("loop/src/x.rs", "loop/src/y.rs")),
        ("nested", ("nested/src/m/c.rs", "nested/src/m/mod.rs")),
    }
    if set(found) != expected:
        print(f"self-test failed: found {sorted(found)}, expected {sorted(expected)}")
        return 1
    print("self-test passed")
    return 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    crates_dir = sys.argv[1] if len(sys.argv) > 1 else "crates"
    cycles = 0
    for name, component, ties in find_cycles(crates_dir):
        cycles += 1
        print(f"import cycle in {name}: {', '.join(component)}")
        for (a, b), used in ties.items():
            print(f"  {a} -> {b}: {', '.join(sorted(used))}")
    if cycles:
        print(f"{cycles} import cycle(s) between files; break each by moving what both "
              "sides need into a module that neither imports back.")
        return 1
    print("no import cycles between files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
