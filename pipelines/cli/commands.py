"""The ``kfloop`` command line (also ``python -m pipelines``): the parser (its surface pinned by tests/test_cli.py)
and one handler per command. Each handler imports its own stack when it runs (torch, MLflow, Evidently and kfp
take seconds each to import), so ``kfloop --help`` and a small command stay fast."""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import traceback
from pathlib import Path

import pipelines.cli.operate as operate_cli
import pipelines.cli.options as options
import pipelines.cli.serving as serving_cli
from data.errors import EXIT_FAILED, EXIT_FINDING, EXIT_OK, UsageError
from data.settings import end_without_final_collection
from data.redaction import redact
from training.launch.cluster import JOB_KINDS as CLUSTER_KINDS

IN_CLUSTER_ENV = "KUBERNETES_SERVICE_HOST"
"""Set by the kubelet in every pod: ``kfloop serve`` without ``--host`` then uses the in-cluster KFP service."""


def build_parser() -> argparse.ArgumentParser:
    """The full CLI surface (pinned by tests/test_cli.py; every flag has help, every command a description)."""
    p = options.Parser(prog="kfloop", description="The continuous-training loop on Kubeflow.")
    p.add_argument("--version", action=_Version, help="print kfloop's version and the git commit it runs from")
    options.add_global_flags(p)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, summary: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=summary, description=summary[0].upper() + summary[1:] + ".")

    demo = command("demo", "the whole loop locally on the demo data")
    demo.add_argument("--serve", action="store_true",
                      help="also serve the champion with serve-model: the batches reach the drift checks as its "
                           "logged requests, and the summary gains a serving section")
    options.add_json(demo, "the summary")

    infer = command("infer-schema", "pandera schema YAML from a Parquet/CSV file")
    infer.add_argument("--data", required=True, help="known-good Parquet or CSV file (path or s3://, gs://, az:// "
                                                     "URI) the schema describes")
    infer.add_argument("--target", required=True, help="the column the model predicts")
    infer.add_argument("--task", choices=["classification", "regression"], default="classification",
                       help="what the target holds: classes or a number (default: %(default)s)")
    infer.add_argument("--key-column", action="append", dest="key_columns",
                       help="a unique key column: an id, never a feature (repeatable; default: the columns that look "
                            "like ids)")
    options.add_renamed(infer, "--id-column", "--key-column", dest="key_columns", append=True)
    options.add_json(infer, "the schema (YAML text) and the column roles")

    val = command("validate", "validate one dataset against a schema")
    val.add_argument("--data", required=True, help="Parquet or CSV file to check (local path or s3://, gs://, az:// "
                                                   "URI)")
    val.add_argument("--schema", required=True, help="pandera schema YAML (e.g. from kfloop infer-schema)")
    val.add_argument("--report-csv", help="also write the failures as CSV here (cells safe to open in a spreadsheet)")
    val.add_argument("--engine", choices=["local", "ray"], default="local",
                     help="who reads and checks the data: this process or Ray Data on a Ray cluster (default: "
                          "%(default)s)")
    val.add_argument("--ray-address", help="the Ray cluster of --engine ray, e.g. ray://head:10001 (default: the "
                                           "settings' drift.ray_address, else a local Ray started for the check)")
    options.add_json(val, "the verdict and every failure")
    options.add_settings(val)

    train = command("train", "train only (DDP with torchrun processes)")
    train.add_argument("--data", required=True, help="training data: Parquet or CSV file (local path or s3://, "
                                                     "gs://, az:// URI)")
    train.add_argument("--schema", required=True, help="pandera schema YAML the data must pass")
    train.add_argument("--nnodes", type=int, help="nodes: local torchrun agents or pods (default: the settings', "
                                                  "else 1)")
    train.add_argument("--nproc-per-node", type=int, help="training processes per node (default: the settings', "
                                                          "else 2; one per GPU on GPU nodes)")
    train.add_argument("--backend", choices=["local", "kubernetes", "ray"],
                       help="torchrun on this machine, a PyTorchJob/TrainJob, or Ray Train on a Ray cluster (default: "
                            "the settings', else local)")
    train.add_argument("--model-dir", help="where to write the model (default: under the workdir)")
    options.add_json(train, "the model directory and metrics")
    options.add_settings(train)

    drift = command("drift", "one drift check of a current batch against reference data")
    drift.add_argument("--reference", required=True, help="data the batch is compared with, e.g. the training "
                                                           "data (Parquet or CSV; local path or s3://, gs://, az:// "
                                                           "URI)")
    current = drift.add_mutually_exclusive_group(required=True)
    current.add_argument("--current", help="the new batch to check (Parquet or CSV; local path or s3://, gs://, "
                                           "az:// URI)")
    current.add_argument("--current-logs", help="or the rows the model served: the KServe inference logs under this "
                                                "folder or s3://, gs://, az:// prefix (the logger's storage URI, or "
                                                "serve-model --log-dir)")
    drift.add_argument("--since", help="with --current-logs: the requests logged in this window before now, e.g. "
                                       "24h, 30m, 7d (default: the settings' drift.logs_since, else 24h)")
    drift.add_argument("--schema", help="pandera schema YAML naming the features (default: the champion's, else one "
                                        "inferred from the reference); id columns are never checked")
    options.add_model(drift, "also check the drift of this registered model's champion predictions, and record "
                      "the check", required_default=False, legacy="--model-name")
    drift.add_argument("--report", help="write an HTML page here: kfloop's summary page (verdicts, scores and both "
                                        "sides' summaries) by default; Evidently's own report with --set "
                                        "drift.report=evidently_sample or evidently_full")
    drift.add_argument("--fail-on-drift", action="store_true",
                       help=f"exit {EXIT_FINDING} when the batch drifted (default: exit 0 whenever the check ran)")
    drift.add_argument("--engine", choices=["local", "ray"],
                       help="who reads and sketches the data: this process, or Ray Data on a Ray cluster (default: "
                            "the settings' drift.engine, else local)")
    drift.add_argument("--ray-address", help="the Ray cluster of --engine ray, e.g. ray://head:10001 (default: the "
                                             "settings' drift.ray_address, else a local Ray started for the check)")
    options.add_json(drift, "the verdict and per-column scores")
    options.add_settings(drift)

    quality = command("quality", "the champion's quality on rows whose labels arrived")
    options.add_model(quality)
    rows = quality.add_mutually_exclusive_group(required=True)
    rows.add_argument("--data", help="rows with the schema's features and, unless --labels, target")
    rows.add_argument("--current-logs", help="or the rows the model served: the KServe inference logs under this "
                                             "folder or object prefix (needs --labels keyed by request_id or row_id)")
    quality.add_argument("--since", help="with --current-logs: the requests logged in this window before now, e.g. "
                                         "7d (default: the settings' drift.logs_since, else 24h)")
    quality.add_argument("--labels", help="the labels, arrived separately: the id column and the target")
    quality.add_argument("--join-column", help="column joining --labels to --data (needed with --labels; with "
                                               "--current-logs: request_id by default, or row_id)")
    options.add_renamed(quality, "--id-column", "--join-column", dest="join_column")
    quality.add_argument("--evidently-report", help="also write Evidently's HTML report here")
    options.add_renamed(quality, "--report", "--evidently-report", dest="evidently_report")
    quality.add_argument("--fail-on-degraded", action="store_true",
                         help=f"exit {EXIT_FINDING} when the quality degraded (default: exit 0 whenever the check ran)")
    options.add_json(quality, "the verdict")
    options.add_settings(quality)

    run = command("run", "run a pipeline locally (kfp.local) or on a Kubeflow Pipelines server")
    run.add_argument("pipeline", choices=["training", "drift", "quality"], help="the pipeline to run")
    where = run.add_mutually_exclusive_group(required=True)
    where.add_argument("--local", action="store_true", help="kfp.local on this machine")
    _add_host(where, required=False)
    run.add_argument("--model", help="registered model the run trains or checks (sets model_name; default: the "
                                     "settings', else kfloop-model)")
    options.add_json(run, "the run's summary")
    run.add_argument("--wait", action="store_true", help="wait for the run to finish (always so with --local)")
    _add_kfp_target(run)
    _add_service_account(run)
    options.add_settings(run)

    comp = command("compile", "KFP IR YAML for every pipeline")
    comp.add_argument("--out", default="pipelines/compiled", help="folder of the YAML files (default: %(default)s)")
    options.add_json(comp, "the written files")
    comp.add_argument("--namespace", help="namespace of the training jobs the steps launch (default: "
                                           "cluster.namespace, else each step pod's own)")
    _add_compile_options(comp)

    upload = command("upload", "compile and upload every pipeline as the version of this git commit (idempotent)")
    _add_host(upload)
    _add_kfp_target(upload)
    _add_compile_options(upload)
    upload.add_argument("--require-image", action="store_true",
                        help="refuse to upload without --image or KFLOOP_IMAGE naming a non-default image (always "
                             "so when CI=true)")
    options.add_json(upload, "the pipeline and version ids")

    sched = command("schedule", "recurring drift or quality runs on the KFP server (same name replaces)")
    sched.add_argument("pipeline", choices=["drift", "quality"], help="the check to run on a schedule")
    _add_host(sched)
    _add_kfp_target(sched)
    sched.add_argument("--cron", help="6 fields, seconds first, e.g. '0 0 * * * *' (hourly)")
    sched.add_argument("--name", help="recurring run name (default: kfloop-drift-check-MODEL, "
                                      "kfloop-quality-check-MODEL: one per model, replaced by the next schedule)")
    sched.add_argument("--model", help="registered model the runs check (sets model_name; default: the settings', "
                                       "else kfloop-model)")
    action = sched.add_mutually_exclusive_group()
    action.add_argument("--disable", action="store_true", help="disable the recurring run of that name")
    action.add_argument("--delete", action="store_true", help="delete the recurring run of that name")
    options.add_json(sched, "the recurring run (always JSON)")
    _add_service_account(sched)
    options.add_settings(sched)

    serve = command("serve", "alert webhook: Alertmanager or {model, reason} -> retrain; /metrics")
    serve.add_argument("--port", type=int, default=8080, help="listen port; 0 picks a free one (default: "
                                                              "%(default)s)")
    serve.add_argument("--bind", default="0.0.0.0", help="listen address (default: %(default)s)")
    _add_host(serve, required=False, default="the in-cluster service")
    options.add_renamed(serve, "--kfp-host", "--host", dest="host")
    serve.add_argument("--local", action="store_true",
                       help="accepted alerts run the training pipeline under kfp.local on this machine (the default "
                            "when no --host is given outside a cluster)")
    serve.add_argument("--pipeline-version", help="training pipeline version to start (default: this git commit)")
    options.add_renamed(serve, "--version", "--pipeline-version", dest="pipeline_version")
    serve.add_argument("--namespace", help="Kubeflow profile namespace (multi-user)")
    serve.add_argument("--max-body-bytes", type=int, default=65536,
                       help="largest alert body accepted; larger ones get 413 (default: %(default)s)")
    serve.add_argument("--open-metrics", action="store_true",
                       help="serve /metrics without its token KFLOOP_METRICS_TOKEN (in-cluster scraping behind a "
                            "NetworkPolicy)")
    serve.add_argument("--inference-logs", help="also take KServe's payload-logger CloudEvents at POST "
                                                "/inference-logs (the logger's url) and store them as its blobs under "
                                                "this folder or s3://, gs://, az:// prefix, for drift --current-logs")
    _add_service_account(serve)
    options.add_settings(serve)

    render = command("render-job", "the training job's manifest as YAML (dry run)")
    render.add_argument("--kind", choices=list(CLUSTER_KINDS),
                        help="PyTorchJob (Training Operator v1.9), TrainJob (Trainer v2.3) or RayJob (KubeRay v1.7); "
                             "default: cluster.kind")
    render.add_argument("--nnodes", type=int, help="pods (default: the settings', else 1)")
    render.add_argument("--nproc-per-node", type=int, help="default: one per GPU (or MIG device) with GPUs")
    render.add_argument("--gpus-per-node", type=int, help="GPUs each pod requests (default: cluster.gpus_per_node)")
    render.add_argument("--run-id", help="pipeline run id the job name derives from (default: the name kfloop-train)")
    options.add_json(render, "the manifest (instead of YAML)")
    options.add_settings(render)

    bench = command("bench", "benchmarks from a source checkout (benchmarks/<name>.py)")
    bench.add_argument("name", choices=["collectives"], help="collectives: nccl-tests-style table, ceilings, gRPC")
    bench.add_argument("--nproc-per-node", type=int, default=2, help="local ranks (default: %(default)s)")
    options.add_renamed(bench, "--nproc", "--nproc-per-node", dest="nproc_per_node", type=int)
    bench.add_argument("--max-bytes", default="256M", help="largest size, e.g. 256M (default: %(default)s)")
    bench.add_argument("--out", default="benchmarks/results/collectives.json",
                       help="JSON results file (default: %(default)s)")
    operate_cli.add_parsers(command)
    serving_cli.add_parsers(command)
    for parser in sub.choices.values():
        options.add_global_flags(parser, on_subcommand=True)
    return p


