"""The one training entry point, run by torchrun on this machine and in every training pod:

    torchrun ... -m training.train --data FILE --schema FILE --model-dir DIR --checkpoint-dir DIR --config FILE.json
                                   [--mlflow-run-id ID | --mlflow-run-id-file FILE]

``python -m training.train ...`` without torchrun trains in a single process. Each rank reads the whole data file,
carves the seeded validation part, fits the features on the rest, builds the model plug-in's network
(:class:`training.config.ModelSpec`: logits per class, or one standardised value for regression) and trains its
DistributedSampler shard with DDP (gloo on CPU, NCCL on GPUs). After every epoch rank 0 writes a checkpoint and logs metrics; a restarted run resumes
from the newest good checkpoint. At the end the ranks compare parameter digests and rank 0 writes the model dir.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import json
import logging
import os
import random
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data.distributed import DistributedSampler

from data.storage import is_remote
from training import checkpoints
from training.config import TrainingConfig
from training.features import FeatureTransform, encode_target, target_classes
from training.model import save_model_dir
from training.model_code import ModelCode
from data.validation import load_schema, read_table_source, schema_roles, schema_to_yaml
from training.threshold import choose_threshold

logger = logging.getLogger("kfloop.train")

RESUME_KEYS = ("batch_size", "learning_rate", "lr_gamma", "weight_decay", "seed", "val_fraction", "class_weight",
               "regression_loss", "huber_delta")
"""Config fields a checkpoint must agree on to be resumed (``epochs`` may grow; the world size may change), besides
the model module's sha256, builder and params."""
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``loss(outputs [batch, n_outputs], targets) -> mean loss``; targets are class indices (int64) for
classification, standardised values (float32) for regression."""
RESTARTS_TAG = "kfloop.restarts"
"""MLflow run tag: worker-group restarts torchrun made (``TORCHELASTIC_RESTART_COUNT`` of the last attempt)."""


@dataclass(kw_only=True, slots=True)
class _Rank:
    """Where this process sits in the job."""

    rank: int
    """Global rank (0 does the side effects)."""
    world_size: int
    """Processes in the job."""
    device: torch.device
    """``cuda:<LOCAL_RANK>`` or ``cpu``."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments of the entry point."""
    parser = argparse.ArgumentParser(prog="python -m training.train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="training data (Parquet or CSV): a path or s3://, gs://, az://")
    parser.add_argument("--schema", required=True, help="kfloop pandera schema YAML: a path or s3://, gs://, az://")
    parser.add_argument("--model-dir", required=True, type=Path, help="where rank 0 writes the model dir")
    parser.add_argument("--checkpoint-dir", required=True, type=Path,
                        help="step checkpoints; shared by all nodes; a run resumes from the newest good one")
    parser.add_argument("--config", required=True, type=Path, help="TrainingConfig as JSON")
    parser.add_argument("--mlflow-run-id", help="MLflow run that rank 0 logs params and metrics to "
                                                "(tracking URI from MLFLOW_TRACKING_URI)")
    parser.add_argument("--mlflow-run-id-file", type=Path,
                        help="a file holding that run id, when it exists (a Kubernetes job's launcher stages it in "
                             "the job's folder, so the manifest is the same before and after the run is created)")
    return parser.parse_args(argv)


@record
def main(argv: list[str] | None = None) -> None:
    """Train on this rank; see the module docstring.

    Raises:
        ValueError: invalid config, too few rows, or checkpoints in ``--checkpoint-dir`` from a different run.
        ModelCodeError: the model module cannot be found, imported or built.
        DataFileError: the data or schema file cannot be read.
    """
    args = parse_args(argv)
    cfg = TrainingConfig.from_dict(json.loads(args.config.read_text()))
    me = _init_distributed(cfg)
    logging.basicConfig(level=logging.INFO if me.rank == 0 else logging.WARNING, force=True,
                        format=f"%(asctime)s [rank {me.rank}] %(levelname)s %(name)s: %(message)s")
    try:
        _train(args, cfg, me)
    finally:
        dist.destroy_process_group()


def _init_distributed(cfg: TrainingConfig) -> _Rank:
    """Join the process group from torchrun's env (RANK, WORLD_SIZE, MASTER_ADDR/PORT), or a world of one."""
    torch.set_num_threads(cfg.threads_per_rank)
    cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    if cuda and not torch.cuda.is_available():
        raise ValueError("device='cuda' but this node has no usable CUDA device; use device='cpu' or 'auto'")
    if cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    backend = "nccl" if cuda else "gloo"
    timeout = timedelta(seconds=cfg.collective_timeout_seconds)
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        dist.init_process_group(backend, store=_attempt_store(timeout), rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]), device_id=device if cuda else None,
                                timeout=timeout)
    elif "RANK" in os.environ:
        dist.init_process_group(backend, init_method="env://", device_id=device if cuda else None, timeout=timeout)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return _Rank(rank=dist.get_rank(), world_size=dist.get_world_size(), device=device)


