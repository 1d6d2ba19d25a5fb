"""The ``kfloop`` command line (also ``python -m pipelines``): the parser (its surface pinned by tests/test_cli.py)
and one handler per command. Each handler imports its own stack when it runs (torch, MLflow, Evidently and kfp
take seconds each to import), so ``kfloop --help`` and a small command stay fast."""
from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import traceback
from pathlib import Path

import pipelines.cli.operate as operate_cli
import pipelines.cli.options as options
from data.storage import redact
from training.errors import EXIT_FAILED, KfloopError


def build_parser() -> argparse.ArgumentParser:
    """The full CLI surface (pinned by tests/test_cli.py)."""
    p = argparse.ArgumentParser(prog="kfloop", description="The continuous-training loop on Kubeflow.")
    options.add_global_flags(p)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = sub.add_parser("demo", help="the whole loop locally on the demo data")
    demo.add_argument("--json", action="store_true", help="print the summary as JSON")

    infer = sub.add_parser("infer-schema", help="pandera schema YAML from a Parquet/CSV file")
    infer.add_argument("--data", required=True)
    infer.add_argument("--target", required=True)
    infer.add_argument("--task", choices=["classification", "regression"], default="classification")
    infer.add_argument("--id-column", action="append", dest="id_columns", help="unique key column (repeatable)")

    val = sub.add_parser("validate", help="validate one dataset against a schema")
    val.add_argument("--data", required=True)
    val.add_argument("--schema", required=True)
    val.add_argument("--report-csv", help="also write the failures as CSV here (cells safe to open in a spreadsheet)")

    train = sub.add_parser("train", help="train only (DDP with torchrun processes)")
    train.add_argument("--data", required=True)
    train.add_argument("--schema", required=True)
    train.add_argument("--nnodes", type=int)
    train.add_argument("--nproc-per-node", type=int)
    train.add_argument("--backend", choices=["local", "kubernetes"])
    train.add_argument("--model-dir", help="where to write the model (default: under the workdir)")
    options.add_settings(train)

    drift = sub.add_parser("drift", help="one drift check")
    drift.add_argument("--reference", required=True)
    drift.add_argument("--current", required=True)
    drift.add_argument("--schema")
    drift.add_argument("--model-name", help="also check drift of this model's champion predictions")
    drift.add_argument("--report", help="write Evidently's HTML report here")
    drift.add_argument("--json", action="store_true")
    options.add_settings(drift)

    quality = sub.add_parser("quality", help="the champion's quality on rows whose labels arrived")
    quality.add_argument("--model", required=True, help="registered model whose champion is checked")
    quality.add_argument("--data", required=True, help="rows with the schema's features and, unless --labels, target")
    quality.add_argument("--labels", help="the labels, arrived separately: the id column and the target")
    quality.add_argument("--id-column", help="column joining --labels to --data")
    quality.add_argument("--report", help="also write Evidently's HTML report here")
    quality.add_argument("--json", action="store_true")
    options.add_settings(quality)

    run = sub.add_parser("run", help="run a pipeline")
    run.add_argument("pipeline", choices=["training", "drift", "quality"])
    where = run.add_mutually_exclusive_group(required=True)
    where.add_argument("--local", action="store_true", help="kfp.local on this machine")
    where.add_argument("--host", help="Kubeflow Pipelines API URL")
    run.add_argument("--json", action="store_true")
    run.add_argument("--wait", action="store_true", help="wait for the run to finish (always so with --local)")
    _add_kfp_target(run, host=False)
    _add_service_account(run)
    options.add_settings(run)

    comp = sub.add_parser("compile", help="KFP IR YAML for every pipeline")
    comp.add_argument("--out", default="pipelines/compiled")
    _add_compile_options(comp)

    upload = sub.add_parser("upload", help="compile and upload every pipeline as the version of this git commit "
                                           "(idempotent)")
    _add_kfp_target(upload, host=True)
    _add_compile_options(upload)
    upload.add_argument("--json", action="store_true")

    sched = sub.add_parser("schedule", help="recurring drift or quality runs on the KFP server (same name replaces)")
    sched.add_argument("pipeline", choices=["drift", "quality"])
    _add_kfp_target(sched, host=True)
    sched.add_argument("--cron", help="6 fields, seconds first, e.g. '0 0 * * * *' (hourly)")
    sched.add_argument("--name", help="recurring run name (default: kfloop-drift-check, kfloop-quality-check)")
    action = sched.add_mutually_exclusive_group()
    action.add_argument("--disable", action="store_true", help="disable the recurring run of that name")
    action.add_argument("--delete", action="store_true", help="delete the recurring run of that name")
    _add_service_account(sched)
    options.add_settings(sched)

    serve = sub.add_parser("serve", help="alert webhook: Alertmanager or {model, reason} -> retrain; /metrics")
    serve.add_argument("--port", type=int, default=8080)
    serve.add_argument("--bind", default="0.0.0.0", help="listen address (default: %(default)s)")
    serve.add_argument("--kfp-host", help="KFP API URL (default: the in-cluster service)")
    serve.add_argument("--version", help="training pipeline version to start (default: this git commit)")
    serve.add_argument("--namespace", help="Kubeflow profile namespace (multi-user)")
    serve.add_argument("--max-body-bytes", type=int, default=65536)
    serve.add_argument("--open-metrics", action="store_true",
                       help="serve /metrics without the bearer token (in-cluster scraping behind a NetworkPolicy)")
    _add_service_account(serve)
    options.add_settings(serve)

    render = sub.add_parser("render-job", help="the training job's manifest as YAML (dry run)")
    render.add_argument("--kind", choices=["pytorchjob", "trainjob"],
                        help="PyTorchJob (Training Operator v1.9) or TrainJob (Trainer v2.3); default: cluster.kind")
    render.add_argument("--nnodes", type=int)
    render.add_argument("--nproc-per-node", type=int, help="default: one per GPU (or MIG device) with GPUs")
    render.add_argument("--gpus-per-node", type=int)
    render.add_argument("--run-id", help="pipeline run id the job name derives from (default: the name kfloop-train)")
    options.add_settings(render)

    bench = sub.add_parser("bench", help="benchmarks from a source checkout (benchmarks/<name>.py)")
    bench.add_argument("name", choices=["collectives"], help="collectives: nccl-tests-style table, ceilings, gRPC")
    bench.add_argument("--nproc", type=int, default=2, help="local ranks")
    bench.add_argument("--max-bytes", default="256M", help="largest size, e.g. 256M")
    bench.add_argument("--out", default="benchmarks/results/collectives.json")
    operate_cli.add_parsers(sub)
    for command in sub.choices.values():
        options.add_global_flags(command, on_subcommand=True)
    return p


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
    options.add_settings(parser)


