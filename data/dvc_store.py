"""Training data by md5 in DVC, so ``kfloop reproduce`` finds every version's data whatever it was read from.

DVC keeps a file as an object named by its md5 (``files/md5/ab/cdef...``) in a cache or a remote. The *data store*
is one more DVC remote, a folder or an ``s3://``, ``gs://``, ``az://`` URL (``data_store.remote``; by default the
workdir's ``dvc-store``). Registration calls :func:`keep`: when neither the repo's DVC cache, its remotes nor the
data store hold the training data's md5, the file is copied into the data store through DVC's own object database
(atomically: a temp name, then a rename or a single upload), after its size is checked against
``data_store.max_bytes`` and its bytes against the md5 the run validated. :func:`object_stores` lists where to look,
for registration and for reproduce alike.
"""
from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dvc.data_cloud import Remote
from dvc.fs import LocalFileSystem, get_cloud_fs
from dvc.repo import Repo

from data.errors import KfloopError
from data.settings import section_from_dict
from data.redaction import redact, redact_text
from data.storage import download, holds_credentials, resolve

DEFAULT_MAX_BYTES = 10 * 2**30
DEFAULT_STORE_DIR = "dvc-store"
"""The data store under the workdir when ``data_store.remote`` is empty."""


class DataStoreError(KfloopError):
    """The training data cannot be kept in the data store; the message names the file and the setting to change."""


@dataclass(kw_only=True, slots=True)
class DataStoreConfig:
    """Where registration keeps training data that DVC does not hold yet (``data_store`` in ``kfloop.yaml``)."""

    remote: str = ""
    """DVC remote URL of the data store: a folder, or ``s3://bucket/prefix`` (``gs://``, ``az://``) with
    credentials from the environment; empty: ``<workdir>/dvc-store``. In a cluster set it to object storage (a
    step's workdir does not outlive the run)."""
    max_bytes: int = DEFAULT_MAX_BYTES
    """Largest training file registration copies into the data store; a larger one that DVC does not hold fails
    the run before registration (add it to DVC yourself: ``dvc add`` and ``dvc push``)."""

    def __post_init__(self) -> None:
        if isinstance(self.max_bytes, bool) or not isinstance(self.max_bytes, int) or self.max_bytes < 1:
            raise ValueError(f"data_store.max_bytes={self.max_bytes!r}: use a positive number of bytes, e.g. "
                             f"--set data_store.max_bytes={DEFAULT_MAX_BYTES}")
        if holds_credentials(self.remote):
            raise ValueError(f"data_store.remote={redact(self.remote)}: credentials in the URL; remove "
                             "'user:secret@' and give them in the environment (AWS_ACCESS_KEY_ID, ...)")

    @classmethod
    def from_dict(cls, values: dict[str, Any] | None) -> DataStoreConfig:
        """From the ``data_store`` section.

        Raises:
            ValueError: an unknown key or an invalid value.
        """
        return section_from_dict(cls, values, "data_store")

    def url(self, workdir: Path) -> str:
        """The data store's URL: ``remote``, else the workdir's ``dvc-store`` folder."""
        return self.remote or str(Path(workdir).resolve() / DEFAULT_STORE_DIR)


@dataclass(frozen=True, kw_only=True, slots=True)
class Kept:
    """Where the training data's md5 is held after :func:`keep`."""

    md5: str
    location: str
    """The store holding it, e.g. ``DVC cache`` or ``data store /w/dvc-store``."""
    data_store: str
    """The data store's URL (credentials removed) when the data is there; empty when the repo's DVC cache or a
    remote of its own holds it."""
    copied: bool
    """Whether this call copied it into the data store."""


def data_store_odb(url: str):
    """DVC's object database of the remote at ``url`` (its ``files/md5`` layout), as ``dvc push`` writes it."""
    cls, config, fs_path = get_cloud_fs({}, url=url)
    return Remote("kfloop-data-store", fs_path, cls(**config), **config).odb


@contextlib.contextmanager
def object_stores(repo_root: Path | None, data_stores: Iterable[str]) -> Iterator[list[tuple[str, Any]]]:
    """``(label, DVC object database)`` to look in, in order: the DVC repo's cache and its remotes (when
    ``repo_root`` is a DVC repo), then each data store URL (empty ones and repeats skipped)."""
    stores: list[tuple[str, Any]] = []
    with contextlib.ExitStack() as stack:
        if repo_root is not None and (Path(repo_root) / ".dvc").is_dir():
            repo = stack.enter_context(Repo(str(repo_root)))
            stores += [("DVC cache", repo.cache.local)]
            stores += [(f"DVC remote '{name}'", repo.cloud.get_remote_odb(name)) for name in repo.config["remote"]]
        stores += [(f"data store {redact(url)}", data_store_odb(url))
                   for url in dict.fromkeys(filter(None, data_stores))]
        yield stores


def locate(md5: str, stores: list[tuple[str, Any]]) -> tuple[str, Any] | None:
    """The first ``(label, odb)`` of ``stores`` holding ``md5``; ``None`` when none does."""
    return next(((label, odb) for label, odb in stores if odb.fs.exists(odb.oid_to_path(md5))), None)


def keep(source_uri: str, md5: str, *, config: DataStoreConfig, workdir: Path, repo_root: Path | None) -> Kept:
    """Make sure DVC holds the training data ``md5`` read from ``source_uri`` (a path or an object URI): when no
    store of :func:`object_stores` has it, copy the file into the data store.

    Raises:
        DataStoreError: the file is over ``config.max_bytes``, its bytes no longer hash to ``md5`` (it changed
            since the run validated it), or the data store cannot be written.
        data.storage.StorageError: the file cannot be read.
    """
    url = config.url(workdir)
    with object_stores(repo_root, [url]) as stores:
        label, store = stores[-1]
        found = locate(md5, stores)
        if found is not None:
            return Kept(md5=md5, location=found[0], data_store=redact(url) if found[1] is store else "", copied=False)
        source = resolve(source_uri)
        size = source.size
        if size > config.max_bytes:
            raise DataStoreError(
                f"{source.uri}: {size} bytes, over data_store.max_bytes={config.max_bytes}: no DVC cache or "
                f"remote holds this training data (md5 {md5}), and registration copies at most that much into the "
                f"{label} so the version can be reproduced; raise it (--set data_store.max_bytes={size}) or add the "
                "file to DVC yourself (`dvc add`, `dvc push`) before training")
        with tempfile.TemporaryDirectory(prefix="kfloop-keep-") as tmp:
            copy = download(source, Path(tmp) / "data", max_bytes=config.max_bytes)
            if copy.md5 != md5:
                raise DataStoreError(f"{source.uri}: its bytes now hash to md5 {copy.md5}, not the {md5} this "
                                     "run validated and trained on: the data changed during the run; run the "
                                     "pipeline again on data that stays put")
            try:
                store.add(str(Path(tmp) / "data"), LocalFileSystem(), md5)
            except Exception as exc:  # each file system raises its own types
                raise DataStoreError(f"{label}: cannot write the training data (md5 {md5}) there: "
                                     f"{type(exc).__name__}: {redact_text(str(exc))}; check data_store.remote and "
                                     "the credentials in the environment") from None  # its text may hold them
        assert locate(md5, [(label, store)]) is not None, f"{label} does not show md5 {md5} after adding it"
        return Kept(md5=md5, location=label, data_store=redact(url), copied=True)
