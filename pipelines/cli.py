"""The ``kfloop`` command line (also ``python -m pipelines``). Contract: ../shared/DESIGN.md, "CLI contract"."""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import traceback
from pathlib import Path
from typing import Any

EXIT_FAILED = 1
"""Validation failures, a failed pipeline run or training launch."""
EXIT_DATA_FILE = 3
"""The data file itself is unusable (missing, empty, truncated, undecodable...); 2 is argparse's usage error."""


def build_parser() -> argparse.ArgumentParser:
    """The full CLI surface (pinned by tests/test_cli.py)."""
    p = argparse.ArgumentParser(prog="kfloop", description="The continuous-training loop on Kubeflow.")
    p.add_argument("--workdir", help="state root (default: $KFLOOP_HOME or ./.kfloop)")
    p.add_argument("--debug", action="store_true", help="show full tracebacks")
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

    train = sub.add_parser("train", help="train only (DDP with torchrun processes)")
    train.add_argument("--data", required=True)
    train.add_argument("--schema", required=True)
    train.add_argument("--nnodes", type=int)
    train.add_argument("--nproc-per-node", type=int)
    train.add_argument("--backend", choices=["local", "kubernetes"])
    train.add_argument("--model-dir", help="where to write the model (default: under the workdir)")
    _add_settings(train)

    drift = sub.add_parser("drift", help="one drift check")
    drift.add_argument("--reference", required=True)
    drift.add_argument("--current", required=True)
    drift.add_argument("--schema")
    drift.add_argument("--model-name", help="also check drift of this model's champion predictions")
    drift.add_argument("--report", help="write Evidently's HTML report here")
    drift.add_argument("--json", action="store_true")
    _add_settings(drift)

    run = sub.add_parser("run", help="run a pipeline")
    run.add_argument("pipeline", choices=["training", "drift"])
    where = run.add_mutually_exclusive_group(required=True)
    where.add_argument("--local", action="store_true", help="kfp.local on this machine")
    where.add_argument("--host", help="Kubeflow Pipelines API URL")
    run.add_argument("--json", action="store_true")
    run.add_argument("--wait", action="store_true", help="wait for the run to finish (always so with --local)")
    _add_settings(run)

    comp = sub.add_parser("compile", help="KFP IR YAML for both pipelines")
    comp.add_argument("--out", default="pipelines/compiled")
    comp.add_argument("--image", help="container image of every step")
    return p


def _add_settings(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="settings file (default: ./kfloop.yaml when present)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                        help="override a setting, e.g. --set dataset_uri=data.csv --set training.epochs=5")


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    from training.settings import load_config_file, merge, parse_overrides

    return merge(load_config_file(args.config), parse_overrides(args.overrides))


def _stdout_for_json(args: argparse.Namespace):
    """Under ``--json`` stdout carries only the JSON: whatever the work prints goes to stderr instead."""
    return contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext()


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True, default=str))


def cmd_demo(args: argparse.Namespace) -> int:
    from pipelines.demo import format_summary, run_demo
    from training.settings import load_environment

    with _stdout_for_json(args):
        summary = run_demo(load_environment(args.workdir).workdir)
    _print_json(summary) if args.json else print(format_summary(summary))
    return 0


def cmd_infer_schema(args: argparse.Namespace) -> int:
    from training.validation import infer_schema, read_table, schema_to_yaml

    schema = infer_schema(read_table(args.data), target=args.target, task=args.task, id_columns=args.id_columns)
    sys.stdout.write(schema_to_yaml(schema))
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from training.validation import load_schema, validate

    report = validate(args.data, load_schema(args.schema))
    if report.ok:
        print(f"{args.data}: valid against {args.schema}")
        return 0
    print(report.format(), file=sys.stderr)
    return EXIT_FAILED


def cmd_train(args: argparse.Namespace) -> int:
    from training.settings import load_environment
    from training.steps import train_only

    settings = _settings(args)
    training = dict(settings.get("training", {}))
    for key in ("nnodes", "nproc_per_node", "backend"):
        if getattr(args, key) is not None:
            training[key] = getattr(args, key)
    result = train_only(data=args.data, schema=args.schema, training=training, env=load_environment(args.workdir),
                        model_dir=args.model_dir)
    print(f"model: {result.model_dir}")
    print("metrics: " + ", ".join(f"{k}={v:.4f}" for k, v in sorted(result.metrics.items())))
    return 0


def cmd_drift(args: argparse.Namespace) -> int:
    from monitoring.steps import drift_step
    from training.settings import activate, load_environment

    activate(load_environment(args.workdir))
    with _stdout_for_json(args):
        result = drift_step(current_uri=args.current, reference_uri=args.reference, schema_uri=args.schema or "",
                            model_name=args.model_name or "", policy=_settings(args).get("drift", {}),
                            report_out=args.report or "")
    if args.json:
        _print_json(result.to_dict())
    else:
        drift = result.drift
        print(f"drifted: {drift.drifted} (share of drifted columns {drift.share_drifted_columns:.2f})")
        for name, col in drift.columns.items():
            print(f"  {name:<24} {col.method:<14} score={col.score:.4g} threshold={col.threshold} "
                  f"{'DRIFT' if col.drifted else 'ok'}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from pipelines.runs import run_pipeline

    if args.host:
        raise ValueError("--host (the Kubeflow Pipelines API) is not available in this release; use --local")
    with _stdout_for_json(args):
        summary = run_pipeline(args.pipeline, _settings(args), workdir=args.workdir)
    if args.json:
        _print_json(summary)
    else:
        for key, value in summary.items():
            print(f"{key}: {value}")
    return 0


def cmd_compile(args: argparse.Namespace) -> int:
    from pipelines.compile import compile_all

    for path in compile_all(Path(args.out), image=args.image):
        print(path)
    return 0


COMMANDS = {"demo": cmd_demo, "infer-schema": cmd_infer_schema, "validate": cmd_validate, "train": cmd_train,
            "drift": cmd_drift, "run": cmd_run, "compile": cmd_compile}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``kfloop`` console script; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except Exception as exc:  # one readable line per failure; --debug shows the trace
        from pipelines.local import PipelineFailed
        from training.validation import DataFileError, ValidationError

        if args.debug:
            traceback.print_exc()
        if isinstance(exc, ValidationError):
            print(exc.report.format(), file=sys.stderr)
            return EXIT_FAILED
        print(f"kfloop {args.command}: error: {exc}", file=sys.stderr)
        if not args.debug:
            print("hint: rerun with --debug for the full traceback", file=sys.stderr)
        file_problem = isinstance(exc, DataFileError) or (
            isinstance(exc, PipelineFailed) and exc.message.startswith(DataFileError.__name__))
        return EXIT_DATA_FILE if file_problem else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
