"""Run a pipeline on this machine with kfp.local's SubprocessRunner, with quiet, readable progress."""
from __future__ import annotations

import contextlib
import io
import re
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TextIO

from kfp import local

from data.errors import KfloopError
from data.settings import Environment, activate
from data.tables import DataFileError
from training.progress import PREFIX as PROGRESS_PREFIX

_TASK_START = re.compile(r"Executing task \W*'([\w-]+)'")
_TASK_DONE = re.compile(r"Task \W*'([\w-]+)'\W* finished with status \W*(\w+)")
_ERROR_LINE = re.compile(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception|Failure)): (.+)$")


class PipelineFailed(KfloopError, RuntimeError):
    """A local pipeline run failed; ``step``, the step's own error message and its error class are kept. The step
    ran in its own process, so its error arrives by class name: a :class:`DataFileError` there is this run's exit
    code for an unusable data file."""

    def __init__(self, pipeline: str, step: str, message: str, log_path: Path, *, error_type: str = ""):
        self.step, self.message, self.log_path, self.error_type = step, message, log_path, error_type
        if error_type == DataFileError.__name__:
            self.exit_code = DataFileError.exit_code
        super().__init__(f"{pipeline}: step '{step}' failed: {message} (full log: {log_path})")


class _ProgressFilter(io.TextIOBase):
    """Keeps every line of kfp.local's output in a log file; echoes only kfloop progress and task results."""

    def __init__(self, log: TextIO, echo: TextIO | None):
        self.log, self.echo, self._buf = log, echo, ""
        self.last_error = ""
        self.last_error_type = ""
        self.failed_step = ""
        self.step_seconds: dict[str, float] = {}
        self._step_started: dict[str, float] = {}

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        self.log.write(s)
        self._buf += s
        *lines, self._buf = self._buf.split("\n")
        for line in lines:
            self._line(re.sub(r"\x1b\[[0-9;]*m", "", line))
        return len(s)

    def _line(self, line: str) -> None:
        if m := _ERROR_LINE.match(line.strip()):  # a ValueError is a refused value whose message says the fix
            self.last_error = m.group(2) if m.group(1) == "ValueError" else f"{m.group(1)}: {m.group(2)}"
            self.last_error_type = m.group(1)
        if PROGRESS_PREFIX in line:
            self._echo(line[line.index(PROGRESS_PREFIX):])
        elif m := _TASK_START.search(line):
            self._step_started[m.group(1)] = time.monotonic()
        elif m := _TASK_DONE.search(line):
            step, status = m.groups()
            if status != "SUCCESS":
                self.failed_step = self.failed_step or step
            self.step_seconds[step] = time.monotonic() - self._step_started.get(step, time.monotonic())
            self._echo(f"{PROGRESS_PREFIX}step {step}: {status.lower()} ({self.step_seconds[step]:.1f} s)")

    def _echo(self, text: str) -> None:
        if self.echo is not None:
            self.echo.write(text + "\n")
            self.echo.flush()


@dataclass(kw_only=True, slots=True)
class LocalRun:
    """Result of one local pipeline run."""

    pipeline: str
    output: Any
    seconds: float
    step_seconds: dict[str, float]
    """Wall time of each step as kfp.local ran it (process start, imports, executor, outputs)."""
    log_path: Path


def run_local(pipeline: Callable[..., Any], params: dict[str, Any], env: Environment, *,
              echo: TextIO | None = None, quiet: bool = False, runner: Any = None) -> LocalRun:
    """Run ``pipeline(**params)`` with kfp.local's SubprocessRunner in this venv (or ``runner``, e.g. a
    ``DockerRunner`` for steps in containers of the image the pipeline names).

    Each step's output goes to a log file under the workdir; progress lines go to ``echo`` (default: stderr)
    unless ``quiet``.

    Raises:
        PipelineFailed: a step failed; the message is the step's own error.
    """
    activate(env)
    name = pipeline.component_spec.name
    log_dir = env.workdir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{time.monotonic_ns() % 10**6}.log"
    local.init(runner=runner or local.SubprocessRunner(use_venv=False), pipeline_root=str(env.pipeline_root),
               raise_on_error=True)
    start = time.monotonic()
    with open(log_path, "w") as log:
        sink = _ProgressFilter(log, None if quiet else (echo or sys.stderr))
        try:
            with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink), warnings.catch_warnings():
                # kfp.local notes that it ignores display names and that our image is not a plain Python one
                warnings.filterwarnings("ignore", module=r"kfp\.local\.")
                task = pipeline(**params)
        except RuntimeError as exc:
            raise PipelineFailed(name, sink.failed_step or "?", sink.last_error or str(exc), log_path,
                                 error_type=sink.last_error_type) from None
    return LocalRun(pipeline=name, output=task.output, seconds=time.monotonic() - start,
                    step_seconds=sink.step_seconds, log_path=log_path)