def _compile_options(args: argparse.Namespace):
    """The compile-time Kubernetes options: the flags, else the ``cluster:`` settings for the shared volume (the
    claim is mounted only where the settings or a flag name one: a compiled default must not need a PVC)."""
    from pipelines.kubernetes_options import KubernetesOptions

    cluster = options.settings(args).get("cluster", {})
    return KubernetesOptions.from_flags(credentials_secret=args.credentials_secret, gpus=args.gpus,
                                        node_selector=args.gpu_node_selector, tolerations=args.gpu_toleration,
                                        shared_volume_claim=args.shared_volume_claim
                                        or cluster.get("shared_volume_claim"),
                                        shared_mount_path=args.shared_mount_path or cluster.get("shared_mount_path"),
                                        enable_caching=args.enable_caching)


def _add_kfp_target(parser: argparse.ArgumentParser, *, host: bool) -> None:
    if host:
        parser.add_argument("--host", required=True, help="Kubeflow Pipelines API URL (token: $KFP_TOKEN or the "
                                                          "service-account token file)")
    parser.add_argument("--version", help="pipeline version name (default: this git commit)")
    parser.add_argument("--namespace", help="Kubeflow profile namespace (multi-user)")


def _add_service_account(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--service-account", help="service account the KFP run's pods (and the training runs a "
                                                  "drift run triggers) run as; default: the server's")


def cmd_demo(args: argparse.Namespace) -> int:
    from pipelines.operations.demo_loop import format_summary, run_demo
    from training.settings import load_environment

    with options.stdout_for_json(args):
        summary = run_demo(load_environment(args.workdir).workdir)
    options.print_json(summary) if args.json else print(format_summary(summary))
    return 0


