"""What every ``kfloop`` command shares: the global flags (``--workdir``, ``--debug``), the settings flags
(``--config``, ``--set``) and the ``--json`` output."""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

from data.settings import load_config_file, merge, parse_overrides
from training.config import with_module_path


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
    """The settings file merged with the ``--set`` overrides.

    Raises:
        ValueError: the file is not a YAML mapping, or an override is not ``key=value``.
    """
    config_dir = Path(args.config).resolve().parent if args.config else Path.cwd()
    return merge(with_module_path(load_config_file(args.config), config_dir),
                 with_module_path(parse_overrides(args.overrides), Path.cwd()))


def stdout_for_json(args: argparse.Namespace):
    """Under ``--json`` stdout carries only the JSON: whatever the work prints goes to stderr instead."""
    return contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext()


def print_json(obj: Any) -> None:
    """``obj`` as indented, key-sorted JSON on stdout."""
    print(json.dumps(obj, indent=2, sort_keys=True, default=str))
