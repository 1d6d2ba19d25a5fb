"""The one base of kfloop's own errors and the table of exit codes: each error says what went wrong, the exit code
the CLI returns for it, and a hint with the fix, so the CLI maps an error to its exit code by its type."""
from __future__ import annotations

EXIT_OK = 0
"""The command did its work; a check ran and found nothing it was asked to fail on."""
EXIT_FINDING = 1
"""The check ran and found what it was asked to fail on: invalid data (``validate``), drift under
``--fail-on-drift``, degraded quality under ``--fail-on-degraded``, a retrained version that differs
(``reproduce``). As with ``grep`` and ``diff``: 1 is a finding, 2 and above are errors."""
EXIT_USAGE = 2
"""argparse's usage error: an unknown flag, a missing required one, a bad choice, flags that do not go together."""
EXIT_DATA_FILE = 3
"""A file, URI or named thing the command reads is missing or unusable: a data, schema or ``--config`` file, object
storage that refuses, a model not registered, a pipeline version not uploaded."""
EXIT_SETTINGS = 4
"""A setting (``kfloop.yaml``, ``--set``) or flag value that kfloop refuses: an unknown key, a value out of range."""
EXIT_SERVICE = 5
"""An external service did not answer or refused the request (e.g. 401, 403): the Kubeflow Pipelines API, the MLflow
server, Kubernetes or Ray."""
EXIT_FAILED = 6
"""The work failed: a pipeline run, a training launch or a registry operation; also an unexpected error (a bug: the
error line suggests ``--debug``)."""

EXIT_CODES: dict[int, str] = {
    EXIT_OK: "ok",
    EXIT_FINDING: "finding",
    EXIT_USAGE: "usage",
    EXIT_DATA_FILE: "data",
    EXIT_SETTINGS: "settings",
    EXIT_SERVICE: "service",
    EXIT_FAILED: "failed",
}
"""Every exit code of ``kfloop`` and its one-word name (the meaning is each constant's docstring)."""


class KfloopError(Exception):
    """An error kfloop reports to its user: the message names the problem, :attr:`hint` the fix."""

    exit_code: int = EXIT_FAILED
    """What ``kfloop`` exits with when this error ends a command: one of :data:`EXIT_CODES`."""
    hint: str = ""
    """How to fix it, when the message alone does not say."""


class SettingsError(KfloopError, ValueError):
    """A setting of ``kfloop.yaml`` or ``--set``, or a flag value, that kfloop refuses."""

    exit_code = EXIT_SETTINGS


class ConfigFileError(KfloopError, ValueError):
    """The settings file is missing or not a YAML mapping; the message names the file (and line and column)."""

    exit_code = EXIT_DATA_FILE


class FileAccessError(KfloopError, OSError):
    """A file the command reads or writes cannot be opened (missing, a folder, no permission)."""

    exit_code = EXIT_DATA_FILE


class NotFoundError(KfloopError, LookupError):
    """What the command names is not there: a registered model, a pipeline version, a recurring run."""

    exit_code = EXIT_DATA_FILE


class UsageError(KfloopError, ValueError):
    """Flags that do not go together, found after argparse parsed them."""

    exit_code = EXIT_USAGE


class ServiceError(KfloopError, ConnectionError):
    """An external service (KFP API, MLflow server, Kubernetes, Ray) did not answer or refused the request; the
    message names its URL or its answer."""

    exit_code = EXIT_SERVICE