class _Version(argparse.Action):
    """``kfloop --version``: the installed version and the commit of the checkout it runs from (or why there is
    none), computed only when asked."""

    def __init__(self, option_strings: list[str], dest: str, help: str) -> None:
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        from data.settings import CODE_ROOT

        print(version_line(CODE_ROOT))
        parser.exit()


def version_line(code_root: Path) -> str:
    """``kfloop VERSION (commit SHA)`` for the code in ``code_root``; the commit is ``KFLOOP_GIT_COMMIT`` (set in
    images), else the checkout's HEAD (``-dirty`` when tracked files changed), else the line says it cannot tell."""
    from importlib.metadata import PackageNotFoundError, version

    from data.settings import git_commit

    try:
        installed = version("kfloop")
    except PackageNotFoundError:
        installed = "(not installed: running from a source tree)"
    commit = os.environ.get("KFLOOP_GIT_COMMIT") or git_commit(code_root)
    where = (f"commit {commit}" if commit != "unknown" else
             f"commit unknown: {code_root} is not the top of a git checkout and KFLOOP_GIT_COMMIT is not set")
    return f"kfloop {installed} ({where})"


def _add_compile_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--image", help="container image of every step (default: KFLOOP_IMAGE, else the kfloop "
                                        "image; upload refuses a KFLOOP_IMAGE tagged for another commit)")
    parser.add_argument("--credentials-secret", help="Kubernetes Secret whose MLflow/storage keys become step env "
                                                     "(default: kfloop-mlflow)")
    parser.add_argument("--enable-caching", action="store_true",
                        help="let KFP reuse earlier step outputs (off: steps read data behind URIs and the champion)")
    parser.add_argument("--gpus", type=int, help="GPUs (nvidia.com/gpu) of the training launch step")
    parser.add_argument("--gpu-node-selector", action="append", default=[], metavar="KEY=VALUE",
                        help="node label of the training launch step (repeatable)")
    parser.add_argument("--gpu-toleration", action="append", default=[], metavar="KEY[=VALUE]:EFFECT",
                        help="toleration of the training launch step (repeatable)")
    parser.add_argument("--shared-volume-claim", metavar="NAME",
                        help="PVC mounted in every step (default: cluster.shared_volume_claim when the settings "
                             "set it)")
    parser.add_argument("--shared-mount-path", metavar="PATH",
                        help="where the steps mount it (default: cluster.shared_mount_path, else /shared)")
    parser.add_argument("--image-pull-secret", action="append", default=[], metavar="NAME",
                        help="docker-registry Secret the steps and training pods pull the image with (repeatable; "
                             "default: cluster.image_pull_secrets)")
    options.add_settings(parser)