def cmd_infer_schema(args: argparse.Namespace) -> int:
    from data.tables import read_table
    from data.validation import infer_schema, schema_to_yaml

    schema = infer_schema(read_table(args.data), target=args.target, task=args.task, id_columns=args.id_columns)
    sys.stdout.write(schema_to_yaml(schema))
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from data.validation import load_schema, validate

    report = validate(args.data, load_schema(args.schema))
    if args.report_csv:
        from training.fileio import atomic_write_text

        atomic_write_text(args.report_csv, report.to_csv())
    if report.ok:
        print(f"{redact(args.data)}: valid against {redact(args.schema)}")
        return 0
    print("\n".join(filter(None, [report.format_diff(), report.format()])), file=sys.stderr)
    return EXIT_FAILED


def cmd_train(args: argparse.Namespace) -> int:
    from pipelines.config import training_settings
    from training.config import SHAPE_PARAMETERS
    from training.settings import load_environment
    from training.steps import train_only

    settings = options.settings(args)
    training = training_settings(settings, **{key: getattr(args, key) for key in SHAPE_PARAMETERS})
    result = train_only(data=args.data, schema=args.schema, training=training, env=load_environment(args.workdir),
                        model_dir=args.model_dir, cluster=settings.get("cluster"))
    print(f"model: {result.model_dir}")
    print("metrics: " + ", ".join(f"{k}={v:.4f}" for k, v in sorted(result.metrics.items())))
    return 0


def cmd_drift(args: argparse.Namespace) -> int:
    from monitoring.steps import drift_step
    from training.settings import activate, load_environment

    activate(load_environment(args.workdir))
    settings = options.settings(args)
    with options.stdout_for_json(args):
        result = drift_step(current_uri=args.current, reference_uri=args.reference, schema_uri=args.schema or "",
                            model_name=args.model_name or "", policy=settings.get("drift", {}),
                            report_out=args.report or "", target=settings.get("target", ""))
    if args.json:
        options.print_json(result.to_dict())
    else:
        drift = result.drift
        print(f"schema: {result.schema_source}")
        print(f"drifted: {drift.drifted} ({drift.reason})")
        for name, col in drift.columns.items():
            outside = drift.schema_violations.get(name)
            print(f"  {name:<24} {col.method:<14} score={col.score:.4g} threshold={col.threshold} "
                  f"{'DRIFT' if col.drifted else 'ok'}"
                  + ("" if outside is None else f"  outside schema {outside['share']:.2%}"))
    return 0


def cmd_quality(args: argparse.Namespace) -> int:
    from monitoring.steps import quality_step
    from training.settings import activate, load_environment

    if args.id_column and not args.labels:
        raise ValueError("--id-column joins --labels to --data: pass --labels FILE too, or drop --id-column")
    activate(load_environment(args.workdir))
    with options.stdout_for_json(args):
        checked = quality_step(labelled_uri=args.data, labels_uri=args.labels or "", id_column=args.id_column or "",
                               model_name=args.model, policy=options.settings(args).get("quality", {}),
                               report_out=args.report or "")
    if args.json:
        options.print_json(checked.to_dict())
        return 0
    q = checked.quality
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
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from pipelines.kfp_server.runs import RunFailed, run_remote
    from pipelines.local.runs import run_pipeline

    failed = None
    with options.stdout_for_json(args):
        if args.host:
            try:
                summary = run_remote(args.pipeline, options.settings(args), args.host, version=args.version,
                                     namespace=args.namespace, service_account=args.service_account, wait=args.wait)
            except RunFailed as exc:  # the run's fields are printed, then the error
                failed, summary = exc, exc.summary
        else:
            if args.version or args.namespace or args.service_account:
                raise ValueError("--version, --namespace and --service-account are for a run on the KFP server: use "
                                 "them with --host")
            summary = run_pipeline(args.pipeline, options.settings(args), workdir=args.workdir)
    if args.json:
        options.print_json(summary)
    else:
        for key, value in summary.items():
            print(f"{key}: {value}")
    if failed is not None:
        raise failed
    return 0


def cmd_compile(args: argparse.Namespace) -> int:
    from pipelines.compile import compile_all
    from training.settings import load_environment

    image = args.image or load_environment().image or None
    for path in compile_all(Path(args.out), image=image, options=_compile_options(args)):
        print(path)
    return 0


