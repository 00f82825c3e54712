#!/usr/bin/env python3
"""Checks that each crate's modules import one way (scripts/test.sh runs it).

Each crate has its layers, bottom to top: module names (a folder or a file
under its src/). A module may use the modules of the layers below it and,
among the leaves, any other leaf that does not use it back. Inside a folder
the files import one way too: no two files import each other, however
indirectly; in kvtier-server no command family (a file with `pub const
COMMANDS`) imports another. A crate's root (lib.rs) only declares modules
and re-exports: a module that imports an item of the root (`crate::Item`
where Item is no module) imports upwards. docs/architecture.md explains
kvtier-server's layers.

What counts as an import: a `crate::name` path, a `super::name` path (a
sibling file, or the folder's mod.rs), and in a mod.rs a path through one
of its own child modules, in code and tests alike (comments and string
literals do not count). Exits 1 with each offending import (file, line, the
path) and any import circle.

    scripts/check-layers.py                # every crate below
    scripts/check-layers.py server/src     # one crate
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

#: kvtier-server's layers, bottom to top. A module of a layer may use those
#: of the layers below.
LAYERS: list[tuple[str, list[str]]] = [
    ("leaves", ["about", "glob", "clients", "stats", "acl", "tls", "logging"]),
    ("config", ["config"]),
    ("shared", ["shared"]),
    ("shard", ["shard"]),
    ("report", ["report"]),
    ("commands", ["commands"]),
    ("coordination", ["coordination"]),
    ("admission", ["admission"]),
    ("net", ["net"]),
    ("server", ["server"]),
]
#: Every crate with more than one module, by its source folder: its name
#: and its layers, bottom to top (kvtier-timer is one file).
CRATES: dict[str, tuple[str, list[tuple[str, list[str]]]]] = {
    "store/src": (
        "kvtier-store",
        [
            (
                "leaves",
                ["clock", "errors", "latency", "slot", "slab", "spill", "entry", "tenants", "holds", "stats"],
            ),
            ("parts", ["links", "meta", "policy", "disk_index", "waiters"]),
            ("store", ["store"]),
        ],
    ),
    "protocol/src": (
        "kvtier-protocol",
        [
            ("leaves", ["integer", "inline", "stream"]),
            ("reply", ["reply"]),
            ("parsers", ["request", "reply_parser"]),
        ],
    ),
    "cluster/src": (
        "kvtier-cluster",
        [
            ("topology", ["topology"]),
            ("peer", ["peer"]),
            ("hot", ["hot"]),
            ("membership", ["membership"]),
            ("exchange", ["copies", "gossip"]),
        ],
    ),
    "server/src": ("kvtier-server", LAYERS),
}
#: The crate root (declarations) and the binary (the top) are not layered.
UNLAYERED = {"lib.rs", "main.rs"}


def strip_code(text: str) -> list[str]:
    """The source's lines with comments and string/char literals blanked
    (line numbers kept)."""
    out: list[str] = []
    i, n = 0, len(text)
    buf: list[str] = []
    depth = 0  # block comment nesting
    while i < n:
        c = text[i]
        if depth:
            if text.startswith("*/", i):
                depth -= 1
                i += 2
            elif text.startswith("/*", i):
                depth += 1
                i += 2
            else:
                buf.append("\n" if c == "\n" else " ")
                i += 1
            continue
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if text.startswith("/*", i):
            depth = 1
            i += 2
            continue
        m = re.match(r'b?r(#*)"', text[i:])
        if m:
            end = text.find('"' + m.group(1), i + len(m.group(0)))
            end = n if end < 0 else end + 1 + len(m.group(1))
            buf.append("".join("\n" if ch == "\n" else " " for ch in text[i:end]))
            i = end
            continue
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            buf.append("".join("\n" if ch == "\n" else " " for ch in text[i : j + 1]))
            i = j + 1
            continue
        m = re.match(r"'(\\.|[^\\'])'", text[i:])
        if m:
            buf.append(" " * len(m.group(0)))
            i += len(m.group(0))
            continue
        buf.append(c)
        i += 1
    out = "".join(buf).split("\n")
    return out


def group_heads(body: str) -> list[str]:
    """The first name of each path in a `{a, b::c, d as e}` group."""
    heads, depth, cur = [], 0, ""
    for ch in body:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            heads.append(cur)
            cur = ""
        elif depth == 0:
            cur += ch
    heads.append(cur)
    names = []
    for h in heads:
        m = re.match(r"\s*(\w+)", h)
        if m:
            names.append(m.group(1))
    return names


def main() -> int:
    if len(sys.argv) > 1:
        name, layers = CRATES[sys.argv[1].rstrip("/")]
        return check(Path(sys.argv[1]), name, layers)
    return max(check(Path(src), name, layers) for src, (name, layers) in CRATES.items())


def check(src: Path, crate: str, layers: list[tuple[str, list[str]]]) -> int:
    """Checks one crate; prints what is wrong, or a line saying it holds."""
    LAYERS = layers  # noqa: N806 (the name the messages below use)
    layer_of = {m: i for i, (_, mods) in enumerate(LAYERS) for m in mods}
    modules = {p.stem for p in src.glob("*.rs")} | {p.name for p in src.iterdir() if p.is_dir()}
    files = sorted(p for p in src.rglob("*.rs") if str(p.relative_to(src)) not in UNLAYERED)
    if not files:
        print("no Rust files under %s" % src)
        return 1
    problems: list[str] = []
    module_edges: dict[str, set[str]] = {}
    file_edges: dict[Path, set[Path]] = {}

    for f in files:
        rel = f.relative_to(src)
        module = rel.parts[0].removesuffix(".rs")
        if module not in layer_of:
            problems.append("%s: module %r is in no layer (add it to LAYERS and docs/architecture.md)" % (rel, module))
            continue
        folder = f.parent
        siblings = {p.stem for p in folder.glob("*.rs")} | {p.name for p in folder.iterdir() if p.is_dir()}
        is_mod = f.name == "mod.rs"
        children = {p.stem for p in folder.glob("*.rs") if p.name != "mod.rs"} if is_mod else set()
        children |= {p.name for p in folder.iterdir() if p.is_dir()} if is_mod else set()
        lines = strip_code(f.read_text())
        joined = "\n".join(lines)

        def file_target(name: str) -> Path | None:
            """The file of this folder a `super::name`/child path leads to."""
            if (folder / (name + ".rs")).exists():
                return folder / (name + ".rs")
            if (folder / name / "mod.rs").exists():
                return folder / name / "mod.rs"
            return None

        def add_file_edge(target: Path | None, line: int, path: str) -> None:
            if target is not None and target != f:
                file_edges.setdefault(f, set()).add(target)

        for m in re.finditer(r"\bcrate::(\{|\w+)((?:::\w+)?)", joined):
            line = joined.count("\n", 0, m.start()) + 1
            if m.group(1) == "{":
                depth, j = 1, m.end()
                while j < len(joined) and depth:
                    depth += {"{": 1, "}": -1}.get(joined[j], 0)
                    j += 1
                heads = group_heads(joined[m.end() : j - 1])
            else:
                heads = [m.group(1)]
            for head in heads:
                if head not in modules and head != "self":
                    problems.append(
                        "%s:%d: crate::%s is an item of the crate root (lib.rs only declares "
                        "modules and re-exports: import it from its module)" % (rel, line, head)
                    )
            target = m.group(1)
            if target not in layer_of:
                continue
            if target == module:
                # Within the folder: a file edge.
                rest = m.group(2).lstrip(":")
                if src.joinpath(module).is_dir():
                    t = src / module / (rest + ".rs")
                    add_file_edge(t if t.exists() else src / module / "mod.rs", line, m.group(0))
                continue
            module_edges.setdefault(module, set()).add(target)
            if layer_of[target] > layer_of[module]:
                problems.append(
                    "%s:%d: %s (layer %s) imports %s (layer %s, above it)"
                    % (rel, line, module, LAYERS[layer_of[module]][0], m.group(0), LAYERS[layer_of[target]][0])
                )
        if not is_mod and folder != src:
            for m in re.finditer(r"\bsuper::(\{|\w+)", joined):
                line = joined.count("\n", 0, m.start()) + 1
                if m.group(1) == "{":
                    close, depth, j = None, 1, m.end()
                    while j < len(joined) and depth:
                        depth += {"{": 1, "}": -1}.get(joined[j], 0)
                        j += 1
                    close = j - 1
                    names = group_heads(joined[m.end() : close])
                else:
                    names = [m.group(1)]
                for name in names:
                    target = file_target(name) if name in siblings else folder / "mod.rs"
                    add_file_edge(target, line, "super::" + name)
        if is_mod:
            for name in children:
                for m in re.finditer(r"(?<![:\w])(?:self::)?%s::" % re.escape(name), joined):
                    line = joined.count("\n", 0, m.start()) + 1
                    add_file_edge(file_target(name), line, m.group(0))

    # A command family (a file with `pub const COMMANDS`) never imports
    # another: what two families share lives below them.
    family = {f for f in files if re.search(r"^pub const COMMANDS\b", f.read_text(), re.M)}
    for f in sorted(family):
        for t in sorted(file_edges.get(f, ())):
            if t in family:
                problems.append(
                    "%s imports %s: a command family never imports another"
                    % (f.relative_to(src), t.relative_to(src))
                )
    problems += circles({k: v for k, v in module_edges.items()}, "module")
    problems += circles(
        {str(k.relative_to(src)): {str(t.relative_to(src)) for t in v} for k, v in file_edges.items()}, "file"
    )
    if problems:
        print("%s's layers are broken:" % crate)
        for p in problems:
            print("  " + p)
        return 1
    edges = sum(len(v) for v in file_edges.values())
    print(
        "%s: %d files in %d layers, imports one way (%d module edges, %d file edges inside folders)"
        % (crate, len(files), len(LAYERS), sum(len(v) for v in module_edges.values()), edges)
    )
    return 0


def circles(graph: dict[str, set[str]], kind: str) -> list[str]:
    """Each import circle of `graph`, as one line."""
    found: list[str] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt) :] + [nxt]
                found.append("%s circle: %s" % (kind, " -> ".join(cycle)))
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


if __name__ == "__main__":
    sys.exit(main())