def _compile_options(args: argparse.Namespace):
    """The compile-time Kubernetes options: the flags, else the ``cluster:`` settings for the shared volume (the
    claim is mounted only where the settings or a flag name one: a compiled default must not need a PVC);
    ``--namespace`` (upload: the profile's) is the training jobs' namespace."""
    from pipelines.kubernetes_options import KubernetesOptions

    cluster = options.settings(args).get("cluster", {})
    return KubernetesOptions.from_flags(credentials_secret=args.credentials_secret, gpus=args.gpus,
                                        node_selector=args.gpu_node_selector, tolerations=args.gpu_toleration,
                                        shared_volume_claim=args.shared_volume_claim
                                        or cluster.get("shared_volume_claim"),
                                        shared_mount_path=args.shared_mount_path or cluster.get("shared_mount_path"),
                                        enable_caching=args.enable_caching,
                                        image_pull_secrets=args.image_pull_secret
                                        or cluster.get("image_pull_secrets") or (),
                                        job_namespace=args.namespace)


def _add_host(parser: argparse.ArgumentParser | argparse._MutuallyExclusiveGroup, *, required: bool = True,
              default: str = "") -> None:
    """``--host URL``, the Kubeflow Pipelines API, the one name of it in every command."""
    parser.add_argument("--host", required=required, help="Kubeflow Pipelines API URL (token: $KFP_TOKEN or the "
                        "service-account token file)" + (f"; default: {default}" if default else ""))


