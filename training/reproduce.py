"""Rebuild a registered version from its lineage and prove it is the same model.

The version's recorded data md5 is fetched from DVC (the repo's cache, else its remotes, else the data store that
registration kept it in: :mod:`data.dvc_store`), split with the pipeline's holdout settings (checked against the
recorded holdout sha256), and trained again on CPU with gloo with the recorded training config and seed, by the
code of the recorded commit (the running checkout must be that commit) and the model module logged with the
version (its sha256 checked against the registry's).
Identical means: every recorded metric and the decision threshold equal, and the weights file byte for byte
(sha256) and tensor by tensor.
"""
from __future__ import annotations

import math
import shutil
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import mlflow
from safetensors.torch import load_file

from data.dvc_store import locate, object_stores
from data.errors import KfloopError
from data.fileio import file_digest
from data.holdout import DEFAULT_HOLDOUT_FRACTION, DEFAULT_SPLIT_SEED, split_holdout, write_parquet
from data.tables import read_table
from training.config import TrainingSection
from training.gate import compute_metrics
from training.launch.local import train_local
from training.model import Predictor
from training.model_files import MODULE_FILE, WEIGHTS_FILE
from training.progress import progress
from training.registry.versions import (LINEAGE_ARTIFACT, SCHEMA_ARTIFACT, VersionRecord, download_model_dir,
                                       model_version)


class ReproduceError(KfloopError, RuntimeError):
    """The version cannot be reproduced here; the message says why and what to do."""


@dataclass(kw_only=True, slots=True)
class Reproduction:
    """What :func:`reproduce` rebuilt and how it compares with the registered version."""

    model_name: str
    version: str
    data_md5: str
    data_source: str
    """Where the data came from: the DVC cache or a remote's path."""
    git_commit: str
    seed: int
    world_size: int
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per metric: ``recorded`` and ``reproduced``."""
    weights_sha256: dict[str, str] = field(default_factory=dict)
    """``recorded`` and ``reproduced``."""
    differing_tensors: list[str] = field(default_factory=list)
    """Tensor names whose values differ (empty when identical)."""
    model_dir: str = ""
    """The rebuilt model directory."""

    @property
    def identical(self) -> bool:
        """Same weights (bytes and tensors) and every metric equal."""
        return (self.weights_sha256["recorded"] == self.weights_sha256["reproduced"] and not self.differing_tensors
                and all(_same(m["recorded"], m["reproduced"]) for m in self.metrics.values()))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, with ``identical``."""
        return {**asdict(self), "identical": self.identical}


def check_code(recorded: str, current: str) -> None:
    """Refuse unless the running code is the recorded commit, clean.

    Raises:
        ReproduceError: the commits differ, either side has uncommitted changes, or one is unknown.
    """
    how = (f"check out the recorded commit in a clean tree, e.g. `git worktree add ../kfloop-{recorded[:12]} "
           f"{recorded.removesuffix('-dirty')}` and run kfloop reproduce there")
    if recorded in ("", "unknown") or recorded.endswith("-dirty"):
        raise ReproduceError(f"the version was trained from code {recorded or 'of unknown commit'} (uncommitted "
                             "or unrecorded changes), which no commit holds: it cannot be reproduced exactly")
    if current != recorded:
        state = ("the working tree has uncommitted changes to tracked files" if current.endswith("-dirty")
                 else "the running code is another commit")
        raise ReproduceError(f"the version was trained by commit {recorded}, but {state} ({current}); {how}")


def fetch_by_md5(md5: str, dst: Path, *, repo_root: Path, data_stores: Iterable[str] = ()) -> tuple[Path, str]:
    """Copy the DVC object ``md5`` to ``dst``: from the repo's cache, else each of its remotes, else each data store
    URL (:func:`data.dvc_store.object_stores`).

    Returns:
        ``(dst, source)``, ``source`` naming where it was found.

    Raises:
        ReproduceError: in none of them (the message lists where it looked), or the copy does not hash to ``md5``.
    """
    dst.parent.mkdir(parents=True, exist_ok=True)
    with object_stores(repo_root, data_stores) as stores:
        found = locate(md5, stores)
        if found is None:
            looked = "; ".join(f"{label} ({odb.oid_to_path(md5)})" for label, odb in stores)
            raise ReproduceError(f"data md5 {md5} is in none of: {looked}. Push the training data with `dvc push`, "
                                 "configure the remote that holds it (`dvc remote add`), or name the data store the "
                                 "version was registered with (--set data_store.remote=URL)")
        label, odb = found
        source = f"{label} ({odb.oid_to_path(md5)})"
        odb.fs.get_file(odb.oid_to_path(md5), str(dst))
    actual = file_digest(dst, "md5")
    if actual != md5:
        dst.unlink()
        raise ReproduceError(f"{source} holds md5 {actual} under {md5}: the DVC store is corrupt")
    return dst, source