def _attempt_store(timeout: timedelta) -> dist.Store:
    """The torchrun agent's store, under a prefix of its own for each restart of the workers.

    With the static rendezvous (the Training Operator's default: ``MASTER_ADDR``/``MASTER_PORT``, no elastic
    policy) every attempt shares one store, and ``init_method="env://"`` adds no prefix: a restarted rank would
    read the addresses of the ranks that died and fail to connect.
    """
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=timeout)
    return dist.PrefixStore(f"kfloop/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


def _split(df: pd.DataFrame, cfg: TrainingConfig, source: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Seeded (train, validation) rows."""
    n_val = round(len(df) * cfg.val_fraction)
    if n_val < 1 or n_val >= len(df) - 1:
        raise ValueError(f"{source}: {len(df)} rows are too few for val_fraction={cfg.val_fraction}; "
                         "give more rows or change val_fraction")
    order = np.random.default_rng(cfg.seed).permutation(len(df))
    return df.iloc[np.sort(order[n_val:])], df.iloc[np.sort(order[:n_val])]


def _train(args: argparse.Namespace, cfg: TrainingConfig, me: _Rank) -> None:
    schema = load_schema(Path(args.schema) if not is_remote(args.schema) else args.schema)
    roles = schema_roles(schema)
    regression = roles.task == "regression"
    code = ModelCode.load(cfg.model)
    df, source = read_table_source(args.data)
    train_df, val_df = _split(df, cfg, source.uri)
    target = _Target.fit(train_df[roles.target], df[roles.target], roles.task)
    transform = FeatureTransform.fit(train_df, numeric=roles.numeric, categorical=roles.categorical)
    x_train, y_train = _tensors(train_df, transform, roles.target, target, me.device)
    x_val, y_val = _tensors(val_df.iloc[me.rank::me.world_size], transform, roles.target, target, me.device)
    class_counts = None if regression else np.bincount(encode_target(train_df[roles.target], target.classes),
                                                       minlength=len(target.classes))
    loss_fn = code.loss or _task_loss(cfg, roles.task, None if regression else
                                      _class_weights(class_counts, cfg.class_weight, me.device))

    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    n_inputs, n_outputs = transform.n_outputs, 1 if regression else len(target.classes)
    model = code.build(n_inputs, n_outputs).to(me.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=cfg.lr_gamma)
    fingerprint = {"data_md5": source.md5,
                   "schema_sha256": hashlib.sha256(schema_to_yaml(schema).encode("utf-8")).hexdigest(),
                   "model_sha256": code.sha256, "model_builder": cfg.model.builder, "model_params": cfg.model.params,
                   **{k: v for k, v in cfg.to_dict().items() if k in RESUME_KEYS}}
    start_epoch, step = _resume(args.checkpoint_dir, me, cfg, fingerprint, model, optimizer, scheduler)
    ddp = DistributedDataParallel(model, device_ids=[me.device.index] if me.device.type == "cuda" else None,
                                  bucket_cap_mb=cfg.bucket_cap_mb)
    _settle_buckets(ddp, x_train[:1])
    sampler = DistributedSampler(range(len(x_train)), num_replicas=me.world_size, rank=me.rank, shuffle=True,
                                 seed=cfg.seed)

    run_id = args.mlflow_run_id or (args.mlflow_run_id_file.read_text().strip()
                                    if args.mlflow_run_id_file and args.mlflow_run_id_file.is_file() else None)
    mlflow_log = _MlflowLog(run_id) if me.rank == 0 and run_id else None
    if mlflow_log:
        mlflow_log.params({**cfg.to_dict(), "world_size": me.world_size, "train_rows": len(train_df),
                           "val_rows": len(val_df), "n_inputs": n_inputs, "n_outputs": n_outputs,
                           "model_sha256": code.sha256})
        mlflow_log.restarts(int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))
    for epoch in range(start_epoch, cfg.epochs):
        started = time.perf_counter()
        sampler.set_epoch(epoch)
        train_loss, steps = _train_epoch(ddp, optimizer, list(sampler), x_train, y_train, cfg.batch_size, me.device,
                                         bf16=cfg.bf16_autocast, loss_fn=loss_fn)
        step += steps
        scheduler.step()
        metrics = {"train_loss": train_loss, **_evaluate(model, x_val, y_val, me.device, loss_fn, target)}
        rng_states = _all_gather_json(_rng_state(me.device), me.device)
        if me.rank == 0:
            if mlflow_log:  # before the checkpoint: a restart may log an epoch twice, never skip one
                mlflow_log.metrics(metrics, step=epoch + 1)
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                     "scheduler": scheduler.state_dict(), "rng": rng_states, "epoch": epoch + 1, "step": step,
                     "sampler_epoch": epoch, "fingerprint": fingerprint, "metrics": metrics}
            checkpoints.save(args.checkpoint_dir, step, state, keep=cfg.checkpoint_keep)
            logger.info("epoch %d/%d step %d %s (%.2fs)", epoch + 1, cfg.epochs, step,
                        " ".join(f"{k}={v:.4f}" for k, v in metrics.items()), time.perf_counter() - started)

    final = _evaluate(model, x_val, y_val, me.device, loss_fn, target)
    digests = _all_gather_json(param_digest(model), me.device)
    if me.rank == 0:
        assert len(set(digests)) == 1, f"ranks ended with different parameters: digests {digests}"
        if regression:
            by_task = {"target_scale": {"mean": target.mean, "std": target.std}}
        else:
            by_task = {"class_counts": class_counts.tolist(), "decision_threshold": _decision_threshold(
                model, transform.transform(val_df), encode_target(val_df[roles.target], target.classes),
                cfg.threshold_metric, len(target.classes))}
        save_model_dir(args.model_dir, model=model, code=code, n_inputs=n_inputs, n_outputs=n_outputs,
                       transform=transform, classes=target.classes, target=roles.target, task=roles.task,
                       extra={"config": cfg.to_dict(), "metrics": final, "world_size": me.world_size,
                              "param_digests": digests, **by_task})
        logger.info("wrote %s: %s (%s)", args.model_dir, final,
                    {k: v for k, v in by_task.items() if k != "class_counts"})


def _class_weights(counts: np.ndarray, how: str, device: torch.device) -> torch.Tensor | None:
    """Per-class loss weights: ``balanced`` gives ``rows / (classes * count)`` (a class absent from the training
    split counts as one row); ``none`` gives ``None``."""
    if how == "none":
        return None
    return torch.tensor(counts.sum() / (len(counts) * np.maximum(counts, 1)), dtype=torch.float32, device=device)


def _decision_threshold(model: torch.nn.Module, x_val: np.ndarray, y_val: np.ndarray, metric: str,
                        n_classes: int) -> float | None:
    """The binary decision threshold maximising ``metric`` on the whole validation split (``None`` for
    multi-class targets, ``metric="none"``, or a validation split lacking a class)."""
    if n_classes != 2 or metric == "none":
        return None
    model.eval()
    with torch.no_grad():
        proba = torch.softmax(model(torch.from_numpy(x_val).to(next(model.parameters()).device)).double(), dim=1)
    threshold = choose_threshold(y_val, proba[:, 1].cpu().numpy(), metric)
    if threshold is None:
        logger.warning("validation split lacks a class: no decision threshold chosen; predicting the most "
                       "probable class")
    return threshold


def _train_epoch(ddp: DistributedDataParallel, optimizer: torch.optim.Optimizer, order: list[int],
                 x: torch.Tensor, y: torch.Tensor, batch_size: int, device: torch.device, *,
                 bf16: bool = True, loss_fn: LossFn) -> tuple[float, int]:
    """One pass over this rank's rows in sampler ``order``; returns (mean loss over all ranks, optimizer steps).

    On CUDA with ``bf16`` the forward pass and loss run under bf16 autocast; on CPU everything stays float32.
    """
    ddp.train()
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    batches = torch.tensor(order, device=device).split(batch_size)
    autocast = bf16 and device.type == "cuda"
    for batch in batches:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            loss = loss_fn(ddp(x[batch]), y[batch])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss_sum += loss.detach().double() * len(batch)
    totals = torch.stack([loss_sum, torch.tensor(float(len(order)), dtype=torch.float64, device=device)])
    dist.all_reduce(totals)
    return float(totals[0] / totals[1]), len(batches)


@dataclass(frozen=True, slots=True)
class _Target:
    """How the target becomes training tensors: class indices, or values standardised with the training split's
    mean and standard deviation (so the module sees unit scale whatever the target's units)."""

    classes: list
    """Sorted labels (classification); empty for regression."""
    mean: float = 0.0
    std: float = 1.0

    @classmethod
    def fit(cls, train: pd.Series, every: pd.Series, task: str) -> "_Target":
        """Classes from all rows, or the scale from the training rows.

        Raises:
            ValueError: classification with fewer than two classes or null labels; regression with null or
                non-numeric targets.
        """
        if task == "classification":
            return cls(classes=target_classes(every))
        values = pd.to_numeric(every, errors="coerce")
        if values.isna().any():
            raise ValueError(f"target '{every.name}' has {int(values.isna().sum())} null or non-numeric value(s); "
                             "a regression target must be numbers")
        scale = pd.to_numeric(train).astype("float64")
        std = float(scale.std(ddof=0))
        return cls(classes=[], mean=float(scale.mean()), std=std if std > 0 else 1.0)

    def encode(self, labels: pd.Series) -> np.ndarray:
        """Class indices (int64) or standardised values (float32)."""
        if self.classes:
            return encode_target(labels, self.classes)
        return ((pd.to_numeric(labels).to_numpy(dtype="float64") - self.mean) / self.std).astype(np.float32)


def _task_loss(cfg: TrainingConfig, task: str, weight: torch.Tensor | None) -> LossFn:
    """kfloop's loss for the task: cross entropy (``weight``: per-class weights), or ``cfg.regression_loss`` on
    the single output."""
    if task == "classification":
        return lambda out, y: F.cross_entropy(out, y, weight=weight)
    if cfg.regression_loss == "huber":
        return lambda out, y: F.huber_loss(out[:, 0], y, delta=cfg.huber_delta)
    return lambda out, y: F.mse_loss(out[:, 0], y)


def _tensors(df: pd.DataFrame, transform: FeatureTransform, column: str, target: _Target,
             device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Features and targets, resident on ``device`` for the whole run (copied once, from pinned memory on CUDA)."""
    x = torch.from_numpy(transform.transform(df))
    y = torch.from_numpy(target.encode(df[column]))
    if device.type == "cuda":
        x, y = x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x, y


def _settle_buckets(ddp: DistributedDataParallel, x: torch.Tensor) -> None:
    """Run DDP's first backward on a zero loss, before any optimizer step.

    DDP regroups its gradient buckets after the first backward, and with more than two ranks the rounding of an
    all-reduced value depends on its position in the bucket. Regrouping here, in eval mode (no dropout RNG draw),
    makes every optimizer step of a fresh and of a resumed run reduce identically, so resuming reproduces an
    uninterrupted run bit for bit.
    """
    ddp.eval()
    (ddp(x).sum() * 0).backward()
    ddp.module.zero_grad(set_to_none=True)


def _resume(directory: Path, me: _Rank, cfg: TrainingConfig, fingerprint: dict[str, Any], model: torch.nn.Module,
            optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler) -> tuple[int, int]:
    """Load the checkpoint rank 0 picks (the same on every rank); return (completed epochs, step).

    Without a checkpoint each rank seeds its own RNG stream from the config seed and its rank.

    Raises:
        ValueError: the checkpoint belongs to a different run (data, schema, model or a field of RESUME_KEYS), or has
            trained more epochs than ``cfg.epochs``.
        checkpoints.CheckpointError: checkpoints exist but none verifies, or the newest one is from another torch
            minor version.
    """
    chosen = torch.tensor([-1], device=me.device)
    if me.rank == 0:
        good = checkpoints.latest_good(directory)
        if good is None and checkpoints.committed_steps(directory):
            raise checkpoints.CheckpointError(
                f"{directory}: checkpoints {checkpoints.committed_steps(directory)} exist but none verifies (see the "
                "warnings above); refusing to start again from step 0: move them aside to retrain from scratch")
        chosen[0] = -1 if good is None else good
    dist.broadcast(chosen, src=0)
    step = int(chosen[0])
    if step < 0:
        _seed_rank(cfg.seed, me)
        return 0, 0
    state = checkpoints.load(directory, step)
    differs = sorted(k for k in fingerprint if state["fingerprint"].get(k) != fingerprint[k])
    if differs:
        raise ValueError(f"{checkpoints.sidecar_path(directory, step)} is from a different training run (differs "
                         f"in {differs}); use an empty --checkpoint-dir or the original data, schema and config")
    if state["epoch"] > cfg.epochs:
        raise ValueError(f"{checkpoints.sidecar_path(directory, step)} has trained {state['epoch']} epochs, more "
                         f"than epochs={cfg.epochs}; set epochs >= {state['epoch']} or use an empty --checkpoint-dir")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    if len(state["rng"]) == me.world_size:
        _set_rng_state(state["rng"][me.rank], me.device)
    else:
        logger.warning("checkpoint has RNG states of %d ranks, this run has %d: reseeding", len(state["rng"]),
                       me.world_size)
        _seed_rank(cfg.seed + step, me)
    if me.rank == 0:
        logger.info("resuming from checkpoint step %d (epoch %d) in %s", step, state["epoch"], directory)
    return state["epoch"], step


def _seed_rank(seed: int, me: _Rank) -> None:
    """A distinct RNG stream per rank (dropout masks must differ between ranks)."""
    random.seed(seed * 1000 + me.rank)
    np.random.seed(seed * 1000 + me.rank)
    torch.manual_seed(seed * 1000 + me.rank)


def _rng_state(device: torch.device) -> dict[str, Any]:
    """This rank's torch (and CUDA), numpy and Python RNG states as JSON values."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    state = {"torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
             "numpy": [kind, keys.tolist(), pos, has_gauss, cached],
             "python": [version, list(internal), gauss_next]}
    if device.type == "cuda":
        state["cuda"] = base64.b64encode(torch.cuda.get_rng_state(device).numpy().tobytes()).decode()
    return state


def _set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    """Inverse of :func:`_rng_state`."""
    torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(state["torch"])), dtype=torch.uint8))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    if device.type == "cuda":
        torch.cuda.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(state["cuda"])), dtype=torch.uint8),
                                 device)


