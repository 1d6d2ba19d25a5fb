"""Every environment variable the code reads is in ``data.env_vars.ENV_VARS`` (the docs' environment reference), and
every entry said to be read by kfloop is read somewhere."""
from __future__ import annotations

import ast
from pathlib import Path

from data.env_vars import ENV_VARS

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("pipelines", "components", "training", "monitoring", "data")


def _constants(tree: ast.Module) -> dict[str, object]:
    """The module-level ``NAME = <string or tuple of strings>`` constants of a module."""
    found = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            try:
                value = ast.literal_eval(stmt.value)
            except ValueError:
                continue
            if isinstance(value, str) or (isinstance(value, tuple) and all(isinstance(v, str) for v in value)):
                found[stmt.targets[0].id] = value
    return found


def _is_environ(node: ast.AST) -> bool:
    """``os.environ`` or a mapping parameter named ``environ``."""
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or \
        (isinstance(node, ast.Name) and node.id == "environ")


def _keys(node: ast.AST) -> list[ast.AST]:
    """The expressions used as variable names in a read of the environment within ``node``."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
        if node.func.attr in ("get", "setdefault", "pop") and _is_environ(node.func.value):
            return [node.args[0]]
        if node.func.attr == "getenv":
            return [node.args[0]]
    if isinstance(node, ast.Subscript) and _is_environ(node.value) and isinstance(node.ctx, ast.Load):
        return [node.slice]
    if isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) \
            and any(_is_environ(c) for c in node.comparators):
        return [node.left]
    return []


def variables_read_by_the_code() -> dict[str, str]:
    """Each variable name the packages read -> where (``path:line``): string literals and named constants in
    reads of ``os.environ``/``getenv``, and every string of a module constant named ``*_ENV``."""
    trees = {path: ast.parse(path.read_text()) for package in PACKAGES for path in (REPO / package).rglob("*.py")}
    constants = {path: _constants(tree) for path, tree in trees.items()}
    everywhere: dict[str, object] = {}
    for found in constants.values():
        everywhere.update({name: value for name, value in found.items() if name.endswith("_ENV")})
    read: dict[str, str] = {}
    for path, tree in trees.items():
        where = path.relative_to(REPO)
        for name, value in constants[path].items():
            if name.endswith("_ENV"):
                for var in (value,) if isinstance(value, str) else value:
                    read.setdefault(var, f"{where} ({name})")
        for node in ast.walk(tree):
            for key in _keys(node):
                value = key.value if isinstance(key, ast.Constant) else \
                    constants[path].get(key.id, everywhere.get(key.id)) if isinstance(key, ast.Name) else None
                for var in (value,) if isinstance(value, str) else value or ():
                    read.setdefault(var, f"{where}:{node.lineno}")
    return read


def test_every_variable_the_code_reads_is_documented():
    documented = {var.name for var in ENV_VARS}
    missing = {name: where for name, where in variables_read_by_the_code().items() if name not in documented}
    assert not missing, f"add these to data/env_vars.py's ENV_VARS (and run docs/generate.py): {missing}"


def test_every_documented_kfloop_variable_is_read():
    read = variables_read_by_the_code()
    stale = [var.name for var in ENV_VARS if var.read_by_kfloop and var.name not in read]
    assert not stale, f"ENV_VARS says kfloop reads these, the code does not: {stale}"


def test_one_entry_per_variable():
    names = [var.name for var in ENV_VARS]
    assert len(names) == len(set(names))


def test_the_scanner_finds_each_kind_of_read():
    read = variables_read_by_the_code()
    assert read["TORCHELASTIC_RESTART_COUNT"].startswith("training/train.py:")  # os.environ.get("...")
    assert read["MLFLOW_ENABLE_TELEMETRY"].startswith("data/settings.py:")  # os.environ.setdefault("...", ...)
    assert "KFP_TOKEN" in read and "KFLOOP_WEBHOOK_TOKEN" in read  # two modules' TOKEN_ENV constants
    assert "LOCAL_WORLD_SIZE" in read  # environ.get(...) on a mapping parameter
    assert read["PET_MASTER_PORT"].startswith("training/launch/jobspec.py")  # a tuple constant (OPERATOR_ENV)
