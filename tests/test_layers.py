"""The layer rules of the package, read from the source (every import, at the top or inside a function):
domain code (training/, monitoring/, data/) knows nothing about KFP or the layers above it, components/ never
import pipelines/, and no two of our modules import each other, directly or around a cycle."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("pipelines", "components", "training", "monitoring", "data")
DOMAIN = ("training", "monitoring", "data")


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")}


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports; ``from pkg import name`` counts as ``pkg.name`` when that is a module."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in MODULES)
    return found


GRAPH = {name: imports(path) for name, path in MODULES.items()}


def test_the_scan_sees_our_modules_and_their_imports():
    assert {"training.train", "training.launch.kubernetes", "data.validation", "pipelines.cli.commands"} <= set(MODULES)
    assert "kfp" in GRAPH["components.base"] or "kfp.dsl" in GRAPH["components.base"]
    assert "training.launch.jobspec" in GRAPH["training.launch.local"]


def test_domain_code_imports_no_pipeline_layer_and_no_kfp():
    crossing = {name: sorted(m for m in deps if m.split(".")[0] in ("pipelines", "components", "kfp"))
                for name, deps in GRAPH.items() if name.split(".")[0] in DOMAIN}
    assert {name: deps for name, deps in crossing.items() if deps} == {}


def test_components_never_import_pipelines():
    crossing = {name: sorted(m for m in deps if m.split(".")[0] == "pipelines")
                for name, deps in GRAPH.items() if name.startswith("components.")}
    assert {name: deps for name, deps in crossing.items() if deps} == {}


def test_no_import_cycles_between_our_modules():
    edges = {name: {m for m in deps if m in MODULES and m != name} for name, deps in GRAPH.items()}
    cycles, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(edges[node]):
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for name in sorted(edges):
        if name not in state:
            visit(name, [name])
    assert cycles == [], cycles


BUILTIN_ERRORS = {"Exception", "RuntimeError", "ValueError", "TimeoutError", "OSError", "LookupError", "KeyError"}


def test_every_error_kfloop_raises_of_its_own_is_a_kfloop_error():
    """One base, so ``kfloop``'s main maps an error to its exit code by type (training/errors.py)."""
    bases = {}
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases[node.name] = {b.id for b in node.bases if isinstance(b, ast.Name)}
    errors = {cls for cls, of in bases.items() if of & (BUILTIN_ERRORS | {"KfloopError"}) and cls != "KfloopError"}

    def is_kfloop_error(cls: str) -> bool:
        return "KfloopError" in bases.get(cls, set()) or any(is_kfloop_error(b) for b in bases.get(cls, set()))

    assert len(errors) >= 15
    assert sorted(cls for cls in errors if not is_kfloop_error(cls)) == []
