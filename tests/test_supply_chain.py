"""The dependency pins the issue requires, and the CI audit of the installed pins against known vulnerabilities."""
from __future__ import annotations

import re
import tomllib
from importlib.metadata import version
from pathlib import Path

from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
LOCKS = REPO / "deploy" / "lock"
MINIMUM = {"mlflow": Version("3.12"), "torch": Version("2.10")}


def _requirements() -> list[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [*project["dependencies"], *project["optional-dependencies"]["dev"]]


def test_pins_and_installed_versions_meet_the_minimums():
    for name, minimum in MINIMUM.items():
        [spec] = [r for r in _requirements() if re.match(rf"{name}\s*[=<>~!]", r)]
        lower = Version(re.search(r"(?:==|>=)\s*([\w.]+)", spec).group(1))
        assert lower >= minimum, f"{spec}: the pin allows versions below {minimum}"
        assert Version(version(name).split("+")[0]) >= minimum


def test_ci_audits_the_locked_pins_strictly():
    assert any(r.startswith("pip-audit==") for r in _requirements()), "pip-audit is pinned in the dev extra"
    audit = re.search(r"^audit:\n((?:\t.*\n)+)", (REPO / "Makefile").read_text(), re.MULTILINE).group(1)
    assert "deploy/lock/dev.txt" in audit and "$(TORCH_LOCK)" in audit, "the audit reads what make setup installs"
    assert "--strict" in audit, "an unreachable advisory service must fail the audit"
    workflow = (REPO / ".github" / "workflows" / "ci.yaml").read_text()
    assert "run: make audit" in workflow, "the GitHub workflow (real PyPI advisory data) runs the audit"


def _locked(path: Path) -> dict[str, tuple[str, list[str]]]:
    """Name -> (version, hashes) of a lock file written by `make lock` (uv pip compile --generate-hashes)."""
    pin = r"^([A-Za-z0-9_.\-]+)==(\S+)((?:\s*\\\n\s+--hash=sha256:[0-9a-f]{64})+)"
    entries = re.findall(pin, path.read_text(), re.M)
    return {name.lower(): (pinned, re.findall(r"sha256:([0-9a-f]{64})", hashes)) for name, pinned, hashes in entries}


def test_the_locks_pin_every_dependency_with_hashes_and_agree():
    """make setup installs deploy/lock/torch-cpu.txt then dev.txt, the image deploy/lock/torch-cpu.txt then runtime.txt,
    all with --require-hashes: every requirement line pinned with ==, each with its files' sha256."""
    dev, runtime, torch = (_locked(LOCKS / name) for name in ("dev.txt", "runtime.txt", "torch-cpu.txt"))
    for path in ("dev.txt", "runtime.txt", "torch-cpu.txt"):
        lines = [line for line in (LOCKS / path).read_text().splitlines() if line and not line.startswith((" ", "#"))]
        assert len(lines) == len(_locked(LOCKS / path)), f"deploy/lock/{path} has a line that is no hashed pin"
    assert runtime.items() <= dev.items(), "the image's pins are make setup's"
    assert "torch" not in dev and "torch" not in runtime and torch["torch"][0] == "2.13.0+cpu"
    assert {"kfp", "mlflow", "pytest", "pip-audit", "ray"} <= set(dev) and "pytest" not in runtime
    for name in ("kfp", "mlflow", "numpy"):  # the lock holds pyproject.toml's exact pins
        spec = next(r for r in _requirements() if re.match(rf"{name}\s*==", r))
        assert dev[name][0] == spec.split("==")[1]
    makefile, dockerfile = (REPO / "Makefile").read_text(), (REPO / "deploy" / "Dockerfile").read_text()
    assert "--require-hashes -r deploy/lock/dev.txt" in makefile and "--require-hashes --no-deps" in makefile
    assert "--require-hashes $links -r /src/lock/runtime.txt" in dockerfile
    assert re.search(r"^UV_VERSION := \d+\.\d+\.\d+$", makefile, re.M), "make lock's uv is pinned"
