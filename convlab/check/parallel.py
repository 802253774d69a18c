"""Numba CPU parallel loops read from their source: a write that every iteration of a
``prange`` loop shares is a race (lesson 03).

A race between prange iterations shows up in the numbers only now and then (threads must
collide in time), so the checkers also read the code: inside ``for v in prange(...)``,
an element store whose index does not depend on ``v`` is written by every iteration at
once. Arrays the loop body creates itself are private to an iteration; a scalar ``+=``
is a reduction Numba supports. Names computed from ``v`` (and loops over ranges computed
from it) count as depending on it.
"""

from __future__ import annotations

import ast
import textwrap


def _names(node) -> set:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _root(node):
    while isinstance(node, (ast.Subscript, ast.Attribute)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _targets(node) -> list:
    if isinstance(node, ast.Assign):
        return list(node.targets)
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        return [node.target]
    return []


def _flat(t) -> list:
    return [x for e in t.elts for x in _flat(e)] if isinstance(t, (ast.Tuple, ast.List)) else [t]


def races_in_source(source: str) -> list[str]:
    """Each store inside a prange loop whose index does not depend on the loop's variable,
    as "line N: <store> inside `for v in prange(...)`"."""
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        return []
    lines = textwrap.dedent(source).splitlines()
    found = []
    for loop in ast.walk(tree):
        if not (isinstance(loop, ast.For) and isinstance(loop.iter, ast.Call)
                and ast.unparse(loop.iter.func).split(".")[-1] == "prange"
                and isinstance(loop.target, ast.Name)):
            continue
        var = loop.target.id
        body = [n for stmt in loop.body for n in ast.walk(stmt)]
        private = set()  # names the body binds: an iteration's own
        for n in body:
            for t in _targets(n):
                private |= {x.id for x in _flat(t) if isinstance(x, ast.Name)}
            if isinstance(n, ast.For):
                private |= {x.id for x in _flat(n.target) if isinstance(x, ast.Name)}
        tainted, grew = {var}, True  # names whose value depends on the loop variable
        while grew:
            grew = False
            for n in body:
                pairs = [(t, n.value) for t in _targets(n)] if hasattr(n, "value") else []
                if isinstance(n, ast.For):
                    pairs.append((n.target, n.iter))
                for t, value in pairs:
                    if value is not None and _names(value) & tainted:
                        new = {x.id for x in _flat(t) if isinstance(x, ast.Name)} - tainted
                        if new:
                            tainted |= new
                            grew = True
        for n in body:
            for t in _targets(n):
                for x in _flat(t):
                    if not isinstance(x, ast.Subscript):
                        continue
                    root = _root(x)
                    if root is None or root in private:
                        continue
                    if not _names(x.slice) & tainted:
                        text = lines[n.lineno - 1].strip() if n.lineno <= len(lines) else ""
                        found.append(f"line {n.lineno}: `{text}` inside `for {var} in "
                                     "prange(...)`")
    return found


def prange_races(fn) -> list[str]:
    """`races_in_source` of `fn` and of the functions it calls (`source.sources`)."""
    from .source import sources

    return [r for text in sources(fn).values() for r in races_in_source(text)]


__all__ = ["prange_races", "races_in_source"]
