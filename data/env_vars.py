"""Every environment variable kfloop reads, with who sets it and what it does: the one table the docs' environment
reference is generated from (``docs/generate.py``) and ``tests/test_env_vars.py`` checks the code against."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

SetBy = Literal["you", "kfloop", "Kubeflow Pipelines", "Kubernetes", "the training operator or torchrun", "CI", "the image"]


@dataclass(frozen=True, slots=True)
class EnvVar:
    """One environment variable."""

    name: str
    set_by: SetBy
    """Who sets it: ``you`` (a user or a deployment), or the system that gives it to kfloop's processes."""
    description: str
    """What kfloop does with it, in one or two sentences."""
    read_by_kfloop: bool = True
    """False for a standard variable kfloop only passes on or documents (a library it uses reads it)."""


ENV_VARS: tuple[EnvVar, ...] = (
    EnvVar("KFLOOP_HOME", "you", "The workdir (state: MLflow's SQLite database, artifacts, kfp.local's pipeline "
           "root, locks) when `--workdir` is not given; else `./.kfloop`. kfloop exports it to the steps it starts."),
    EnvVar("MLFLOW_TRACKING_URI", "you", "The MLflow tracking server and registry; unset: "
           "`sqlite:///<workdir>/mlflow.db`. Set it in the `kfloop-mlflow` Secret on a cluster."),
    EnvVar("KFLOOP_GIT_COMMIT", "you", "The commit of the running code (the lineage's `git_commit`); the image "
           "sets it at build time (`deploy/Dockerfile`'s `GIT_COMMIT`), else `git rev-parse HEAD`."),
    EnvVar("KFLOOP_IMAGE", "you", "On a CI runner: the step image `kfloop compile` and `upload` put in every step "
           "(the image CI built for this commit). In a step: the step's own image, the training job's default."),
    EnvVar("KFLOOP_TORCH_BUILD", "the image", "The torch build the image holds, `cpu` or `cuda` (`deploy/Dockerfile`'s "
           "`VARIANT`, also its label `io.kfloop.torch-build`): the launcher refuses GPU jobs on its own image "
           "when it says `cpu`."),
    EnvVar("KFLOOP_IMAGE_PULL_SECRETS", "kfloop", "Comma-separated image pull secrets of the step pod "
           "(`kfloop compile --image-pull-secret`), passed on to the training job it launches."),
    EnvVar("KFLOOP_JOB_NAMESPACE", "kfloop", "The training jobs' namespace, set on every compiled step by "
           "`kfloop compile|upload|run --namespace`; `cluster.namespace` wins over it; neither: the step pod's own."),
    EnvVar("KFLOOP_BACKEND", "you", "`local` or `kubernetes`: where a process's steps act (promotion lock, "
           "trigger store); unset: `kubernetes` in a KFP step pod, else `local`."),
    EnvVar("KFLOOP_LEASE_NAMESPACE", "you", "Namespace of the promotion lock's Lease; unset: the pod's own "
           "namespace (outside a pod the kubeconfig's, else `default`)."),
    EnvVar("KFLOOP_NAMESPACE_FILE", "you", "Another path of the service account's namespace file "
           "(`/var/run/secrets/kubernetes.io/serviceaccount/namespace`); tests use it."),
    EnvVar("KFLOOP_LAUNCH_ID", "kfloop", "A tag on every process a local training launch starts, so an interrupted "
           "launch stops all of them."),
    EnvVar("KFLOOP_WEBHOOK_TOKEN", "you", "`kfloop serve`: the bearer token `/alerts` requires (Alertmanager's "
           "`http_config.authorization`)."),
    EnvVar("KFLOOP_WEBHOOK_HMAC_SECRET", "you", "`kfloop serve`: the key of the HMAC-SHA256 signature `/alerts` "
           "accepts instead of the token."),
    EnvVar("KFLOOP_METRICS_TOKEN", "you", "`kfloop serve`: the bearer token `/metrics` requires (unless "
           "`--open-metrics`)."),
    EnvVar("KFP_TOKEN", "you", "A bearer token for the Kubeflow Pipelines API (`--host`); none for standalone KFP."),
    EnvVar("KFP_COOKIES", "you", "Cookies for the Kubeflow Pipelines API behind a login (Dex, OAuth2 proxy)."),
    EnvVar("KF_PIPELINES_SA_TOKEN_PATH", "you", "The KFP SDK's path of the projected service-account token "
           "(default `/var/run/secrets/kubeflow/pipelines/token`), read in a pod when `KFP_TOKEN` is unset."),
    EnvVar("KF_PIPELINES_ENDPOINT", "you", "The KFP SDK's variable for the API endpoint, used where `--host` is "
           "not given (the trigger step, `kfloop serve`); else the in-cluster service `kfp.host`."),
    EnvVar("CI", "CI", "`true` on a CI runner (GitHub Actions and most CI systems): `kfloop upload` then refuses "
           "the default image."),
    EnvVar("KFP_POD_NAME", "Kubeflow Pipelines", "The step pod's name: its presence makes a step act on the cluster "
           "(see `KFLOOP_BACKEND`)."),
    EnvVar("_KFP_RUNTIME", "Kubeflow Pipelines", "`true` in every step's process: the workdir is then the "
           "pipeline workspace, or a fresh temp dir; the trigger's local runs do not inherit it."),
    EnvVar("KUBERNETES_SERVICE_HOST", "Kubernetes", "Set in every pod: `kfloop serve` there uses the in-cluster "
           "KFP service."),
    EnvVar("KUBECONFIG", "you", "The kubeconfig outside a pod (its first path), for the launcher and the lock."),
    EnvVar("NVIDIA_VISIBLE_DEVICES", "Kubernetes", "The GPUs (or MIG devices) the device plugin gave the pod; each "
           "rank pins one."),
    EnvVar("MLFLOW_TRACKING_USERNAME", "you", "Basic auth of the MLflow server (with `MLFLOW_TRACKING_PASSWORD`); "
           "read by MLflow, passed to training pods from the credentials Secret.", read_by_kfloop=False),
    EnvVar("MLFLOW_TRACKING_PASSWORD", "you", "Basic auth password of the MLflow server; never printed.",
           read_by_kfloop=False),
    EnvVar("MLFLOW_TRACKING_TOKEN", "you", "A bearer token for the MLflow server; never printed.",
           read_by_kfloop=False),
    EnvVar("MLFLOW_S3_ENDPOINT_URL", "you", "MLflow's S3-compatible artifact endpoint (MinIO); passed to Ray "
           "workers.", read_by_kfloop=False),
    EnvVar("AWS_ENDPOINT_URL", "you", "The S3-compatible endpoint of `s3://` data; passed to Ray workers.",
           read_by_kfloop=False),
    EnvVar("AWS_ACCESS_KEY_ID", "you", "S3 credentials (with `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`); "
           "never printed: messages redact them.", read_by_kfloop=False),
    EnvVar("AWS_SECRET_ACCESS_KEY", "you", "S3 secret key.", read_by_kfloop=False),
    EnvVar("AWS_SESSION_TOKEN", "you", "S3 session token.", read_by_kfloop=False),
    EnvVar("AWS_DEFAULT_REGION", "you", "S3 region.", read_by_kfloop=False),
    EnvVar("GOOGLE_APPLICATION_CREDENTIALS", "you", "`gs://` credentials (a service-account key file), read by "
           "gcsfs.", read_by_kfloop=False),
    EnvVar("AZURE_STORAGE_CONNECTION_STRING", "you", "`az://` credentials, read by adlfs (or "
           "`AZURE_STORAGE_ACCOUNT_NAME` with `AZURE_STORAGE_ACCOUNT_KEY`).", read_by_kfloop=False),
    EnvVar("MLFLOW_HTTP_REQUEST_TIMEOUT", "you", "Seconds per MLflow REST call; kfloop's default 30 unless set.",
           read_by_kfloop=False),
    EnvVar("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "you", "Retries of an MLflow REST call; kfloop's default 3 unless "
           "set.", read_by_kfloop=False),
    EnvVar("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "you", "Backoff between those retries; kfloop's default 1 unless "
           "set.", read_by_kfloop=False),
    EnvVar("MLFLOW_ENABLE_TELEMETRY", "you", "kfloop sets `false` unless set: MLflow sends no usage data."),
    EnvVar("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "you", "kfloop sets `false` unless set: no progress bars in "
           "step logs."),
    EnvVar("DVC_NO_ANALYTICS", "you", "kfloop sets `1` unless set: DVC sends no usage data."),
    EnvVar("PYTHONUNBUFFERED", "the training operator or torchrun", "Set to 1 in every training pod.",
           read_by_kfloop=False),
    EnvVar("PATH", "you", "`kfloop demo` puts the running Python's `bin` first, so `dvc repro` runs from the same "
           "environment."),
    EnvVar("MASTER_ADDR", "the training operator or torchrun", "The rendezvous host (the master pod)."),
    EnvVar("PET_MASTER_ADDR", "the training operator or torchrun", "torchrun's `--master-addr`.",
           read_by_kfloop=False),
    EnvVar("MASTER_PORT", "the training operator or torchrun", "The rendezvous port."),
    EnvVar("PET_MASTER_PORT", "the training operator or torchrun", "torchrun's `--master-port`.",
           read_by_kfloop=False),
    EnvVar("WORLD_SIZE", "the training operator or torchrun", "The number of training processes."),
    EnvVar("RANK", "the training operator or torchrun", "The process's rank (in a pod before torchrun: the node's)."),
    EnvVar("LOCAL_RANK", "the training operator or torchrun", "The process's rank on its node (torchrun)."),
    EnvVar("LOCAL_WORLD_SIZE", "the training operator or torchrun", "The processes on this node (torchrun)."),
    EnvVar("PET_NODE_RANK", "the training operator or torchrun", "torchrun's `--node-rank`.", read_by_kfloop=False),
    EnvVar("PET_NPROC_PER_NODE", "the training operator or torchrun", "torchrun's `--nproc-per-node`.",
           read_by_kfloop=False),
    EnvVar("PET_NNODES", "the training operator or torchrun", "torchrun's `--nnodes`.", read_by_kfloop=False),
    EnvVar("PET_MAX_RESTARTS", "the training operator or torchrun", "torchrun's `--max-restarts` (kfloop sets it "
           "from `training.max_restarts` where the operator does not).", read_by_kfloop=False),
    EnvVar("TORCHELASTIC_USE_AGENT_STORE", "the training operator or torchrun", "`True` when torchrun's agent "
           "hosts the store the ranks join."),
    EnvVar("TORCHELASTIC_RESTART_COUNT", "the training operator or torchrun", "How many times torchrun restarted "
           "the ranks: the MLflow run's `kfloop.restarts` tag."),
)
"""Every variable, in the order the reference page lists them within each group."""
