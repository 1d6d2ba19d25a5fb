"""The operating commands of ``kfloop``: status, history, rollback, reproduce, report (parsers and handlers;
the work is in :mod:`pipelines.operations.status`, :mod:`pipelines.operations.report` and :mod:`training.reproduce`).
As in :mod:`pipelines.cli.commands`, which imports this module, each handler imports its stack (MLflow, torch, DVC)
when it runs, so ``kfloop --help`` stays fast."""
from __future__ import annotations

import argparse

import pipelines.cli.options as options
from data.settings import CODE_ROOT, DEFAULT_MODEL_NAME, activate, load_environment
from training.progress import activity


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add the operating subcommands to ``kfloop``'s subparsers."""
    status = sub.add_parser("status", help="champion, last drift and quality checks, trigger cooldown, recent runs")
    _model(status)
    status.add_argument("--json", action="store_true")
    options.add_settings(status)

    history = sub.add_parser("history", help="every version and every move of champion")
    _model(history)
    history.add_argument("--json", action="store_true")

    rollback = sub.add_parser("rollback", help="move champion back (default: to the champion it replaced)")
    _model(rollback)
    rollback.add_argument("--to", help="version to make champion")
    rollback.add_argument("--reason", required=True, help="why; recorded in the champion history")
    rollback.add_argument("--json", action="store_true")

    reproduce = sub.add_parser("reproduce", help="retrain a version from its lineage on CPU and compare")
    reproduce.add_argument("model")
    reproduce.add_argument("version")
    reproduce.add_argument("--json", action="store_true")
    options.add_settings(reproduce)

    report = sub.add_parser("report", help="one self-contained HTML page of the model's history, drift and quality")
    _model(report)
    report.add_argument("--out", required=True, help="HTML file to write")


def _model(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=DEFAULT_MODEL_NAME, help="registered model (default: %(default)s)")


def _env(args: argparse.Namespace):
    env = load_environment(args.workdir)
    activate(env)
    return env


def cmd_status(args: argparse.Namespace) -> int:
    from pipelines.operations.status import format_status, status

    result = status(args.model, env=_env(args), trigger_policy=options.settings(args).get("trigger", {}))
    options.print_json(result) if args.json else print(format_status(result))
    return 0


def cmd_history(args: argparse.Namespace) -> int:
    from pipelines.operations.status import format_history, history

    result = history(args.model, env=_env(args))
    options.print_json(result) if args.json else print(format_history(result))
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    from pipelines.operations.status import rollback_champion

    result = rollback_champion(args.model, to=args.to, reason=args.reason, env=_env(args))
    if args.json:
        options.print_json(result)
    else:
        print(f"{args.model}: champion v{result['previous_champion']} -> v{result['champion_version']} "
              f"({result['reason']})")
    return 0


def cmd_reproduce(args: argparse.Namespace) -> int:
    from data.dvc_store import DataStoreConfig
    from training.reproduce import reproduce
    env = _env(args)
    configured = options.settings(args)
    data_store = DataStoreConfig.from_dict(configured.get("data_store")).url(env.workdir)
    with options.stdout_for_json(args), activity(f"reproducing {args.model} v{args.version}", quiet=args.json):
        result = reproduce(args.model, args.version, workdir=env.workdir, current_commit=env.git_commit,
                           repo_root=CODE_ROOT, holdout_fraction=configured.get("holdout_fraction"),
                           split_seed=configured.get("seed"), data_store=data_store)
    if args.json:
        options.print_json(result.to_dict())
    else:
        print(f"{args.model} v{args.version}: {'IDENTICAL' if result.identical else 'DIFFERENT'} "
              f"(data {result.data_md5} from {result.data_source}, commit {result.git_commit}, seed {result.seed}, "
              f"{result.world_size} rank(s) on CPU)")
        print(f"  weights sha256 recorded {result.weights_sha256['recorded']}")
        print(f"                 rebuilt  {result.weights_sha256['reproduced']}")
        for name, m in result.metrics.items():
            print(f"  {name:<22} recorded {m['recorded']:.6f}  rebuilt {m['reproduced']:.6f}")
        if result.differing_tensors:
            print(f"  differing tensors: {', '.join(result.differing_tensors)}")
    return 0 if result.identical else 1


def cmd_report(args: argparse.Namespace) -> int:
    from monitoring.records import drift_checks, quality_checks
    from pipelines.operations.status import history, status
    from pipelines.operations.report import write_report

    env = _env(args)
    path = write_report(args.out, model_name=args.model, history=history(args.model, env=env),
                        drift=drift_checks(args.model), quality=quality_checks(args.model),
                        status=status(args.model, env=env, trigger_policy={}))
    print(path)
    return 0


COMMANDS = {"status": cmd_status, "history": cmd_history, "rollback": cmd_rollback, "reproduce": cmd_reproduce,
            "report": cmd_report}
