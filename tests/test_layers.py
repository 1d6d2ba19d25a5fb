"""The layer rules of the package, read from the source (every import, at the top or inside a function):
domain code (training/, monitoring/, data/) knows nothing about KFP or the layers above it, components/ never
import pipelines/, our packages point one way (data <- training <- monitoring <- components <- pipelines), and no
two of our modules import each other, directly or around a cycle. Imports sit at the top except in the few places
listed in LAZY_IMPORTS, each for a reason the last tests check."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("pipelines", "components", "training", "monitoring", "data")
DOMAIN = ("training", "monitoring", "data")
PACKAGE_LAYERS = ("data", "training", "monitoring", "components", "pipelines")
"""Our packages from the ground floor up: each imports only packages below it."""


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
    assert "training.steps.validate" in GRAPH["components.data"]  # imported inside the component's body only


def package_graph() -> dict[str, set[str]]:
    """Package -> the other packages of ours its modules import (inside functions too)."""
    graph: dict[str, set[str]] = {package: set() for package in PACKAGES}
    for name, deps in GRAPH.items():
        package = name.split(".")[0]
        graph[package] |= {m.split(".")[0] for m in deps} & set(PACKAGES) - {package}
    return graph


def test_packages_point_one_way():
    """``data`` imports no package of ours; ``training`` imports ``data``; ``monitoring`` imports ``data`` and
    ``training``, never the other way: monitoring watches what training made (it reads the champion and its
    recorded metrics from the registry, scores with its predictor, compares in the gate's metric units), while
    training never needs to know it is watched. What training once took from monitoring sits below both: the
    reference profile is a property of a table (data/profiles.py), time stamps are shared base (data/fileio.py),
    and the step layer picks the retrain trigger's store by the backend's type (components/run_starters.py).
    ``components`` and ``pipelines`` sit above them, in that order."""
    graph = package_graph()
    upward = {package: sorted(deps - set(PACKAGE_LAYERS[:PACKAGE_LAYERS.index(package)]))
              for package, deps in graph.items()}
    assert {package: deps for package, deps in upward.items() if deps} == {}
    assert graph["data"] == set() and graph["monitoring"] >= {"data", "training"}  # the direction is in use


def test_domain_code_imports_no_pipeline_layer_and_no_kfp():
    crossing = {name: sorted(m for m in deps if m.split(".")[0] in ("pipelines", "components", "kfp"))
                for name, deps in GRAPH.items() if name.split(".")[0] in DOMAIN}
    assert {name: deps for name, deps in crossing.items() if deps} == {}


def test_only_the_pipeline_layers_import_the_step_modules():
    """The steps (training/steps/, monitoring/steps/) sit on top of the domain code: the components call them, the
    CLI runs ``kfloop train`` through one; no domain module reaches up into them (a step may call another's code:
    promote re-decides with evaluate's)."""
    steps = {name for name in MODULES if name.startswith(("training.steps", "monitoring.steps"))}
    assert {"training.steps.train", "monitoring.steps.trigger"} <= steps
    reaching_up = {name: sorted(deps & steps) for name, deps in GRAPH.items()
                   if deps & steps and name.split(".")[0] in DOMAIN and name not in steps}
    assert reaching_up == {}


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
    """One base, so ``kfloop``'s main maps an error to its exit code by type (data/errors.py)."""
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


LAZY_IMPORTS = {
    "pipelines.cli.commands": "*",  # each handler imports its stack when it runs: `kfloop --help` stays fast
    "pipelines.cli.operate": "*",  # the same, for the operating commands (commands imports this module)
    "pipelines.cli.serving": "*",  # the same, for serve-model and render-serving (kserve, MLflow)
    "pipelines.operations.demo_loop": {"pipelines.operations.demo_serving"},  # kserve's v2 types: demo --serve only
    "pipelines.cli.options": {"pipelines.config",  # the settings check loads every typed config (the gate's sklearn)
                              "kfp_server_api.exceptions"},  # the KFP API's error type: only once a command failed
    "monitoring.drift_policy": {"evidently.legacy.calculations.stattests.registry",  # Evidently: only to check a
                                "evidently.legacy.core"},  # method a policy names
    "monitoring.steps.checks": {"monitoring.drift", "monitoring.quality",  # Evidently: the step that checks loads it
                                "data.ray_cluster", "monitoring.ray_drift"},  # Ray (the ray extra): engine: ray only
    "training.steps.register": {"data.ray_blocks", "data.ray_cluster"},  # Ray (the ray extra): engine: ray profiles
    "training.steps.promote": {"training.steps.evaluate"},
    "training.registry.versions": {"training.registry.lock"},  # the kubernetes client (the Lease): only to move an alias  # torch and the gate: only to re-decide (champion moved)
    "training.train": {"mlflow",  # only rank 0 of a run that logs pays for the import
                       "training.linear"},  # scikit-learn: only rank 0, to fit the linear baseline at the end
}
"""Modules allowed imports inside functions, and which (``*``: any). Besides these, only the bodies of KFP
components (functions decorated ``@kfloop_component`` in components/), which are shipped as source, import inside."""


def function_level_imports(path: Path) -> list[tuple[str, str, bool]]:
    """(enclosing top-level function, imported module, whether that function is a KFP component) per import inside
    a function; ``from pkg import name`` gives ``pkg.name`` when that is one of our modules."""
    found = []
    for top in ast.parse(path.read_text()).body:
        if not isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        component = any(isinstance(d, ast.Name) and d.id == "kfloop_component" for d in top.decorator_list)
        functions = [n for n in ast.walk(top) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for node in {n for f in functions for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))}:
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES else node.module
                         for a in node.names]
            found += [(top.name, name, component) for name in names]
    return found


