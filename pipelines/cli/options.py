"""What every ``kfloop`` command shares: the global flags (``--workdir``, ``--debug``), the settings flags
(``--config``, ``--set``), the model (``--model``), the ``--json`` output and the one shape of an error."""
from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
from pathlib import Path
from typing import Any

import urllib3

from data.errors import FileAccessError, KfloopError, NotFoundError, ServiceError, SettingsError
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
        ConfigFileError: the settings file is missing, not YAML or not a mapping.
        SettingsError: an override is not ``key=value``, or a key or value the settings check refuses.
    """
    if getattr(args, "_settings", None) is None:
        from pipelines.config import check_settings

        config_dir = Path(args.config).resolve().parent if args.config else Path.cwd()
        from_file = with_module_path(load_config_file(args.config), config_dir)
        try:
            args._settings = check_settings(merge(from_file, with_module_path(parse_overrides(args.overrides),
                                                                              Path.cwd())))
        except KfloopError:
            raise
        except ValueError as exc:
            raise SettingsError(str(exc)) from exc
    return args._settings


def add_json(parser: argparse.ArgumentParser, what: str = "the result") -> None:
    """``--json``: ``what`` as JSON on stdout, and an error as ``{"error", "hint", "exit_code"}`` there too (its
    readable lines still on stderr)."""
    parser.add_argument("--json", action="store_true",
                        help=f"print {what} as JSON on stdout (errors too: {{error, hint, exit_code}})")


NO_MODEL = "none"
"""``--model none``: no model, where the model is optional (``kfloop drift``)."""


def add_model(parser: argparse.ArgumentParser, what: str = "registered model", *, required_default: bool = True,
              legacy: str | None = None) -> None:
    """``--model NAME``, the registered model, defaulting to ``model_name`` of the settings (then
    ``kfloop-model``, unless ``required_default`` is False: no model); ``legacy`` is an old spelling kept hidden."""
    fallback = f", else {DEFAULT_MODEL_NAME}" if required_default else f"; {NO_MODEL}: no model"
    parser.add_argument("--model", help=f"{what} (default: model_name of the settings{fallback})")
    if legacy:
        add_renamed(parser, legacy, "--model", dest="model")


def model_name(args: argparse.Namespace, *, required_default: bool = True) -> str:
    """The model a command works on: ``--model``, else ``model_name`` from kfloop.yaml / ``--set``, else the
    default model (``required_default``) or none (empty); where the model is optional, ``--model none`` is none."""
    if args.model is not None:
        return "" if not required_default and args.model == NO_MODEL else args.model
    configured = settings(args).get("model_name") if hasattr(args, "overrides") else None
    return configured or (DEFAULT_MODEL_NAME if required_default else "")


def registry_environment(args: argparse.Namespace, model: str) -> Environment:
    """The environment of a command that reads ``model``'s registry, activated; the workdir is not created. A local
    MLflow database that does not exist is refused before MLflow is touched: MLflow would create and migrate one,
    printing its INFO lines, only to answer that the model is not there.

    Raises:
        NotFoundError: the tracking URI is a SQLite file that does not exist.
    """
    env = load_environment(args.workdir, create=False)
    database = env.tracking_uri.removeprefix("sqlite:///")
    if database != env.tracking_uri and not Path(database).exists():
        raise NotFoundError(f"model '{model}' is not registered in {redact(env.tracking_uri)}: no MLflow database "
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


def add_renamed(parser: argparse.ArgumentParser, old: str, new: str, **kwargs: Any) -> None:
    """``old``, an earlier spelling of ``new`` (same ``dest``), kept hidden for one release: it still works, with a
    deprecation warning on stderr naming ``new``."""
    parser.add_argument(old, action=_Renamed, new=new, help=HIDDEN, **kwargs)


class _Renamed(argparse.Action):
    """Stores like ``store`` (or ``append``, with ``append=True``), after warning that the flag was renamed."""

    def __init__(self, option_strings: list[str], dest: str, *, new: str, append: bool = False, **kwargs: Any):
        super().__init__(option_strings, dest, **kwargs)
        self.new, self.append = new, append

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(f"kfloop: warning: {option_string} is deprecated and will be removed in the next release: use "
              f"{self.new}", file=sys.stderr)
        if self.append:
            values = [*(getattr(namespace, self.dest, None) or []), values]
        setattr(namespace, self.dest, values)


def as_kfloop_error(exc: BaseException) -> KfloopError | None:
    """``exc`` as the user error it is, with its exit code: a :class:`KfloopError` as it is; a ``ValueError`` (a
    value kfloop refuses) as a settings error; a ``LookupError`` other than a bug's ``KeyError``/``IndexError`` as
    :class:`NotFoundError`; a refused connection or a refusal of the KFP API as :class:`ServiceError` naming the URL
    or the answer; a file that cannot be opened as :class:`FileAccessError`. None: an unexpected error (a bug), which
    exits ``EXIT_FAILED`` and suggests ``--debug``."""
    from kfp_server_api.exceptions import ApiException

    if isinstance(exc, KfloopError):
        return exc
    if isinstance(exc, (urllib3.exceptions.MaxRetryError, urllib3.exceptions.NewConnectionError, ConnectionError)):
        return _unreachable(exc)
    if isinstance(exc, ApiException):
        return ServiceError(f"the Kubeflow Pipelines API refused the request: {exc.status} {exc.reason}"
                            + (f": {_answer(exc.body)}" if exc.body else ""))
    if isinstance(exc, ValueError):
        return SettingsError(str(exc))
    if isinstance(exc, LookupError) and not isinstance(exc, (KeyError, IndexError)):
        return NotFoundError(str(exc))
    if isinstance(exc, OSError):
        return FileAccessError(str(exc))
    return None


def _answer(body: str | bytes) -> str:
    """The ``message`` of a KFP API error body (JSON), else the body's first line."""
    text = body.decode(errors="replace") if isinstance(body, bytes) else str(body)
    try:
        answer = json.loads(text)
    except ValueError:
        answer = None
    return str(answer.get("message") or text) if isinstance(answer, dict) else text.strip().splitlines()[0]


_ERRNO = re.compile(r"\[Errno -?\d+\] ([^'\")]+)")
"""The OS's words inside urllib3's text, e.g. ``[Errno 111] Connection refused``."""


def _unreachable(exc: BaseException) -> ServiceError:
    """One line for a connection that failed: the URL (without credentials) and the OS's reason."""
    conn = getattr(exc, "conn", None)  # urllib3's NewConnectionError: the connection (its pool is the same object)
    pool = None if conn is not None else getattr(exc, "pool", None)
    scheme = "https" if isinstance(conn, urllib3.connection.HTTPSConnection) else "http"
    where = (f"{pool.scheme}://{pool.host}:{pool.port}" if pool is not None else
             f"{scheme}://{conn.host}:{conn.port}" if conn is not None else "the service")
    reason = _ERRNO.search(str(exc))
    why = reason.group(1).strip() if reason else type(getattr(exc, "reason", exc)).__name__
    error = ServiceError(f"cannot reach {redact(where)} ({why})")
    error.hint = ("check the URL (--host is the Kubeflow Pipelines API, e.g. http://localhost:8080 through `kubectl "
                  "port-forward -n kubeflow svc/ml-pipeline-ui 8080:80`), that the service is up, and that this "
                  "machine reaches it (VPN, proxy, port-forward)")
    return error


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
