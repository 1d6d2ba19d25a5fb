"""The one training entry point, run by torchrun on this machine and in every training pod:

    torchrun ... -m training.train --data FILE --schema FILE --model-dir DIR --checkpoint-dir DIR --config FILE.json
                                   [--mlflow-run-id ID | --mlflow-run-id-file FILE]

``python -m training.train ...`` without torchrun trains in a single process. Rank 0 fits the features and the
target's encoding on the training rows in one streaming pass and broadcasts them; each rank then reads only its
shard of the file, chunk by chunk (:mod:`training.inputs`), builds the model plug-in's network
(:class:`training.config.ModelSpec`: logits per class, or one standardised value for regression) and trains with
DDP (gloo on CPU, NCCL on GPUs). After every epoch rank 0 writes a checkpoint and logs metrics; a restarted run resumes
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
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel

from data.redaction import redact_text
from data.settings import end_without_final_collection
from data.storage import is_remote
from data.tables import local_copy
from data.validation import load_schema, schema_roles, schema_to_yaml
from training import checkpoints
from training.config import TrainingConfig
from training.devices import pin_local_device
from training.inputs import RankInput, ShardedTable, TargetEncoding, fit_on_rank0
from training.model import save_model_dir
from training.model_code import ModelCode
from training.threshold import choose_threshold, resolve_threshold_metric

logger = logging.getLogger("kfloop.train")

RESUME_KEYS = ("batch_size", "learning_rate", "lr_gamma", "weight_decay", "seed", "val_fraction", "class_weight",
               "regression_loss", "huber_delta")
"""Config fields a checkpoint must agree on to be resumed (``epochs`` may grow; the world size may change), besides
the model module's sha256, builder and params."""
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``loss(outputs [batch, n_outputs], targets) -> mean loss``; targets are class indices (int64) for
classification, standardised values (float32) for regression."""
EpochReport = Callable[[dict[str, float], Path | None], None]
"""``report(metrics, checkpoint_dir)`` after each epoch, on every rank (see :func:`train_in_process_group`)."""
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
    """``cuda:<LOCAL_RANK>``, ``cuda:0`` on a MIG device (training/devices.py), or ``cpu``."""


def argument_parser(**kwargs: Any) -> argparse.ArgumentParser:
    """The entry point's arguments (``training.ray_train`` adds its own to them); ``kwargs`` go to the parser."""
    parser = argparse.ArgumentParser(**{"prog": "python -m training.train",
                                        "description": __doc__.split("\n\n")[0], **kwargs})
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
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments of the entry point."""
    return argument_parser().parse_args(argv)


@record
def main(argv: list[str] | None = None) -> None:
    """Train on this rank; see the module docstring.

    Raises:
        ValueError: invalid config, too few rows, or checkpoints in ``--checkpoint-dir`` from a different run.
        ModelCodeError: the model module cannot be found, imported or built.
        DataFileError: the data or schema file cannot be read.
    """
    args = parse_args(argv)
    end_without_final_collection()
    cfg = TrainingConfig.from_dict(json.loads(args.config.read_text()))
    me = _init_distributed(cfg)
    logging.basicConfig(level=logging.INFO if me.rank == 0 else logging.WARNING, force=True,
                        format=f"%(asctime)s [rank {me.rank}] %(levelname)s %(name)s: %(message)s")
    try:
        _train(args, cfg, me)
    finally:
        dist.destroy_process_group()


def _init_distributed(cfg: TrainingConfig) -> _Rank:
    """Join the process group from the env torchrun gives each worker (RANK, LOCAL_RANK, WORLD_SIZE,
    MASTER_ADDR/PORT), or a world of one without torchrun.

    Both operators' pod env is torchrun's input, not ours: the Training Operator v1 sets ``PET_*`` plus its own
    ``MASTER_ADDR``/``MASTER_PORT``/``WORLD_SIZE``/``RANK`` (a node rank), Trainer v2.3 only ``PET_NNODES``,
    ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR``/``PORT``. torchrun reads the ``PET_*`` as its flags
    and overrides the rest per worker, so only ``LOCAL_RANK`` (torchrun's alone) says a worker was launched by it."""
    torch.set_num_threads(cfg.threads_per_rank)
    index = pin_local_device()  # before CUDA initialises: a MIG device per local rank
    cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    if cuda and not torch.cuda.is_available():
        raise ValueError("device='cuda' but this node has no usable CUDA device; use device='cpu' or 'auto'")
    if cuda:
        device = torch.device("cuda", index)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    backend = "nccl" if cuda else "gloo"
    timeout = timedelta(seconds=cfg.collective_timeout_seconds)
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        dist.init_process_group(backend, store=_attempt_store(timeout), rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]), device_id=device if cuda else None,
                                timeout=timeout)
    elif "LOCAL_RANK" in os.environ:
        dist.init_process_group(backend, init_method="env://", device_id=device if cuda else None, timeout=timeout)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return _Rank(rank=dist.get_rank(), world_size=dist.get_world_size(), device=device)