def cmd_upload(args: argparse.Namespace) -> int:
    from pipelines.kfp_server.runs import upload_pipelines

    with options.stdout_for_json(args):
        uploaded = upload_pipelines(args.host, version=args.version, namespace=args.namespace, image=args.image,
                                    options=_compile_options(args))
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
        result = schedule_check(args.pipeline, options.settings(args), args.host, cron=args.cron, name=args.name,
                                action=action, version=args.version, namespace=args.namespace,
                                service_account=args.service_account)
    options.print_json(result)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    import os

    from monitoring.metrics import RecordsCollector, registered_models
    from monitoring.trigger import TriggerPolicy
    from monitoring.webhook import AlertWebhook, WebhookAuth
    from pipelines.kfp_server.runs import alert_starter
    from training.launch.backends import backend_named
    from training.settings import activate, load_environment

    env = load_environment(args.workdir)
    activate(env)
    backend = backend_named("kubernetes")  # alerts start runs on the KFP server; their state lives in MLflow
    settings = options.settings(args)

    def store_for(model: str):
        return backend.trigger_store(model, env.workdir)

    webhook = AlertWebhook(auth=WebhookAuth.from_env(os.environ, open_metrics=args.open_metrics),
                           policy=TriggerPolicy.from_dict(settings.get("trigger", {})),
                           start=alert_starter(settings, host=args.kfp_host, version=args.version,
                                               namespace=args.namespace, service_account=args.service_account),
                           store_for=store_for, metrics=RecordsCollector(models=registered_models, store_for=store_for),
                           max_body_bytes=args.max_body_bytes)
    server = webhook.server(args.port, args.bind)
    webhook.emit("listening", bind=args.bind, port=server.server_address[1])
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def cmd_render_job(args: argparse.Namespace) -> int:
    import yaml

    from pipelines.config import training_settings
    from training.config import TrainingSection
    from training.launch.kubernetes import KubernetesSettings
    from training.launch.manifests import job_manifest

    settings = options.settings(args)
    cluster_settings = dict(settings.get("cluster", {}))
    if args.gpus_per_node is not None:
        cluster_settings["gpus_per_node"] = args.gpus_per_node
    if args.kind is not None:
        cluster_settings["kind"] = args.kind
    cluster = KubernetesSettings.from_dict(cluster_settings).cluster  # the launcher's own settings aside
    training = training_settings({**settings, "cluster": cluster_settings}, nnodes=args.nnodes,
                                 nproc_per_node=args.nproc_per_node, backend="kubernetes")
    section = TrainingSection.from_dict(training)
    body = job_manifest(section.config, section.shape, cluster, run_id=args.run_id)
    sys.stdout.write(yaml.safe_dump(body, sort_keys=False))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    script = Path(__file__).resolve().parents[2] / "benchmarks" / f"{args.name}.py"
    if not script.is_file():
        raise FileNotFoundError(f"{script} is missing: kfloop bench runs from a source checkout of kfloop; in an "
                                "image run `torchrun ... -m training.collectives` instead")
    cmd = [sys.executable, str(script), "--nproc", str(args.nproc), "--max-bytes", args.max_bytes, "--out", args.out]
    return subprocess.run(cmd, check=False).returncode


COMMANDS = {"demo": cmd_demo, "infer-schema": cmd_infer_schema, "validate": cmd_validate, "train": cmd_train,
            "drift": cmd_drift, "quality": cmd_quality, "run": cmd_run, "compile": cmd_compile, "upload": cmd_upload,
            "schedule": cmd_schedule, "serve": cmd_serve, "render-job": cmd_render_job, "bench": cmd_bench,
            **operate_cli.COMMANDS}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``kfloop`` console script; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except Exception as exc:  # one readable line per failure; --debug shows the trace
        from data.validation import ValidationError

        if args.debug:
            traceback.print_exc()
        if isinstance(exc, ValidationError):
            print(exc.report.format(), file=sys.stderr)
            return exc.exit_code
        print(f"kfloop {args.command}: error: {exc}", file=sys.stderr)
        if isinstance(exc, KfloopError) and exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
        if not args.debug:
            print("hint: rerun with --debug for the full traceback", file=sys.stderr)
        return exc.exit_code if isinstance(exc, KfloopError) else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