def _all_gather_json(value: Any, device: torch.device) -> list[Any]:
    """``value`` of every rank, in rank order, sent as JSON bytes (no pickle, unlike all_gather_object)."""
    data = torch.frombuffer(bytearray(json.dumps(value).encode()), dtype=torch.uint8).to(device)
    sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, torch.tensor([data.numel()], device=device))
    padded = torch.zeros(max(int(s) for s in sizes), dtype=torch.uint8, device=device)
    padded[:data.numel()] = data
    gathered = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(gathered, padded)
    return [json.loads(bytes(g[:int(s)].cpu().numpy())) for g, s in zip(gathered, sizes)]


def _evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, device: torch.device, loss_fn: LossFn,
              target: _Target) -> dict[str, float]:
    """Validation loss and accuracy (classification) or RMSE in the target's units (regression) over all ranks'
    shards (sums all-reduced, so every rank gets the same)."""
    model.eval()
    with torch.no_grad():
        out = model(x)
        hits = ((out.argmax(dim=1) == y).sum() if target.classes else ((out[:, 0] - y) ** 2).sum()).double()
        sums = torch.stack([loss_fn(out, y).double() * len(y), hits,
                            torch.tensor(float(len(y)), dtype=torch.float64, device=device)])
    dist.all_reduce(sums)
    if target.classes:
        return {"val_loss": float(sums[0] / sums[2]), "val_accuracy": float(sums[1] / sums[2])}
    return {"val_loss": float(sums[0] / sums[2]), "val_rmse": float((sums[1] / sums[2]).sqrt()) * target.std}


