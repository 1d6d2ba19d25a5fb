"""The dependency pins the issue requires, and the CI audit of the installed pins against known vulnerabilities."""
from __future__ import annotations

import re
import tomllib
from importlib.metadata import version
from pathlib import Path

from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
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


def test_ci_audits_the_installed_pins_strictly():
    assert any(r.startswith("pip-audit==") for r in _requirements()), "pip-audit is pinned in the dev extra"
    audit = re.search(r"^audit:\n((?:\t.*\n)+)", (REPO / "Makefile").read_text(), re.MULTILINE).group(1)
    assert "pip freeze" in audit and "--strict" in audit, "an unreachable advisory service must fail the audit"
    workflow = (REPO / ".github" / "workflows" / "ci.yaml").read_text()
    assert "run: make audit" in workflow, "the GitHub workflow (real PyPI advisory data) runs the audit"
