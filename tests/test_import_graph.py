"""The import graph of pipeline/: stage packages depend only on shared layers, and nothing is cyclic.

The graph is built from the source with ``ast`` (nothing is imported): one node per module under
pipeline/, one edge per ``import``/``from ... import`` of another pipeline module, wherever it sits
(top level or inside a function; not under ``if TYPE_CHECKING:``, which never runs). A stage package
(ingest, decontam, extract, pretrain, finetune, report, mini_world) may import from itself and from
the shared layers (common, training, stores, params), never from a sibling stage (but for
:data:`KNOWN_SIBLING_EDGES`); a shared layer imports no stage. pipeline/__main__.py and
pipeline/stages.py are the entry and registry above every stage and are not checked.
"""

from __future__ import annotations

import ast
from pathlib import Path

PIPELINE = Path(__file__).resolve().parents[1] / "pipeline"
SHARED_LAYERS = frozenset({"common", "training", "stores", "params"})
STAGES = frozenset({"ingest", "decontam", "extract", "pretrain", "finetune", "report", "mini_world"})


def module_name(path: Path, root: Path = PIPELINE) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve_from(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _is_type_checking(node: ast.AST) -> bool:
    """``if TYPE_CHECKING:`` (imports for annotations only: never run, so no edge)."""
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def import_graph(root: Path = PIPELINE) -> dict[str, set[str]]:
    """module -> the pipeline modules it imports. ``from pkg import mod`` names the submodule
    ``pkg.mod``; ``from pkg import f`` (f not a module) names ``pkg`` itself."""
    files = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        targets: set[str] = set()
        tree = ast.parse(path.read_text(), filename=str(path))
        type_only = {id(n) for block in ast.walk(tree) if _is_type_checking(block)
                     for stmt in block.body for n in ast.walk(stmt)}
        for node in ast.walk(tree):
            if id(node) in type_only:
                continue
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names if a.name in files)
            elif isinstance(node, ast.ImportFrom):
                base = _resolve_from(node, name, path.name == "__init__.py")
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    if sub in files:
                        targets.add(sub)
                    elif base in files:
                        targets.add(base)
        targets.discard(name)
        graph[name] = targets
    return graph


def package_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (PIPELINE / parts[1]).is_dir()) else None


# Sibling edges still in the code, each with its reason; a new one fails the test, and one that goes
# must leave this list too. report split-size sizes RefCOCO+'s test halves from the mini world's own
# rule (which shapes testA may name, and each category's shape), which lives with the world's writer.
KNOWN_SIBLING_EDGES = {
    ("pipeline.report.split_size", "pipeline.mini_world.coco"),
    ("pipeline.report.split_size", "pipeline.mini_world.refcoco"),
}


def shared_to_stage_edges(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((src, dst) for src, targets in graph.items() if package_of(src) in SHARED_LAYERS
                  for dst in targets if package_of(dst) in STAGES)


def sibling_stage_edges(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    edges = []
    for src, targets in graph.items():
        src_pkg = package_of(src)
        if src_pkg not in STAGES:
            continue
        for dst in targets:
            dst_pkg = package_of(dst)
            if dst_pkg in STAGES and dst_pkg != src_pkg:
                edges.append((src, dst))
    return sorted(edges)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_pipeline_package_is_classified():
    packages = {p.name for p in PIPELINE.iterdir() if (p / "__init__.py").exists()}
    assert packages == SHARED_LAYERS | STAGES, packages ^ (SHARED_LAYERS | STAGES)


def test_graph_sees_relative_and_function_level_imports(tmp_path):
    pkg = tmp_path / "pipeline"
    (pkg / "a").mkdir(parents=True)
    (pkg / "b").mkdir()
    for f in ("__init__.py", "a/__init__.py", "b/__init__.py", "b/y.py"):
        (pkg / f).write_text("")
    (pkg / "a" / "x.py").write_text("def f():\n    from ..b import y\n    from . import z\n")
    (pkg / "a" / "z.py").write_text("import pipeline.a.x\nif TYPE_CHECKING:\n    from pipeline.b import y\n")
    graph = import_graph(pkg)
    assert graph["pipeline.a.x"] == {"pipeline.b.y", "pipeline.a.z"}
    assert graph["pipeline.a.z"] == {"pipeline.a.x"}
    assert cycles(graph) == [["pipeline.a.x", "pipeline.a.z"]]


def test_no_stage_imports_a_sibling_stage():
    assert set(sibling_stage_edges(import_graph())) == KNOWN_SIBLING_EDGES


def test_shared_layers_import_no_stage():
    assert shared_to_stage_edges(import_graph()) == []


def test_no_import_cycles():
    assert cycles(import_graph()) == []
