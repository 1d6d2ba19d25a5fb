"""Honest image identity (issue 28 item 6): an image built from a tree with uncommitted changes is tagged and
labelled ``<sha>-dirty`` (deploy/image-commit.sh, used by deploy/e2e.sh and deploy/kind-e2e.sh), the lineage
records what the image says (``KFLOOP_GIT_COMMIT``), and ``kfloop upload`` refuses such an image unless ``--image``
names it (tests/test_kfp_upload_run.py)."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def image_commit(repo: Path) -> str:
    return subprocess.run(["bash", str(DEPLOY / "image-commit.sh"), str(repo)], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "train.py").write_text("print('v1')\n")
    (repo / ".gitignore").write_text("*.log\n")
    git(repo, "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "v1")
    return repo


def test_a_clean_tree_is_its_commit(repo):
    assert image_commit(repo) == git(repo, "rev-parse", "HEAD")
    (repo / "run.log").write_text("ignored: never in the build context")
    assert image_commit(repo) == git(repo, "rev-parse", "HEAD")


@pytest.mark.parametrize("change", ["edit a tracked file", "add an untracked file"])
def test_a_changed_tree_is_dirty(repo, change):
    if change == "edit a tracked file":
        (repo / "train.py").write_text("print('v2, not committed')\n")
    else:
        (repo / "extra.py").write_text("print('in the build context, in no commit')\n")
    assert image_commit(repo) == git(repo, "rev-parse", "HEAD") + "-dirty"


def test_outside_a_checkout_the_commit_is_unknown(tmp_path):
    assert image_commit(tmp_path) == "unknown"


def test_the_image_is_tagged_and_labelled_with_that_commit():
    e2e = (DEPLOY / "e2e.sh").read_text()
    assert "COMMIT=$(deploy/image-commit.sh)" in e2e
    assert 'IMAGE=kfloop:${COMMIT:0:12}${COMMIT#"${COMMIT%-dirty}"}' in e2e
    assert '--build-arg GIT_COMMIT="$COMMIT"' in e2e
    tag = subprocess.run(["bash", "-c", 'COMMIT=$1; echo "kfloop:${COMMIT:0:12}${COMMIT#"${COMMIT%-dirty}"}"', "_",
                          "3f2a9c0d1e4b5a6978c0-dirty"], capture_output=True, text=True, check=True).stdout.strip()
    assert tag == "kfloop:3f2a9c0d1e4b-dirty"
    assert 'commit="$(deploy/image-commit.sh)"' in (DEPLOY / "kind-e2e.sh").read_text()
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    final_stage = dockerfile[dockerfile.rindex("\nFROM "):]
    assert re.search(r"^LABEL GIT_COMMIT=\$\{GIT_COMMIT\}", final_stage, re.M)
    assert "KFLOOP_GIT_COMMIT=${GIT_COMMIT}" in final_stage  # what the lineage records (data.settings)


def test_the_lineage_records_the_images_commit(monkeypatch, tmp_path):
    from data.settings import load_environment

    monkeypatch.setenv("KFLOOP_GIT_COMMIT", "3f2a9c0d1e4b5a6978c0d1e2f3a4b5c6d7e8f901-dirty")  # as the image sets it
    assert load_environment(tmp_path / "w").git_commit == "3f2a9c0d1e4b5a6978c0d1e2f3a4b5c6d7e8f901-dirty"
