"""The operating commands of ``kfloop``: status, history, rollback, reproduce, report (parsers and handlers;
the work is in :mod:`pipelines.operations.status`, :mod:`pipelines.operations.report` and :mod:`training.reproduce`).
As in :mod:`pipelines.cli.commands`, which imports this module, each handler imports its stack (MLflow, torch, DVC)
when it runs, so ``kfloop --help`` stays fast."""
from __future__ import annotations

import argparse
from collections.abc import Callable

import pipelines.cli.options as options
from data.errors import EXIT_FINDING, EXIT_OK
from data.settings import CODE_ROOT
from training.progress import activity


def add_parsers(command: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """Add the operating subcommands through ``command(name, one-line description)``, which makes a subparser."""
    status = command("status", "champion, last drift and quality checks, trigger cooldown, recent runs")
    options.add_model(status)
    options.add_json(status)
    options.add_settings(status)

    history = command("history", "every version and every move of champion")
    options.add_model(history)
    options.add_json(history)
    options.add_settings(history)

    rollback = command("rollback", "move champion back (default: to the champion it replaced), and its traffic on "
                                   "KServe with serving.rollout")
    options.add_model(rollback)
    rollback.add_argument("--to", help="version to make champion")
    rollback.add_argument("--reason", required=True, help="why; recorded in the champion history")
    options.add_json(rollback)
    options.add_settings(rollback)

    reproduce = command("reproduce", "retrain a version from its lineage on CPU and compare")
    reproduce.add_argument("legacy_model", nargs="?", metavar="MODEL", help=options.HIDDEN)  # `reproduce MODEL VERSION`
    reproduce.add_argument("version", help="the model version to retrain")
    options.add_model(reproduce)
    options.add_json(reproduce)
    options.add_settings(reproduce)

    report = command("report", "one self-contained HTML page of the model's history, drift and quality")
    options.add_model(report)
    report.add_argument("--out", required=True, help="HTML file to write")
    options.add_json(report, "the written page's path")
    options.add_settings(report)


def _model(args: argparse.Namespace) -> str:
    """``--model``, else (``reproduce``) the old positional MODEL, else the settings' ``model_name``."""
    legacy = getattr(args, "legacy_model", None)
    return legacy if legacy and args.model is None else options.model_name(args)


def cmd_status(args: argparse.Namespace) -> int:
    from pipelines.operations.status import format_status, status

    model = _model(args)
    result = status(model, env=options.registry_environment(args, model),
                    trigger_policy=options.settings(args).get("trigger", {}))
    options.print_json(result) if args.json else print(format_status(result))
    return 0


def cmd_history(args: argparse.Namespace) -> int:
    from pipelines.operations.status import format_history, history

    model = _model(args)
    result = history(model, env=options.registry_environment(args, model))
    options.print_json(result) if args.json else print(format_history(result))
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    from pipelines.operations.status import rollback_champion

    model = _model(args)
    result = rollback_champion(model, to=args.to, reason=args.reason, env=options.registry_environment(args, model))
    served = _serve_rolled_back(args, model, result["champion_version"])
    if served:
        result["serving_revision"] = served
    if args.json:
        options.print_json(result)
    else:
        print(f"{result['model_name']}: champion v{result['previous_champion']} -> v{result['champion_version']} "
              f"({result['reason']})" + (f"; all traffic on {served}" if served else ""))
    return 0


def _serve_rolled_back(args: argparse.Namespace, model: str, version: str) -> str:
    """With ``serving.rollout``: the InferenceService moved to ``version`` too (all its traffic); the revision
    serving it, else ""."""
    from training.launch.kube_client import api_client
    from training.launch.kubernetes import KubernetesSettings
    from training.serving.rollout import serve_champion
    from training.serving.settings import ServingSettings

    settings = options.settings(args)
    serving = ServingSettings.from_dict(settings.get("serving"))
    if not serving.rollout:
        return ""
    kubernetes = KubernetesSettings.from_dict(dict(settings.get("cluster", {})))
    return serve_champion(model, version, serving=serving, cluster=kubernetes.cluster,
                          api=api_client(kubernetes.launcher.kubeconfig))


def cmd_reproduce(args: argparse.Namespace) -> int:
    from data.dvc_store import DataStoreConfig
    from training.reproduce import reproduce
    model = _model(args)
    env = options.registry_environment(args, model)
    configured = options.settings(args)
    data_store = DataStoreConfig.from_dict(configured.get("data_store")).url(env.workdir)
    with options.stdout_for_json(args), activity(f"reproducing {model} v{args.version}", quiet=args.json):
        result = reproduce(model, args.version, workdir=env.workdir, current_commit=env.git_commit,
                           repo_root=CODE_ROOT, holdout_fraction=configured.get("holdout_fraction"),
                           split_seed=configured.get("seed"), data_store=data_store)
    if args.json:
        options.print_json(result.to_dict())
    else:
        print(f"{model} v{args.version}: {'IDENTICAL' if result.identical else 'DIFFERENT'} "
              f"(data {result.data_md5} from {result.data_source}, commit {result.git_commit}, seed {result.seed}, "
              f"{result.world_size} rank(s) on CPU)")
        print(f"  weights sha256 recorded {result.weights_sha256['recorded']}")
        print(f"                 rebuilt  {result.weights_sha256['reproduced']}")
        for name, m in result.metrics.items():
            print(f"  {name:<22} recorded {m['recorded']:.6f}  rebuilt {m['reproduced']:.6f}")
        if result.differing_tensors:
            print(f"  differing tensors: {', '.join(result.differing_tensors)}")
    return EXIT_OK if result.identical else EXIT_FINDING


def cmd_report(args: argparse.Namespace) -> int:
    from monitoring.records import drift_checks, quality_checks
    from pipelines.operations.status import history, status
    from pipelines.operations.report import write_report

    model = _model(args)
    env = options.registry_environment(args, model)
    path = write_report(args.out, model_name=model, history=history(model, env=env), drift=drift_checks(model),
                        quality=quality_checks(model), status=status(model, env=env, trigger_policy={}))
    options.print_json({"report": str(path), "model_name": model}) if args.json else print(path)
    return 0


COMMANDS = {"status": cmd_status, "history": cmd_history, "rollback": cmd_rollback, "reproduce": cmd_reproduce,
            "report": cmd_report}
