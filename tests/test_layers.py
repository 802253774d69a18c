"""The import-layers contract: convlab's modules import one way, and no circle.

Every module of the package is parsed (not imported) with `ast`, function-local imports
included, and its imports of other convlab modules become the edges of a graph. Two rules:

- each module sits in one layer of `LAYERS`; an edge may go to the same layer or a lower
  one, never to a higher one (a "back edge");
- the graph has no cycle, within a layer either.

A new module must be added to `LAYERS`: a module the table does not know fails the test.
The last tests plant a back edge and a cycle in a copy of the package and check that the
contract catches both.
"""

from __future__ import annotations

import ast
import fnmatch
import functools
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "convlab"

# Lowest first. A module may import its own layer and the layers above it in this list.
LAYERS = [
    ("leaf: no convlab imports below them",
     ["convlab", "convlab.runtime", "convlab.errors", "convlab.formats", "convlab.results",
      "convlab.images", "convlab.barrier"]),
    ("references, checkers, the tracer",
     ["convlab.reference", "convlab.problems", "convlab.fft_conv", "convlab.winograd",
      "convlab.trace", "convlab.trace.*", "convlab.check", "convlab.check.*"]),
    ("kernels", ["convlab.kernels", "convlab.kernels.*"]),
    ("pictures", ["convlab.viz"]),
    ("timing, baselines, measurements and the lessons' drivers",
     ["convlab.bench", "convlab.baselines", "convlab.measure",
      "convlab.measure.*", "convlab.autotune", "convlab.cpu", "convlab.census", "convlab.precision",
      "convlab.pipeline", "convlab.ladder", "convlab.widgets"]),
    ("grading, publishing and the command line",
     ["convlab.grading", "convlab.grading.*", "convlab.publish", "convlab.__main__"]),
]