def _attempt_store(timeout: timedelta) -> dist.Store:
    """The torchrun agent's store, under a prefix of its own for each attempt of the job (:func:`_join_attempt`).

    Node 0's agent hosts that store for as long as it lives, across its restarts of the workers (the static
    rendezvous of the Training Operator's default and c10d alike), and ``init_method="env://"`` adds no prefix: a
    restarted rank would read the addresses of the ranks that died and fail to connect.
    """
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=timeout)
    attempt = _join_attempt(store, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
    return dist.PrefixStore(f"kfloop/attempt_{attempt}", store)


def _join_attempt(store: dist.Store, rank: int, world_size: int) -> int:
    """The number of the attempt this process joins: the current one (counter ``kfloop/attempt`` in ``store``),
    unless a process of this rank already joined it or it began with another world size. Then that attempt is over
    (its other ranks fail out of it and come here too), and this process moves the counter on and tries the next.

    ``TORCHELASTIC_RESTART_COUNT`` cannot number the attempts: it counts per node, a recreated pod's torchrun starts
    again at 0, and elastic membership changes do not count.
    """
    while True:
        attempt = store.add("kfloop/attempt", 0)
        joined = f"kfloop/joined_{attempt}"
        if store.compare_set(f"{joined}/world_size", "", str(world_size)) == str(world_size).encode() \
                and store.add(f"{joined}/rank_{rank}", 1) == 1:
            return attempt
        store.compare_set("kfloop/attempt", str(attempt), str(attempt + 1))


def train_in_process_group(args: argparse.Namespace, device: torch.device, report: EpochReport) -> None:
    """Train on this rank of a process group another launcher already formed (Ray Train's ``TorchConfig``), on
    ``device``; ``report(metrics, checkpoint_dir)`` runs on every rank after each epoch (``checkpoint_dir`` on rank 0,
    which has just written a checkpoint there; None elsewhere)."""
    cfg = TrainingConfig.from_dict(json.loads(args.config.read_text()))
    torch.set_num_threads(cfg.threads_per_rank)
    me = _Rank(rank=dist.get_rank(), world_size=dist.get_world_size(), device=device)
    logging.basicConfig(level=logging.INFO if me.rank == 0 else logging.WARNING, force=True,
                        format=f"%(asctime)s [rank {me.rank}] %(levelname)s %(name)s: %(message)s")
    _train(args, cfg, me, report)


def _train(args: argparse.Namespace, cfg: TrainingConfig, me: _Rank, report: EpochReport | None = None) -> None:
    schema = load_schema(Path(args.schema) if not is_remote(args.schema) else args.schema)
    roles = schema_roles(schema)
    code = ModelCode.load(cfg.model)
    with local_copy(args.data) as (path, source):
        table = ShardedTable(path, val_fraction=cfg.val_fraction, seed=cfg.seed, source=source.uri)
        fitted = fit_on_rank0(table, roles, me.device)
        data = RankInput(table, fitted, roles.target, rank=me.rank, world_size=me.world_size, seed=cfg.seed,
                         batch_size=cfg.batch_size, device=me.device)
        fingerprint = {"data_md5": source.md5,
                       "schema_sha256": hashlib.sha256(schema_to_yaml(schema).encode("utf-8")).hexdigest(),
                       "model_sha256": code.sha256, "model_builder": cfg.model.builder,
                       "model_params": cfg.model.params,
                       **{k: v for k, v in cfg.to_dict().items() if k in RESUME_KEYS}}
        _train_model(args, cfg, me, data, code, roles.task, fingerprint, report)


def _train_model(args: argparse.Namespace, cfg: TrainingConfig, me: _Rank, data: RankInput, code: ModelCode,
                 task: str, fingerprint: dict[str, Any], report: EpochReport | None) -> None:
    """Train ``code``'s network on ``data`` from the newest good checkpoint on; rank 0 logs, checkpoints and writes
    the model dir."""
    transform, target = data.fitted.transform, data.fitted.target
    regression = task == "regression"
    class_counts = np.array(data.fitted.class_counts)
    loss_fn = code.loss or _task_loss(cfg, task, None if regression else
                                      _class_weights(class_counts, cfg.class_weight, me.device))

    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    n_inputs, n_outputs = transform.n_outputs, 1 if regression else len(target.classes)
    model = code.build(n_inputs, n_outputs).to(me.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=cfg.lr_gamma)
    start_epoch, step = _resume(args.checkpoint_dir, me, cfg, fingerprint, model, optimizer, scheduler)
    ddp = DistributedDataParallel(model, device_ids=[me.device.index] if me.device.type == "cuda" else None,
                                  bucket_cap_mb=cfg.bucket_cap_mb)
    _settle_buckets(ddp, torch.zeros(1, n_inputs, device=me.device))

    run_id = args.mlflow_run_id or (args.mlflow_run_id_file.read_text().strip()
                                    if args.mlflow_run_id_file and args.mlflow_run_id_file.is_file() else None)
    mlflow_log = _MlflowLog(run_id) if me.rank == 0 and run_id else None
    if mlflow_log:
        mlflow_log.params({**cfg.to_dict(), "world_size": me.world_size, "train_rows": data.table.train_rows,
                           "val_rows": data.table.num_rows - data.table.train_rows, "n_inputs": n_inputs,
                           "n_outputs": n_outputs, "model_sha256": code.sha256})
        mlflow_log.restarts(int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))
    for epoch in range(start_epoch, cfg.epochs):
        started = time.perf_counter()
        train_loss, steps = _train_epoch(ddp, optimizer, data.batches(epoch), me.device, bf16=cfg.bf16_autocast,
                                         loss_fn=loss_fn)
        step += steps
        scheduler.step()
        metrics = {"train_loss": train_loss, **_evaluate(model, data.validation(), me.device, loss_fn, target)}
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
        if report:
            report({**metrics, "epoch": epoch + 1}, args.checkpoint_dir if me.rank == 0 else None)

    final = _evaluate(model, data.validation(), me.device, loss_fn, target)
    digests = _all_gather_json(param_digest(model), me.device)
    if me.rank == 0:
        # Only rank 0 fits the linear baseline: the other ranks (and every rank's start) skip scikit-learn's import.
        from training.linear import MAX_ROWS as LINEAR_MAX_ROWS, fit_linear, linear_scores

        assert len(set(digests)) == 1, f"ranks ended with different parameters: digests {digests}"
        val_x, val_y = _validation_arrays(data)
        linear = fit_linear(*data.training_sample(LINEAR_MAX_ROWS), n_classes=0 if regression else
                            len(target.classes), seed=cfg.seed)
        if regression:
            by_task = {"target_scale": {"mean": target.mean, "std": target.std}}
        else:
            metric, why = resolve_threshold_metric(cfg.threshold_metric, class_counts.tolist())
            threshold = _decision_threshold(model, val_x, val_y, metric, len(target.classes))
            linear["threshold"] = _threshold_for(val_y, linear_scores(linear, val_x.cpu().numpy()), metric,
                                                 len(target.classes))
            by_task = {"class_counts": class_counts.tolist(), "decision_threshold": threshold,
                       "threshold_choice": {"setting": cfg.threshold_metric, "metric": metric, "reason": why}}
            logger.info("decision threshold: %s (%s)", "most probable class" if threshold is None else
                        f"{threshold:.4f} for {metric}", why)
        by_task["linear_baseline"] = linear
        save_model_dir(args.model_dir, model=model, code=code, n_inputs=n_inputs, n_outputs=n_outputs,
                       transform=transform, classes=target.classes, target=data.target, task=task,
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


def _validation_arrays(data: RankInput) -> tuple[torch.Tensor, np.ndarray]:
    """The whole validation split's features (on the training device) and encoded targets."""
    xs, ys = zip(*data.validation(whole_file=True))
    return torch.cat(xs), torch.cat(ys).cpu().numpy()


def _decision_threshold(model: torch.nn.Module, x: torch.Tensor, y: np.ndarray, metric: str,
                        n_classes: int) -> float | None:
    """The binary decision threshold maximising ``metric`` on the validation split's features ``x`` and labels
    ``y`` (``None`` for multi-class targets, ``metric="none"``, or a validation split lacking a class)."""
    model.eval()
    with torch.no_grad():
        proba = torch.softmax(model(x).double(), dim=1).cpu().numpy()
    threshold = _threshold_for(y, proba, metric, n_classes)
    if threshold is None and n_classes == 2 and metric != "none":
        logger.warning("validation split lacks a class: no decision threshold chosen; predicting the most "
                       "probable class")
    return threshold


def _threshold_for(y: np.ndarray, proba: np.ndarray, metric: str, n_classes: int) -> float | None:
    """:func:`training.threshold.choose_threshold` for a binary model's probabilities; ``None`` otherwise."""
    return None if n_classes != 2 else choose_threshold(y, proba[:, 1], metric)


def _train_epoch(ddp: DistributedDataParallel, optimizer: torch.optim.Optimizer,
                 batches: Iterable[tuple[torch.Tensor, torch.Tensor]], device: torch.device, *,
                 bf16: bool = True, loss_fn: LossFn) -> tuple[float, int]:
    """One pass over this rank's ``batches``; returns (mean loss over all ranks, optimizer steps).

    On CUDA with ``bf16`` the forward pass and loss run under bf16 autocast; on CPU everything stays float32.
    """
    ddp.train()
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    rows = steps = 0
    autocast = bf16 and device.type == "cuda"
    for x, y in batches:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            loss = loss_fn(ddp(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss_sum += loss.detach().double() * len(y)
        rows, steps = rows + len(y), steps + 1
    totals = torch.stack([loss_sum, torch.tensor(float(rows), dtype=torch.float64, device=device)])
    dist.all_reduce(totals)
    return float(totals[0] / totals[1]), steps



def _task_loss(cfg: TrainingConfig, task: str, weight: torch.Tensor | None) -> LossFn:
    """kfloop's loss for the task: cross entropy (``weight``: per-class weights), or ``cfg.regression_loss`` on
    the single output."""
    if task == "classification":
        return lambda out, y: F.cross_entropy(out, y, weight=weight)
    if cfg.regression_loss == "huber":
        return lambda out, y: F.huber_loss(out[:, 0], y, delta=cfg.huber_delta)
    return lambda out, y: F.mse_loss(out[:, 0], y)

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
        ValueError: the checkpoint belongs to a different run (data, schema or a field of RESUME_KEYS), or has
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


def _evaluate(model: torch.nn.Module, validation: Iterable[tuple[torch.Tensor, torch.Tensor]],
              device: torch.device, loss_fn: LossFn, target: TargetEncoding) -> dict[str, float]:
    """Validation loss and accuracy (classification) or RMSE in the target's units (regression) over all ranks'
    shards (sums all-reduced, so every rank gets the same)."""
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=device)
    with torch.no_grad():
        for x, y in validation:
            out = model(x)
            hits = (out.argmax(dim=1) == y).sum() if target.classes else ((out[:, 0] - y) ** 2).sum()
            sums += torch.stack([loss_fn(out, y).double() * len(y), hits.double(),
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
        new = [self._entities.Param(k, redact_text(str(v))) for k, v in params.items() if k not in existing]
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