def param_digest(model: torch.nn.Module) -> str:
    """sha256 over every parameter and buffer (name, dtype, shape, bytes)."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}:".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class _MlflowLog:
    """Rank 0's MLflow logging into an existing run (tracking URI from ``MLFLOW_TRACKING_URI``)."""

    def __init__(self, run_id: str):
        import mlflow  # only rank 0 of a run that logs pays for the import

        self._entities = mlflow.entities
        self._client = mlflow.MlflowClient()
        self._run_id = run_id

    def params(self, params: dict[str, Any]) -> None:
        """Log the params the run does not have yet (a resumed run keeps the values it started with)."""
        existing = self._client.get_run(self._run_id).data.params
        new = [self._entities.Param(k, str(v)) for k, v in params.items() if k not in existing]
        if new:
            self._client.log_batch(self._run_id, params=new)

    def restarts(self, count: int) -> None:
        """Record how often torchrun restarted the workers of this run (tag ``kfloop.restarts``): every attempt
        logs into the same run."""
        self._client.set_tag(self._run_id, RESTARTS_TAG, str(count))

    def metrics(self, metrics: dict[str, float], *, step: int) -> None:
        """One value per metric for ``step`` (the epoch number)."""
        for key, value in metrics.items():
            self._client.log_metric(self._run_id, key, value, step=step)


if __name__ == "__main__":
    main()
