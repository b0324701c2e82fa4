"""The package layout holds: imports go one way, with no circle among mars/ modules, and the decoding
algorithm neither runs a kernel nor reads a file (docs: the README's package table)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "mars"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _type_checking(node) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(test)


def _imports(path: Path) -> set[str]:
    """Every mars module this file imports, at the top or inside a function (what runs), TYPE_CHECKING aside."""
    found = set()

    def visit(node):
        for child in ast.iter_child_nodes(node):
            if _type_checking(child):
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                found.add(child.module)
                found.update(f"{child.module}.{a.name}" for a in child.names)
            visit(child)

    visit(ast.parse(path.read_text()))
    return {m for m in found if m in MODULES and m != "mars"}


GRAPH = {m: _imports(p) - {m} for m, p in MODULES.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
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

    for v in graph:
        if v not in index:
            strong(v)
    return out


def test_the_finder_sees_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_among_mars_modules():
    assert _cycles(GRAPH) == []


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_imports_go_one_way():
    """settings <- runtime <- decoding <- models, training, evaluation, app: the settings read the environment
    and import only the names they check; the runtime never imports the algorithm; the algorithm asks the
    runtime only for its backends by name (mars.runtime.backends), never for a kernel."""
    assert GRAPH["mars.settings"] <= {"mars.runtime", "mars.runtime.names"}
    assert GRAPH["mars.runtime.names"] == set()
    for m, deps in GRAPH.items():
        if _in(m, "mars.runtime"):
            assert not [d for d in deps if not _in(d, "mars.runtime") and d != "mars.settings"], m
        if _in(m, "mars.decoding"):
            outside = [d for d in deps if not _in(d, "mars.decoding")]
            assert set(outside) <= {"mars.runtime", "mars.runtime.backends"}, (m, outside)


def test_the_decoding_reads_no_file_and_runs_no_c():
    for m, path in MODULES.items():
        if not _in(m, "mars.decoding"):
            continue
        tree = ast.parse(path.read_text())
        calls = {ast.unparse(n.func).rsplit(".", 1)[-1] for n in ast.walk(tree) if isinstance(n, ast.Call)}
        assert not calls & {"open", "read_text", "read_bytes", "CDLL", "dlopen", "load_library"}, m
        names = {a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
        assert not names & {"ctypes", "cffi", "gzip", "pathlib", "subprocess"}, m