def modules(root: Path) -> dict:
    """Dotted module name -> source file, for every .py file of the package at `root`."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


@functools.cache
def _import_statements(text: str) -> tuple:
    """The import statements of a source text, function-local ones included. Parsed once per
    text: the planted copies of the package share the parse of every file they leave alone."""
    return tuple(n for n in ast.walk(ast.parse(text)) if isinstance(n, (ast.Import,
                                                                        ast.ImportFrom)))


def imports(name: str, path: Path, known: set) -> set:
    """The convlab modules that module `name` (file `path`) imports, anywhere in its code."""
    is_pkg = path.name == "__init__.py"
    package = name if is_pkg else name.rpartition(".")[0]
    found = set()
    text = path.read_text()
    try:
        statements = _import_statements(text)
    except SyntaxError:
        ast.parse(text, str(path))  # raise again, naming the file
        raise
    for node in statements:
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            # `from pkg import sub` imports the submodule pkg.sub when there is one
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod
                       for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:  # `import convlab.check.core as c`: longest known
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def graph(root: Path) -> dict:
    mods = modules(root)
    known = set(mods)
    return {name: imports(name, path, known) for name, path in mods.items()}


def layer_of(name: str, layers=LAYERS) -> int | None:
    for i, (_, patterns) in enumerate(layers):
        if any(fnmatch.fnmatchcase(name, p) for p in patterns):
            return i
    return None


def back_edges(g: dict, layers=LAYERS) -> list:
    """(importer, imported) pairs where a lower layer imports a higher one."""
    lay = {m: layer_of(m, layers) for m in set(g).union(*g.values())}
    return sorted((a, b) for a, deps in g.items() for b in deps
                  if lay[a] is not None and lay[b] is not None and lay[b] > lay[a])


def cycles(g: dict) -> list:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
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

    for v in sorted(g):
        if v not in index:
            visit(v)
    return sorted(out)


# ----------------------------------------------------------------------------------------
# The contract on the tree


def test_every_module_is_in_one_layer():
    g = graph(ROOT)
    assert len(g) > 40  # the parse found the package
    missing = sorted(m for m in g if layer_of(m) is None)
    assert not missing, f"add these modules to LAYERS in tests/test_layers.py: {missing}"
    double = [m for m in g if sum(any(fnmatch.fnmatchcase(m, p) for p in pats)
                                  for _, pats in LAYERS) > 1]
    assert not double, f"modules in more than one layer: {double}"


def test_no_module_imports_a_higher_layer():
    bad = back_edges(graph(ROOT))
    assert not bad, "back edges (lower layer imports higher):\n" + "\n".join(
        f"  {a} ({LAYERS[layer_of(a)][0]}) -> {b} ({LAYERS[layer_of(b)][0]})" for a, b in bad)


def test_no_import_cycle():
    found = cycles(graph(ROOT))
    assert not found, f"import cycles: {found}"


def test_leaf_modules_import_nothing_from_convlab():
    g = graph(ROOT)
    for leaf in ("convlab.errors", "convlab.formats", "convlab.results"):
        assert g[leaf] == set(), (leaf, g[leaf])


def test_cpu_lesson_does_not_import_kernels():
    # what `import convlab.cpu` really loads (a fresh interpreter, the simulator)
    code = ("import convlab, sys; convlab.setup('sim'); import convlab.cpu; "
            "print(sorted(m for m in sys.modules if m.startswith('convlab.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    loaded = ast.literal_eval(out.strip().splitlines()[-1])
    assert "convlab.cpu" in loaded and "convlab.errors" in loaded
    assert not [m for m in loaded if m.startswith(("convlab.kernels", "convlab.bench"))], loaded


def test_the_parse_sees_function_local_and_relative_imports():
    g = graph(ROOT)
    # convlab.check imports the tracer inside functions only
    assert "convlab.trace" in set().union(*(g[m] for m in g if m.startswith("convlab.check")))
    assert "convlab.results" in g["convlab.kernels.conv09_implicit_gemm_cuda"]  # in choose()


# ----------------------------------------------------------------------------------------
# The contract catches what it is for


@pytest.fixture()
def package_copy(tmp_path):
    dst = tmp_path / "convlab"
    shutil.copytree(ROOT, dst, ignore=shutil.ignore_patterns("__pycache__", "results", "*.png",
                                                             "*.json", "*.cu"))
    return dst


def _plant(path: Path, code: str):
    path.write_text(path.read_text() + "\n\ndef _planted():\n    " + code + "\n")


def test_contract_fails_on_a_planted_back_edge(package_copy):
    before = back_edges(graph(package_copy))  # the tree's own (none, when the tree is clean)
    _plant(package_copy / "formats.py", "from . import bench  # noqa")  # leaf -> timing
    new = [e for e in back_edges(graph(package_copy)) if e not in before]
    assert new == [("convlab.formats", "convlab.bench")]


def test_contract_fails_on_a_planted_cycle(package_copy):
    before = cycles(graph(package_copy))
    edges = back_edges(graph(package_copy))
    _plant(package_copy / "reference.py", "import convlab.problems")  # problems -> reference
    new = [c for c in cycles(graph(package_copy)) if c not in before]
    assert new == [["convlab.problems", "convlab.reference"]]
    assert back_edges(graph(package_copy)) == edges  # same layer: only the cycle rule sees it


def test_a_stricter_layer_table_names_the_edges_it_forbids():
    # the tracer one layer above the checkers: the checkers' trace imports become back edges
    layers = [(n, [p for p in pats if not p.startswith("convlab.trace")]) for n, pats in LAYERS]
    layers.insert(2, ("tracer", ["convlab.trace", "convlab.trace.*"]))
    bad = {e for e in back_edges(graph(ROOT), layers) if e not in back_edges(graph(ROOT))}
    assert bad == {("convlab.check.core", "convlab.trace"),
                   ("convlab.check.traced", "convlab.trace"),
                   ("convlab.check.stages", "convlab.trace"),
                   ("convlab.check.stages", "convlab.trace._engine")}
