"""Training on a Ray cluster: Ray Train V2's ``TorchTrainer`` around the one training code (``training.train``):

    python -m training.ray_train --data FILE --schema FILE --model-dir DIR --checkpoint-dir DIR --config FILE.json \
        --num-workers N [--cpus-per-worker C] [--max-failures F] [--address ADDR] [--name NAME] \
        [--storage-path URI] [--mlflow-run-id ID]

The driver joins the Ray cluster at ``--address`` (``ray://head:10001``, ``auto`` inside a KubeRay pod; none: a
local Ray started for this run) and runs ``N`` training workers: one GPU each when the config's ``device`` is
``cuda`` (or ``auto`` and the cluster has GPUs), else ``--cpus-per-worker`` CPUs each. ``TorchConfig`` forms the
process group (NCCL on GPUs, gloo otherwise, the config's collective timeout); each worker then trains exactly as
a torchrun rank does (features, the model plug-in, MLflow logging on rank 0, the model dir ``evaluate`` reads).
After every epoch rank 0's checkpoint goes to Ray (``ray.train.report``), which keeps it under ``--storage-path``
(Ray Train's ``storage_path``: a URI such as ``s3://bucket/prefix`` handed to Ray as is, pyarrow's filesystem taking
credentials from the ``AWS_*`` env; or a path on shared storage on a multi-node cluster; default
``--checkpoint-dir``); after a worker fails, Ray restarts the group (``FailureConfig(max_failures)``) and every
worker resumes from the newest reported checkpoint. Exit 1 with the workers' error when training failed.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Mapping

import ray
import ray.train
import ray.train.torch
from ray.train import Checkpoint, CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer

from data.ray_cluster import init_ray
from data.redaction import redact
from data.settings import MLFLOW_HTTP_DEFAULTS
from training.config import TrainingConfig
from training.train import argument_parser, train_in_process_group

WORKER_ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION",
              "KFLOOP_HOME", *MLFLOW_HTTP_DEFAULTS)
"""The driver's variables every worker gets (``runtime_env``): where MLflow and the data are, never a credential.
Ray stores a job's runtime env with the job (in its GCS, shown by its dashboard and job API), so credentials reach
the workers otherwise: on KubeRay as ``secretKeyRef`` env of their pods (``cluster.credentials_secret``,
training/launch/manifests.py), on a local Ray by inheritance from this driver, on another Ray cluster from its own
nodes' environment."""


def worker_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The :data:`WORKER_ENV` variables of ``environ``; a tracking URI carrying user info or a query (a credential)
    is left to the workers' own environment."""
    return {k: environ[k] for k in WORKER_ENV
            if k in environ and (k != "MLFLOW_TRACKING_URI" or redact(environ[k]) == environ[k])}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """``training.train``'s arguments plus the Ray job's."""
    parser = argument_parser(prog="python -m training.ray_train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-workers", type=int, required=True, help="training workers (Ray Train's num_workers)")
    parser.add_argument("--cpus-per-worker", type=int, default=1, help="CPUs Ray reserves for each worker")
    parser.add_argument("--max-failures", type=int, default=0,
                        help="worker-group restarts after a failure, each resuming from the newest checkpoint")
    parser.add_argument("--address", default="",
                        help="the Ray cluster to join (ray://HOST:10001, auto); empty: start a local Ray for this run")
    parser.add_argument("--name", default="kfloop-train", help="the run's name under --storage-path")
    parser.add_argument("--storage-path", default="",
                        help="Ray Train's storage_path: a URI (s3://bucket/prefix) or a shared path; "
                             "default --checkpoint-dir")
    args = parser.parse_args(argv)
    if args.num_workers < 1 or args.cpus_per_worker < 1 or args.max_failures < 0:
        parser.error("use --num-workers >= 1, --cpus-per-worker >= 1 and --max-failures >= 0")
    return args


def train_loop(config: dict[str, Any]) -> None:
    """One Ray Train worker: resume from Ray's newest checkpoint (copied into a folder of this worker's), train, and
    hand each epoch's metrics and rank 0's checkpoint back to Ray."""
    args = argparse.Namespace(**config)
    with tempfile.TemporaryDirectory(prefix="kfloop-ray-ckpt-") as local:
        args.checkpoint_dir = Path(local)
        if restored := ray.train.get_checkpoint():
            with restored.as_directory() as directory:
                shutil.copytree(directory, local, dirs_exist_ok=True)

        def report(metrics: dict[str, float], checkpoint_dir: Path | None) -> None:
            ray.train.report(metrics, checkpoint=Checkpoint.from_directory(checkpoint_dir) if checkpoint_dir else None)

        train_in_process_group(args, ray.train.torch.get_device(), report)


def run_config(args: argparse.Namespace, cfg: TrainingConfig) -> RunConfig:
    """The run's ``RunConfig``: its name; ``storage_path`` from ``--storage-path`` unchanged (a URI stays a URI), else
    ``--checkpoint-dir`` made absolute; restarts and the checkpoints kept."""
    return RunConfig(name=args.name, storage_path=args.storage_path or str(Path(args.checkpoint_dir).resolve()),
                     failure_config=FailureConfig(max_failures=args.max_failures),
                     checkpoint_config=CheckpointConfig(num_to_keep=cfg.checkpoint_keep))


def main(argv: list[str] | None = None) -> int:
    """Run the TorchTrainer; 0 when it trained, 1 with the error when it failed."""
    args = parse_args(argv)
    cfg = TrainingConfig.from_dict(json.loads(args.config.read_text()))
    env = worker_env(os.environ)
    init_ray(args.address, num_cpus=args.num_workers * args.cpus_per_worker, log_to_driver=True,
             runtime_env={"env_vars": {**env, "OMP_NUM_THREADS": str(cfg.threads_per_rank)}})
    use_gpu = cfg.device == "cuda" or (cfg.device == "auto" and ray.cluster_resources().get("GPU", 0) > 0)
    loop_config = {k: v for k, v in vars(args).items()
                   if k not in ("num_workers", "cpus_per_worker", "max_failures", "address", "name", "storage_path")}
    trainer = TorchTrainer(
        train_loop, train_loop_config=loop_config,
        scaling_config=ScalingConfig(num_workers=args.num_workers, use_gpu=use_gpu,
                                     resources_per_worker={"CPU": args.cpus_per_worker,
                                                           **({"GPU": 1} if use_gpu else {})}),
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo",
                                 timeout_s=cfg.collective_timeout_seconds),
        run_config=run_config(args, cfg))
    try:
        trainer.fit()
    except ray.train.TrainingFailedError as exc:
        print(f"ray_train: training failed: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
