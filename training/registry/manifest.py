"""The artifact manifest of a registered version: the sha256 of every file of its logged model directory.

Registration (:func:`training.registry.candidates.register_candidate`) records the manifest in the registry, outside
the artifact store: the JSON as the version's :data:`MANIFEST_TAG` tag and its own sha256 as the run's
``kfloop.``-prefixed :data:`MANIFEST_SHA_TAG` tag (recorded when the model was logged). A verified download
(:func:`training.registry.versions.download_verified`) checks a local copy against it with :func:`check_files`
before anything of it is imported or read. A copy holding only the non-empty files (KServe's ``/mnt/models``) is
checked against the manifest's :func:`tree_digest` with :func:`check_digest`.
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from data.errors import KfloopError
from data.fileio import file_digest

MANIFEST_TAG = "artifact_manifest"
"""Version tag holding the manifest: JSON ``{"<path relative to the model directory>": "<sha256>", ...}``."""
MANIFEST_SHA_TAG = "artifact_manifest_sha256"
"""Run tag (``kfloop.``-prefixed) holding the sha256 of the manifest's JSON, recorded when the model was logged."""
MAX_MANIFEST_CHARS = 60_000
"""Longest manifest JSON kept in a tag: MLflow validates model-version tag values to 100,000 characters
(``MAX_MODEL_REGISTRY_TAG_VALUE_LENGTH``) and stores them as TEXT, 65,535 bytes on MySQL. A kfloop model directory
(about a dozen files) needs under 2,000."""
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
"""sha256 of an empty file: entries :func:`tree_digest` leaves out (KServe's storage initializer never downloads
empty objects)."""
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
"""The form of a :func:`tree_digest`."""


class TamperedModelError(KfloopError, RuntimeError):
    """A downloaded model directory differs from its registered manifest: a file changed, is missing or was added."""


def file_manifest(root: str | Path) -> dict[str, str]:
    """The sha256 of every file under ``root``, keyed by its POSIX path relative to ``root``.

    Raises:
        TamperedModelError: a symbolic link under ``root`` (a manifest never covers where a link points).
    """
    root = Path(root)
    manifest = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            raise TamperedModelError(f"{path}: a symbolic link in a model directory; models hold plain files only")
        if path.is_file():
            manifest[path.relative_to(root).as_posix()] = file_digest(path)
    return manifest


def manifest_json(manifest: dict[str, str]) -> str:
    """The manifest's canonical JSON (sorted keys, no spaces): what the tag holds and its sha256 covers.

    Raises:
        ValueError: the JSON is longer than :data:`MAX_MANIFEST_CHARS`.
    """
    text = json.dumps(manifest, sort_keys=True, separators=(",", ":"))
    if len(text) > MAX_MANIFEST_CHARS:
        raise ValueError(f"the model directory's manifest ({len(manifest)} files) is {len(text)} characters, over "
                         f"the {MAX_MANIFEST_CHARS} a registry tag holds: keep the model directory to its own files")
    return text


def manifest_sha256(text: str) -> str:
    """sha256 of a manifest's JSON text."""
    return hashlib.sha256(text.encode()).hexdigest()


def check_files(root: str | Path, manifest: dict[str, str], *, label: str) -> None:
    """Check that ``root`` holds exactly the files of ``manifest``, each with its recorded sha256.

    Raises:
        TamperedModelError: the first file (in path order) that changed, is missing or is not in the manifest,
            named with its recorded and actual sha256 and ``label`` (the version).
    """
    actual = file_manifest(root)
    for path in sorted(manifest.keys() | actual.keys()):
        recorded, found = manifest.get(path), actual.get(path)
        if recorded == found:
            continue
        what = (f"{path} is missing (the registry recorded sha256 {recorded})" if found is None else
                f"{path} (sha256 {found}) is not in the registered manifest" if recorded is None else
                f"{path} has sha256 {found} but the registry recorded {recorded}")
        raise TamperedModelError(f"{label}: {what}; the model's artifacts were modified after registration, so "
                                 "nothing of them is loaded. Re-register the model from its run instead of loading it.")


def tree_digest(manifest: dict[str, str]) -> str:
    """``sha256:<hex>`` of the lines ``<sha256>  <path>`` of the manifest's non-empty files, sorted by path
    (``sha256sum`` of the sorted file list): the same for the registry's manifest and the storage initializer's
    ``/mnt/models`` (:func:`file_manifest` of it), which never holds empty files."""
    lines = "".join(f"{sha}  {path}\n" for path, sha in sorted(manifest.items()) if sha != EMPTY_SHA256)
    return "sha256:" + hashlib.sha256(lines.encode()).hexdigest()


def check_digest(root: str | Path, expected: str) -> None:
    """Check that the non-empty files under ``root`` have the :func:`tree_digest` ``expected``.

    Raises:
        TamperedModelError: another digest, named with ``root``, both digests and the folder's files (a digest
            cannot tell which of them changed or was added).
    """
    files = file_manifest(root)
    actual = tree_digest(files)
    if actual != expected:
        listed = ", ".join(f"{path} (sha256 {sha})" for path, sha in files.items() if sha != EMPTY_SHA256)
        raise TamperedModelError(f"{root}: its files have digest {actual} but the registered version's is {expected}; "
                                 "a file was changed, added or removed after registration, so nothing of it is "
                                 f"loaded (the folder holds: {listed or 'no non-empty file'}). Re-render the "
                                 "InferenceService with `kfloop render-serving` or re-register the model.")