def _add_kfp_target(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pipeline-version", help="pipeline version name (default: this git commit)")
    options.add_renamed(parser, "--version", "--pipeline-version", dest="pipeline_version")
    parser.add_argument("--namespace", help="Kubeflow profile namespace (multi-user)")


def _add_service_account(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--service-account", help="service account the KFP run's pods (and the training runs a "
                                                  "drift run triggers) run as (default: kfloop, made by "
                                                  "deploy/rbac.yaml)")


def cmd_demo(args: argparse.Namespace) -> int:
    from data.settings import load_environment
    from pipelines.operations.demo_loop import format_summary, run_demo

    with options.stdout_for_json(args):
        summary = run_demo(load_environment(args.workdir).workdir, serve=args.serve)
    options.print_json(summary) if args.json else print(format_summary(summary))
    return 0


def cmd_infer_schema(args: argparse.Namespace) -> int:
    from data.tables import read_table
    from data.validation import infer_schema, schema_roles, schema_to_yaml

    schema = infer_schema(read_table(args.data), target=args.target, task=args.task, id_columns=args.key_columns)
    if args.json:
        roles = schema_roles(schema)
        options.print_json({"schema": schema_to_yaml(schema), "data": redact(args.data), "target": roles.target,
                            "task": roles.task, "numeric": roles.numeric, "categorical": roles.categorical,
                            "id_columns": roles.ids})
    else:
        sys.stdout.write(schema_to_yaml(schema))
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from data.engine import DataEngine
    from data.validation import ROW_NUMBERS, load_schema, validate

    engine = DataEngine.of_policy(_drift_policy(args, options.settings(args)))  # --engine: local unless given
    if engine.engine == "ray":
        from data.ray_blocks import validate_on_ray
        from data.ray_cluster import ray_session

        with ray_session(engine.ray_address):
            report = validate_on_ray(args.data, load_schema(args.schema))
    else:
        report = validate(args.data, load_schema(args.schema))
    if args.report_csv:
        from data.fileio import atomic_write_text

        atomic_write_text(args.report_csv, report.to_csv())
    if args.json:
        options.print_json({"valid": report.ok, "data": redact(args.data), "schema": redact(args.schema),
                            "rows": report.n_rows, "row_numbers": ROW_NUMBERS, "schema_diff": report.schema_diff,
                            "failures": [{"column": f.column, "rule": f.rule, "count": f.count,
                                          "examples": f.examples, "rows": f.rows} for f in report.failures]})
        return EXIT_OK if report.ok else EXIT_FINDING
    if report.ok:
        print(f"{redact(args.data)}: valid against {redact(args.schema)}")
        return EXIT_OK
    print("\n".join(filter(None, [report.format_diff(), report.format()])), file=sys.stderr)
    return EXIT_FINDING


def cmd_train(args: argparse.Namespace) -> int:
    from data.settings import load_environment
    from pipelines.config import training_settings
    from training.config import SHAPE_PARAMETERS
    from training.steps.train import train_only

    settings = options.settings(args)
    training = training_settings(settings, **{key: getattr(args, key) for key in SHAPE_PARAMETERS})
    with options.stdout_for_json(args):
        result = train_only(data=args.data, schema=args.schema, training=training, env=load_environment(args.workdir),
                            model_dir=args.model_dir, cluster=settings.get("cluster"))
    if args.json:
        options.print_json({"model_dir": str(result.model_dir), "metrics": result.metrics})
        return 0
    print(f"model: {result.model_dir}")
    print("metrics: " + ", ".join(f"{k}={v:.4f}" for k, v in sorted(result.metrics.items())))
    return 0


def cmd_drift(args: argparse.Namespace) -> int:
    from monitoring.drift import ALL_NULL_METHOD
    from monitoring.drift_policy import score_direction
    from monitoring.steps.checks import NO_SCHEMA_SOURCE, drift_step

    if args.since and not args.current_logs:
        raise UsageError("--since is the window of --current-logs: pass --current-logs URI too, or drop --since")
    settings = options.settings(args)
    model = options.model_name(args, required_default=False)
    if model:  # only a check of the champion's predictions reads (and records to) MLflow
        options.registry_environment(args, model)
    with options.stdout_for_json(args):
        result = drift_step(current_uri=args.current or "", current_logs_uri=args.current_logs or "",
                            since=args.since or "", reference_uri=args.reference, schema_uri=args.schema or "",
                            model_name=model, policy=_drift_policy(args, settings), report_out=args.report or "",
                            target=settings.get("target", ""))
    drift = result.drift
    if args.json:
        options.print_json(result.to_dict())
    else:
        print(f"drifted: {drift.drifted} ({drift.reason})")
        print(f"schema: {result.schema_source}")
        if result.id_columns:
            how = ("named id or *_id and unique, as kfloop infer-schema finds ids" if result.schema_source ==
                   NO_SCHEMA_SOURCE else "the schema marks them as ids")
            print(f"not checked: id column(s) {', '.join(result.id_columns)} (identifiers are unique per row, so "
                  f"they always differ between batches; {how})")
        print("scores: a p-value drifts when lower than its threshold, a distance when higher or equal")
        for name, col in drift.columns.items():
            outside = drift.schema_violations.get(name)
            kind = ("share of nulls" if col.method == ALL_NULL_METHOD else
                    "p-value, lower = drift" if score_direction(col.method) == "p_value" else
                    "distance, higher = drift")
            print(f"  {name:<24} {col.method:<14} score={col.score:.4g} threshold={col.threshold} ({kind}) "
                  f"{'DRIFT' if col.drifted else 'ok'}"
                  + ("" if outside is None else f"  outside schema {outside['share']:.2%}"))
        if drift.report_path is not None:
            print(f"report: {drift.report_path}")
    return EXIT_FINDING if args.fail_on_drift and drift.drifted else EXIT_OK


def _drift_policy(args: argparse.Namespace, settings: dict) -> dict:
    """The settings' ``drift`` section with ``--engine`` and ``--ray-address`` over it."""
    flags = {"engine": args.engine, "ray_address": args.ray_address}
    return {**settings.get("drift", {}), **{key: value for key, value in flags.items() if value is not None}}


def cmd_quality(args: argparse.Namespace) -> int:
    from data.settings import activate, load_environment
    from monitoring.steps.checks import quality_step

    from monitoring.drift_policy import DriftPolicy

    if args.join_column and not args.labels:
        raise UsageError("--join-column joins --labels to --data: pass --labels FILE too, or drop --join-column")
    if args.current_logs and not args.labels:
        raise UsageError("--current-logs holds the served rows, not their labels: pass --labels FILE (with "
                         "request_id or row_id and the target)")
    if args.since and not args.current_logs:
        raise UsageError("--since is the window of --current-logs: pass --current-logs URI too, or drop --since")
    model = options.model_name(args)
    settings = options.settings(args)
    since = (args.since or DriftPolicy.from_dict(settings.get("drift", {})).logs_since) if args.current_logs else ""
    options.registry_environment(args, model)
    with options.stdout_for_json(args):
        checked = quality_step(labelled_uri=args.data or "", current_logs_uri=args.current_logs or "", since=since,
                               labels_uri=args.labels or "", id_column=args.join_column or "", model_name=model,
                               policy=settings.get("quality", {}), report_out=args.evidently_report or "")
    q = checked.quality
    code = EXIT_FINDING if args.fail_on_degraded and q.degraded else EXIT_OK
    if args.json:
        options.print_json(checked.to_dict())
        return code
    interval = ("none" if q.ci_low is None and q.ci_high is None else
                "[" + ", ".join("unbounded" if v is None else f"{v:.4f}" for v in (q.ci_low, q.ci_high)) + "]")
    print(f"verdict: {q.verdict}, degraded: {q.degraded} ({q.reason})")
    print(f"  {q.metric} {q.value:.4f} (interval {interval}) vs holdout {q.baseline:.4f}: {q.rows} rows, champion "
          f"v{checked.champion_version}" + (f", {checked.unlabelled_rows} rows without labels yet"
                                            if checked.unlabelled_rows else ""))
    print(f"  holdout uncertainty: {q.holdout_uncertainty}")
    for s in q.slices:
        score = s["skipped"] or f"{s['score']:.4f}" + ("" if s["baseline"] is None else f" vs {s['baseline']:.4f}")
        print(f"  slice {s['column']}={s['value']}: {s['rows']} rows, {score}")
    return code


def cmd_run(args: argparse.Namespace) -> int:
    from pipelines.kfp_server.runs import RunFailed, run_remote
    from pipelines.local.runs import run_pipeline

    failed = None
    settings = {**options.settings(args), **({"model_name": args.model} if args.model else {})}
    if args.namespace:  # the profile's: the training job goes there too
        settings["cluster"] = {**settings.get("cluster", {}), "namespace": args.namespace}
    with options.stdout_for_json(args):
        if args.host:
            try:
                summary = run_remote(args.pipeline, settings, args.host, version=args.pipeline_version,
                                     namespace=args.namespace, service_account=args.service_account, wait=args.wait)
            except RunFailed as exc:  # the run's fields are printed, then the error
                failed, summary = exc, exc.summary
        else:
            if args.pipeline_version or args.namespace or args.service_account:
                raise UsageError("--pipeline-version, --namespace and --service-account are for a run on the KFP "
                                 "server: use them with --host")
            summary = run_pipeline(args.pipeline, settings, workdir=args.workdir)
    if args.json:
        options.print_json(summary)
    else:
        for key, value in summary.items():
            print(f"{key}: {value}")
    if failed is not None:  # the summary on stdout is the run's record (JSON or not): the error goes to stderr only
        options.print_error("run", str(failed), hints=[], exit_code=failed.exit_code, as_json=False)
        return failed.exit_code
    return 0


def cmd_compile(args: argparse.Namespace) -> int:
    from data.settings import load_environment
    from pipelines.compile import compile_all

    image = args.image or load_environment().image or None
    paths = compile_all(Path(args.out), image=image, options=_compile_options(args))
    if args.json:
        options.print_json({"files": [str(path) for path in paths]})
    else:
        print("\n".join(map(str, paths)))
    return 0


def cmd_upload(args: argparse.Namespace) -> int:
    from pipelines.kfp_server.runs import upload_pipelines

    with options.stdout_for_json(args):
        uploaded = upload_pipelines(args.host, version=args.pipeline_version, namespace=args.namespace,
                                    image=args.image, options=_compile_options(args),
                                    require_image=args.require_image)
    if args.json:
        options.print_json(uploaded)
    for item in [] if args.json else uploaded:
        print(f"{item['pipeline']}: pipeline {item['pipeline_id']} version {item['version_name']} "
              f"({item['pipeline_version_id']}) {'created' if item['created'] else 'already uploaded'}")
    return 0


def cmd_schedule(args: argparse.Namespace) -> int:
    from pipelines.kfp_server.runs import schedule_check

    action = "delete" if args.delete else "disable" if args.disable else "schedule"
    with contextlib.redirect_stdout(sys.stderr):
        settings = {**options.settings(args), **({"model_name": args.model} if args.model else {})}
        result = schedule_check(args.pipeline, settings, args.host, cron=args.cron, name=args.name,
                                action=action, version=args.pipeline_version, namespace=args.namespace,
                                service_account=args.service_account)
    options.print_json(result)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from components.run_starters import trigger_store
    from data.settings import activate, load_environment
    from monitoring.inference_logs import InferenceLogWriter
    from monitoring.metrics import RecordsCollector, registered_models
    from monitoring.trigger import TriggerPolicy
    from monitoring.webhook import AlertScope, AlertWebhook, WebhookAuth
    from pipelines.alerts import LocalAlertRuns
    from pipelines.kfp_server.runs import alert_starter
    from training.launch.backends import BACKEND_ENV, backend_named

    if args.local and (args.host or args.pipeline_version or args.namespace or args.service_account):
        raise UsageError("--host, --pipeline-version, --namespace and --service-account are for runs on the KFP "
                         "server: drop them with --local")
    in_cluster = bool(os.environ.get(IN_CLUSTER_ENV))
    local = args.local or not (args.host or in_cluster)
    settings = options.settings(args)
    env = load_environment(args.workdir)
    activate(env)
    # where alerts start runs, and where the trigger state lives: this machine's workdir, a ConfigMap in the cluster,
    # or MLflow for KFP runs started from outside the cluster (no Kubernetes API there)
    backend = backend_named("local" if local else "kubernetes")
    cluster_api = in_cluster or os.environ.get(BACKEND_ENV) == "kubernetes"

    def store_for(model: str):
        return trigger_store(backend, model, env.workdir, cluster_api=cluster_api)

    local_runs = None
    if local:
        local_runs = LocalAlertRuns(settings, env.workdir / "alert-runs", on_done=lambda run_id, code: webhook.emit(
            "run_finished", run_id=run_id, exit_code=code, summary=str(env.workdir / "alert-runs" / f"{run_id}.json"),
            log=str(env.workdir / "alert-runs" / f"{run_id}.log")))
        start = local_runs.start
        mode = ("local: accepted alerts run the training pipeline under kfp.local on this machine"
                + ("" if args.local else " (no --host and not in a cluster)"))
    else:
        start = alert_starter(settings, host=args.host, version=args.pipeline_version, namespace=args.namespace,
                              service_account=args.service_account)
        mode = f"kfp: accepted alerts start training runs on {args.host or 'the in-cluster KFP service'}"
    policy = TriggerPolicy.from_dict(settings.get("trigger", {}))
    webhook = AlertWebhook(auth=WebhookAuth.from_env(os.environ, open_metrics=args.open_metrics),
                           scope=AlertScope(allowed_data_prefixes=policy.allowed_data_prefixes,
                                            default_dataset_uri=settings.get("dataset_uri", "")),
                           policy=policy, start=start,
                           store_for=store_for, metrics=RecordsCollector(models=registered_models, store_for=store_for),
                           inference_logs=InferenceLogWriter(args.inference_logs) if args.inference_logs else None,
                           max_body_bytes=args.max_body_bytes)
    server = webhook.server(args.port, args.bind)
    if local_runs is not None:  # a stopped server stops the training run it started, on SIGTERM as on Ctrl-C
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    webhook.emit("listening", bind=args.bind, port=server.server_address[1], mode=mode)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        if local_runs is not None:
            local_runs.close()
    return 0


def cmd_render_job(args: argparse.Namespace) -> int:
    import yaml

    from pipelines.config import training_settings
    from training.config import TrainingSection
    from training.launch.kubernetes import KubernetesSettings, in_namespace
    from training.launch.manifests import job_manifest

    # the flags are overrides of the cluster section, checked with it (NCCL settings need the flag's GPUs)
    args.overrides = [*(args.overrides or []),
                      *([f"cluster.gpus_per_node={args.gpus_per_node}"] if args.gpus_per_node is not None else []),
                      *([f"cluster.kind={args.kind}"] if args.kind is not None else [])]
    settings = options.settings(args)
    cluster_settings = dict(settings.get("cluster", {}))
    launch = KubernetesSettings.from_dict(cluster_settings)  # the cluster and the launcher's own settings
    training = training_settings({**settings, "cluster": cluster_settings}, nnodes=args.nnodes,
                                 nproc_per_node=args.nproc_per_node, backend="kubernetes")
    section = TrainingSection.from_dict(training)
    body = in_namespace(job_manifest(section.config, section.shape, launch.cluster, run_id=args.run_id),
                        launch.launcher.kubeconfig)
    options.print_json(body) if args.json else sys.stdout.write(yaml.safe_dump(body, sort_keys=False))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    script = Path(__file__).resolve().parents[2] / "benchmarks" / f"{args.name}.py"
    if not script.is_file():
        raise FileNotFoundError(f"{script} is missing: kfloop bench runs from a source checkout of kfloop; in an "
                                "image run `torchrun ... -m training.collectives` instead")
    cmd = [sys.executable, str(script), "--nproc", str(args.nproc_per_node), "--max-bytes", args.max_bytes,
           "--out", args.out]
    return subprocess.run(cmd, check=False).returncode


COMMANDS = {"demo": cmd_demo, "infer-schema": cmd_infer_schema, "validate": cmd_validate, "train": cmd_train,
            "drift": cmd_drift, "quality": cmd_quality, "run": cmd_run, "compile": cmd_compile, "upload": cmd_upload,
            "schedule": cmd_schedule, "serve": cmd_serve, "render-job": cmd_render_job, "bench": cmd_bench,
            **operate_cli.COMMANDS, **serving_cli.COMMANDS}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``kfloop`` console script; returns the exit code. Every failure ends here, in one shape:
    ``kfloop CMD: error: ...`` and a hint on stderr, and under ``--json`` also ``{"error", "hint", "exit_code"}``
    on stdout; the exit code is the error's either way."""
    argv = sys.argv[1:] if argv is None else list(argv)
    end_without_final_collection()
    parser = build_parser()
    if not argv:  # `kfloop` alone: what it can do
        parser.print_help()
        return EXIT_OK
    for each in _parsers(parser):
        each.json_errors = "--json" in argv
    args = parser.parse_args(argv)
    as_json = getattr(args, "json", False)
    try:
        return COMMANDS[args.command](args)
    except BrokenPipeError:  # the reader left early (`kfloop render-job | head`): nothing more can reach it; the
        # recipe of https://docs.python.org/3/library/signal.html#note-on-sigpipe, so exiting flushes nowhere
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILED
    except Exception as exc:  # one readable line per failure; --debug shows the trace
        from data.validation import ValidationError

        if args.debug:
            traceback.print_exc()
        error = options.as_kfloop_error(exc)
        if error is None:  # not a user error: a bug, whose trace --debug shows
            hints = [] if args.debug else ["an unexpected error: rerun with --debug for the full traceback"]
            options.print_error(args.command, f"{type(exc).__name__}: {exc}", hints=hints, exit_code=EXIT_FAILED,
                                as_json=as_json)
            return EXIT_FAILED
        if isinstance(exc, ValidationError) and not as_json:
            print(exc.report.format(), file=sys.stderr)
            return error.exit_code
        options.print_error(args.command, str(error), hints=[error.hint] if error.hint else [],
                            exit_code=error.exit_code, as_json=as_json)
        return error.exit_code


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """``parser`` and its subcommands' parsers."""
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return [parser, *(p for action in subparsers for p in action.choices.values())]


if __name__ == "__main__":
    sys.exit(main())
