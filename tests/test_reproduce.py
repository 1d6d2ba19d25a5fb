"""The parts of ``kfloop reproduce`` that refuse: code that is not the recorded commit, data DVC does not hold.
(The full rebuild of a demo version is in test_operate.py.)"""
from __future__ import annotations

import hashlib

import pytest

from training.reproduce import ReproduceError, check_code, fetch_by_md5

SHA = "a" * 40


def test_code_must_be_the_recorded_commit_and_clean():
    check_code(SHA, SHA)
    with pytest.raises(ReproduceError, match=f"trained by commit {SHA}, but the running code is another commit "
                                             f"\\({'b' * 40}\\).*git worktree add ../kfloop-aaaaaaaaaaaa {SHA}"):
        check_code(SHA, "b" * 40)
    with pytest.raises(ReproduceError, match="the working tree has uncommitted changes to tracked files"):
        check_code(SHA, f"{SHA}-dirty")
    for recorded in (f"{SHA}-dirty", "unknown", ""):
        with pytest.raises(ReproduceError, match="which no commit holds: it cannot be reproduced exactly"):
            check_code(recorded, recorded)


@pytest.fixture
def dvc_repo(tmp_path, monkeypatch):
    """An empty DVC repo (no git) whose only remote is the local folder ``remote``."""
    from dvc.repo import Repo

    monkeypatch.setenv("DVC_NO_ANALYTICS", "1")
    root = tmp_path / "repo"
    root.mkdir()
    with Repo.init(str(root), no_scm=True) as repo, repo.config.edit("local") as conf:
        conf["remote"]["store"] = {"url": str(tmp_path / "remote")}
    return root, tmp_path / "remote"


def _put(remote, data: bytes, md5: str | None = None) -> str:
    md5 = md5 or hashlib.md5(data).hexdigest()
    path = remote / "files" / "md5" / md5[:2] / md5[2:]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return md5


def test_data_is_fetched_from_a_remote_by_md5(dvc_repo, tmp_path):
    root, remote = dvc_repo
    md5 = _put(remote, b"age,label\n1,yes\n")
    path, source = fetch_by_md5(md5, tmp_path / "out" / "data.csv", repo_root=root)
    assert path.read_bytes() == b"age,label\n1,yes\n" and source.startswith("DVC remote 'store'")


def test_missing_or_corrupt_data_is_refused(dvc_repo, tmp_path):
    root, remote = dvc_repo
    with pytest.raises(ReproduceError, match=f"data md5 {'0' * 32} is in none of: DVC cache .*; DVC remote 'store'"):
        fetch_by_md5("0" * 32, tmp_path / "data.csv", repo_root=root)
    liar = _put(remote, b"tampered", md5="1" * 32)
    with pytest.raises(ReproduceError, match=f"holds md5 {hashlib.md5(b'tampered').hexdigest()} under {liar}"):
        fetch_by_md5(liar, tmp_path / "data.csv", repo_root=root)
    assert not (tmp_path / "data.csv").exists()