def test_the_lazy_import_scan_sees_component_bodies_and_cli_handlers():
    lazy = {name: function_level_imports(path) for name, path in MODULES.items()}
    assert ("validate_data", "training.steps.validate", True) in lazy["components.data"]
    assert ("_MlflowLog", "mlflow", False) in lazy["training.train"]
    assert any(c for _, _, c in lazy["components.monitoring"])
    assert any(not c for _, _, c in lazy["pipelines.cli.commands"])


def test_imports_sit_at_the_top_except_where_listed():
    misplaced = {}
    for name, path in MODULES.items():
        allowed = LAZY_IMPORTS.get(name, set())
        for function, module, component in function_level_imports(path):
            if not (component and name.startswith("components.")) and allowed != "*" and module not in allowed:
                misplaced.setdefault(name, []).append(f"{function}: {module}")
    assert misplaced == {}


def loaded_after(code: str) -> set[str]:
    """The top-level packages in ``sys.modules`` after a fresh interpreter runs ``code``."""
    out = subprocess.run([sys.executable, "-c", f"{code}\nimport sys\nprint(*sorted(sys.modules))"], cwd=REPO,
                         capture_output=True, text=True, timeout=300, check=True).stdout
    return {m.split(".")[0] for m in out.split()}


@pytest.mark.parametrize("entry, code, heavy", [
    ("kfloop --help", "import pipelines.cli",
     {"torch", "mlflow", "kfp", "evidently", "sklearn", "matplotlib", "dvc", "ray"}),
    ("the trigger step's pod (components.monitoring.trigger_retraining)",
     "from components.run_starters import run_starter\nfrom monitoring.steps.trigger import trigger_step\n"
     "from training.launch.backends import step_backend",
     {"torch", "sklearn", "evidently", "matplotlib", "dvc", "ray"}),
    ("kfloop run's process, as the retrain trigger starts it", "import pipelines.cli.commands, pipelines.local.runs\n"
     "from pipelines.config import check_settings\ncheck_settings({'drift': {'drift_share': 0.3}})",
     {"torch", "evidently", "matplotlib", "ray"}),
    ("the split step's process (components.data.split_holdout)", "from training.steps.split import split_step",
     {"torch", "mlflow", "sklearn", "evidently", "kubernetes", "dvc", "ray"}),
    ("the training step's process, torchrun's ranks apart (components.training.launch_training)",
     "from training.steps.train import train_step", {"torch", "sklearn", "evidently", "matplotlib", "dvc", "ray"}),
    ("a training rank until rank 0 fits the linear baseline (torchrun -m training.train)", "import training.train",
     {"sklearn", "mlflow", "evidently", "matplotlib", "dvc", "kubernetes", "ray"}),
    ("the promote step's process (components.registry.promote)", "from training.steps.promote import promote_step",
     {"torch", "sklearn", "evidently", "matplotlib", "dvc", "ray"}),
    ("the validate step's process (components.data.validate_data)", "from training.steps.validate import validate_step",
     {"torch", "sklearn", "evidently", "matplotlib", "dvc", "kubernetes", "ray"}),
])
def test_lazy_imports_keep_their_entry_points_light(entry, code, heavy):
    assert loaded_after(code) & heavy == set(), entry


def test_the_trigger_step_imports_the_kfp_client_in_a_step_process():
    """KFP runs a step with ``_KFP_RUNTIME=true``, where ``kfp`` skips its client and kfp.client alone runs into
    kfp's own import cycle; the trigger step imports it (through run_starters) to start pinned runs."""
    code = ("import kfp.dsl.executor_main\nfrom components.run_starters import run_starter\n"
            "from components.kfp_client import Client\nprint(Client.__module__)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "_KFP_RUNTIME": "true"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["kfp.client.client"]
