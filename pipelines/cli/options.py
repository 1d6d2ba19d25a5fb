"""What every ``kfloop`` command shares: the global flags (``--workdir``, ``--debug``), the settings flags
(``--config``, ``--set``), the model (``--model``), the ``--json`` output and the one shape of an error."""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

from data.redaction import redact, redact_text
from data.settings import (DEFAULT_MODEL_NAME, Environment, activate, load_config_file, load_environment, merge,
                           parse_overrides)
from training.config import with_module_path

HIDDEN = argparse.SUPPRESS
"""Help of an old flag spelling kept so scripts keep working; ``--help`` shows only the current one."""


def add_global_flags(parser: argparse.ArgumentParser, *, on_subcommand: bool = False) -> None:
    """``--workdir DIR`` and ``--debug``, on the main parser and again on every subcommand, so they work before or
    after the command; on a subcommand they default to nothing (``argparse.SUPPRESS``), so a subcommand that does
    not repeat them keeps the main parser's values."""
    unset = {"default": argparse.SUPPRESS} if on_subcommand else {}
    parser.add_argument("--workdir", help="state root (default: $KFLOOP_HOME or ./.kfloop)", **unset)
    parser.add_argument("--debug", action="store_true", help="show full tracebacks", **unset)


def add_settings(parser: argparse.ArgumentParser) -> None:
    """``--config FILE`` and repeatable ``--set KEY=VALUE``."""
    parser.add_argument("--config", help="settings file (default: ./kfloop.yaml when present)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                        help="override a setting, e.g. --set dataset_uri=data.csv --set training.epochs=5")


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings file merged with the ``--set`` overrides, checked (:func:`pipelines.config.check_settings`:
    an unknown key is refused with ``did you mean``); parsed once per command.

    Raises:
        ValueError: the file is not a YAML mapping, an override is not ``key=value``, or a key or value the
            settings check refuses.
    """
    if getattr(args, "_settings", None) is None:
        from pipelines.config import check_settings

        config_dir = Path(args.config).resolve().parent if args.config else Path.cwd()
        args._settings = check_settings(merge(with_module_path(load_config_file(args.config), config_dir),
                                              with_module_path(parse_overrides(args.overrides), Path.cwd())))
    return args._settings


def add_json(parser: argparse.ArgumentParser, what: str = "the result") -> None:
    """``--json``: ``what`` as JSON on stdout, and an error as ``{"error", "hint", "exit_code"}`` there too (its
    readable lines still on stderr)."""
    parser.add_argument("--json", action="store_true",
                        help=f"print {what} as JSON on stdout (errors too: {{error, hint, exit_code}})")


def add_model(parser: argparse.ArgumentParser, what: str = "registered model", *, required_default: bool = True,
              legacy: str | None = None) -> None:
    """``--model NAME``, the registered model, defaulting to ``model_name`` of the settings (then
    ``kfloop-model``, unless ``required_default`` is False: no model); ``legacy`` is an old spelling kept hidden."""
    fallback = f", else {DEFAULT_MODEL_NAME}" if required_default else "; none: no model"
    parser.add_argument("--model", help=f"{what} (default: model_name of the settings{fallback})")
    if legacy:
        parser.add_argument(legacy, dest="model", help=HIDDEN)


def model_name(args: argparse.Namespace, *, required_default: bool = True) -> str:
    """The model a command works on: ``--model``, else ``model_name`` from kfloop.yaml / ``--set``, else the
    default model (``required_default``) or none (empty)."""
    if args.model is not None:
        return args.model
    configured = settings(args).get("model_name") if hasattr(args, "overrides") else None
    return configured or (DEFAULT_MODEL_NAME if required_default else "")


def registry_environment(args: argparse.Namespace, model: str) -> Environment:
    """The environment of a command that reads ``model``'s registry, activated. A local MLflow database that does
    not exist is refused before MLflow is touched: MLflow would create and migrate one, printing its INFO lines,
    only to answer that the model is not there.

    Raises:
        ValueError: the tracking URI is a SQLite file that does not exist.
    """
    env = load_environment(args.workdir)
    database = env.tracking_uri.removeprefix("sqlite:///")
    if database != env.tracking_uri and not Path(database).exists():
        raise ValueError(f"model '{model}' is not registered in {redact(env.tracking_uri)}: no MLflow database "
                         "there yet; pass --workdir DIR (or set MLFLOW_TRACKING_URI), or train a model first "
                         "(kfloop demo)")
    activate(env)
    return env


def stdout_for_json(args: argparse.Namespace):
    """Under ``--json`` stdout carries only the JSON: whatever the work prints goes to stderr instead."""
    return contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext()


def print_json(obj: Any) -> None:
    """``obj`` as indented, key-sorted JSON on stdout."""
    print(json.dumps(obj, indent=2, sort_keys=True, default=str))


def print_error(where: str, message: str, *, hints: list[str], exit_code: int, as_json: bool) -> None:
    """A failed command's error: ``kfloop CMD: error: ...`` and one ``hint: ...`` line per hint on stderr, for the
    person reading the log; under ``--json`` also ``{"error", "hint", "exit_code"}`` on stdout (``hint``: the hints
    joined, or null), for the script reading stdout. Both pass through :func:`data.redaction.redact_text`."""
    message, hints = redact_text(message), [redact_text(hint) for hint in hints]
    if as_json:
        print_json({"error": message, "hint": "; ".join(hints) or None, "exit_code": exit_code})
    print(f"kfloop {where}: error: {message}", file=sys.stderr)
    for hint in hints:
        print(f"hint: {hint}", file=sys.stderr)


class Parser(argparse.ArgumentParser):
    """An argparse parser whose usage errors (exit 2) follow ``--json`` like every other error."""

    json_errors = False
    """Set by :func:`pipelines.cli.commands.main` on every parser when the command line holds ``--json``."""

    def error(self, message: str) -> None:
        """Exit 2 with ``message``: as JSON on stdout under ``--json``, else argparse's usage and error lines."""
        if self.json_errors:
            print_json({"error": message, "hint": f"see {self.prog} --help", "exit_code": 2})
            self.exit(2)
        super().error(message)