def reproduce(model_name: str, version: str, *, workdir: Path, current_commit: str, repo_root: Path,
              holdout_fraction: float | None = None, split_seed: int | None = None, data_store: str = "",
              client: Any = None) -> Reproduction:
    """Rebuild ``model_name`` ``version`` under ``workdir`` and compare it with the registered one.

    The data is fetched by its md5 from the repo's DVC cache and remotes, the data store the lineage records, and
    ``data_store`` (the one configured now).

    The split's fraction and seed are the ones the version's lineage records; ``holdout_fraction`` and
    ``split_seed`` (else the pipeline's defaults) only serve versions registered before they were recorded. The
    split is checked against the recorded holdout sha256.

    Raises:
        data.errors.NotFoundError: the model has no version ``version``.
        ReproduceError: the code is not the recorded commit, the data cannot be fetched, or the split differs.
        training.launch.local.LaunchError: retraining failed.
    """
    client = client or mlflow.MlflowClient()
    mv = model_version(model_name, version, client=client)
    record = VersionRecord.of(mv)
    check_code(record.git_commit or "", current_commit)
    lineage = mlflow.artifacts.load_dict(f"runs:/{mv.run_id}/{LINEAGE_ARTIFACT}")
    root = Path(workdir) / "reproduce" / f"{model_name}-v{version}"
    shutil.rmtree(root, ignore_errors=True)
    data, source = fetch_by_md5(record.data_md5, root / "data" / "dataset.parquet", repo_root=repo_root,
                                data_stores=[lineage.get("data_store", ""), data_store])
    progress(f"reproduce: data md5 {record.data_md5} from {source}")
    holdout_fraction = record.holdout_fraction or holdout_fraction or DEFAULT_HOLDOUT_FRACTION
    split_seed = record.split_seed if record.split_seed is not None else (
        DEFAULT_SPLIT_SEED if split_seed is None else split_seed)
    train, holdout = split_holdout(read_table(data), fraction=holdout_fraction, seed=split_seed)
    write_parquet(train, root / "data" / "train.parquet")
    holdout_sha = write_parquet(holdout, root / "data" / "holdout.parquet")
    if holdout_sha != record.holdout_sha256:
        raise ReproduceError(f"the split (holdout_fraction={holdout_fraction}, seed={split_seed}) gives holdout "
                             f"sha256 {holdout_sha}, not the recorded {record.holdout_sha256}; pass the "
                             "pipeline run's --set holdout_fraction=... --set seed=...")
    schema = root / "schema.yaml"
    schema.write_text(mlflow.artifacts.load_text(f"runs:/{mv.run_id}/{SCHEMA_ARTIFACT}"))
    registered = download_model_dir(model_name, str(version), root / "registered", client=client)
    recorded = lineage["training_config"]  # the model module: the version's verified copy, whatever the path was
    settings = TrainingSection.from_dict({  # versions registered before the split kept the shape in training_config
        **recorded, **lineage.get("job_shape", {}), "device": "cpu", "backend": "local",
        "model": {**recorded["model"], "module": str(registered / MODULE_FILE)}})
    config, shape = settings.config, settings.shape
    progress(f"reproduce: retraining on CPU, {shape.nnodes} node(s) x {shape.nproc_per_node} rank(s), "
             f"seed {config.seed}")
    rebuilt = train_local(root / "data" / "train.parquet", schema, model_dir=root / "model",
                          checkpoint_dir=root / "checkpoints", config=config, shape=shape, log_dir=root / "logs")

    ours = Predictor.load(rebuilt.model_dir)
    theirs = Predictor.load(registered, module_sha256=record.model_module_sha256)
    holdout = read_table(root / "data" / "holdout.parquet")  # as the evaluation step reads it
    holdout_now = compute_metrics(*ours.scored(holdout), ours.classes, ours.threshold)
    recorded_run = client.get_run(mv.run_id).data.metrics
    metrics = {f"holdout_{k}": {"recorded": recorded_run.get(f"eval_challenger_{k}", math.nan), "reproduced": v}
               for k, v in holdout_now.items()}
    metrics |= {k: {"recorded": theirs.description["metrics"][k], "reproduced": v}
                for k, v in ours.description["metrics"].items()}
    if lineage.get("decision_threshold") is not None or ours.threshold is not None:
        metrics["decision_threshold"] = {"recorded": _number(lineage.get("decision_threshold")),
                                         "reproduced": _number(ours.threshold)}
    a, b = load_file(rebuilt.model_dir / WEIGHTS_FILE), load_file(registered / WEIGHTS_FILE)
    differing = sorted(k for k in a.keys() | b.keys() if k not in a or k not in b or not bool((a[k] == b[k]).all()))
    result = Reproduction(model_name=model_name, version=str(version), data_md5=record.data_md5, data_source=source,
                          git_commit=record.git_commit, seed=config.seed, world_size=rebuilt.world_size,
                          metrics=metrics, differing_tensors=differing, model_dir=str(rebuilt.model_dir),
                          weights_sha256={"recorded": record.weights_sha256,
                                          "reproduced": file_digest(rebuilt.model_dir / WEIGHTS_FILE)})
    progress(f"reproduce: {model_name} v{version} {'identical' if result.identical else 'DIFFERS'}")
    return result


def _number(value: float | None) -> float:
    """An optional threshold as a number; NaN for ``None`` (so one side missing differs)."""
    return math.nan if value is None else float(value)


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))
