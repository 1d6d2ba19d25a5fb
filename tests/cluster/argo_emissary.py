"""Argo's emissary, the entry of a KFP step pod's main container (run in the pod as ``python3 -c``).

Argo's workflow controller makes the main container's command ``/var/run/argo/argoexec emissary -- CMD`` (the
``var-run-argo`` emptyDir at ``/var/run/argo``, ``ARGO_CONTAINER_NAME`` the container's name:
``workflow/controller/workflowpod.go`` lines 38-46, 366, 435). Taken from argo-workflows v4.0.5 (what KFP 2.17's
manifests install) ``cmd/argoexec/commands/emissary.go`` (``NewEmissaryCommand``, ``startCommand``), ``signal.go``
(``startFileSignalHandler``), ``cmd/argoexec/main.go`` and ``workflow/executor/osspecific/`` (``command_unix.go``
``StartCommand``: the command in a process group of its own, ``Setpgid``; ``signal_darwin.go`` ``Kill``,
``CanIgnoreSignal``, ``Wait``):

- ``<var-run-argo>/ctr/<ARGO_CONTAINER_NAME>/`` is made (mode 0777) and ``exitcode`` written there when the
  emissary ends: the command's exit code, ``128 + signal`` when a signal ended it, 64 when it never ran (a command
  not on ``PATH``: ``failed to find name in PATH``, exit 64).
- Every signal the emissary gets (SIGCHLD and SIGURG aside) goes to the command's process group, so a deleted
  pod's SIGTERM, which the kubelet sends to the container's PID 1, reaches the command; one got before the command
  started is kept (``signal.Notify``'s channel holds one) and forwarded once it has. A signal number written to
  ``ctr/<name>/signal`` (Argo's wait container's ``kill``) is read every 2 s, the file removed, the signal sent.
- With ``ARGO_INCLUDE_SCRIPT_OUTPUT=true`` the command's stdout is copied to ``ctr/<name>/stdout``, stdout and
  stderr to ``ctr/<name>/combined``; the copies stop 100 ms after the command ends (``simpleStart``'s
  ``WaitDelay``), whatever background process still holds the pipe.
- The emissary reaps whatever ends (PID 1 inherits orphans) until the command has, and exits with its code.

Not emulated (KFP's step templates use none): the ``template`` file and what it drives (output parameters and
artifacts saved under ``outputs/``, container-set dependencies and retries, sidecars), ``ARGO_DEBUG_PAUSE_*``,
``ARGO_CONTAINER_ARGS_FILE``, a TTY.

Arguments: the path of ``argoexec`` in the pod (its folder is the ``var-run-argo`` mount), ``--``, the command.
"""
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

IGNORED = {signal.SIGCHLD, signal.SIGURG}
"""``osspecific.CanIgnoreSignal``: what the emissary does not forward."""
NOT_STARTED = 64
"""``emissary.go``'s ``exitCode`` until the command has run, and ``main.go``'s exit on any other error."""
SIGNAL_POLL_SECONDS = 2
"""``startFileSignalHandler``'s ticker."""
WAIT_DELAY_SECONDS = 0.1
"""``simpleStart``'s ``cmd.WaitDelay``: how long the output copies outlive the command."""


def main(argv: list[str]) -> int:
    if argv[1:2] != ["--"] or len(argv) < 3:
        print("usage: emissary ARGOEXEC -- COMMAND [ARG...]", file=sys.stderr)
        return NOT_STARTED
    ctr = Path(os.path.dirname(argv[0])) / "ctr" / os.environ.get("ARGO_CONTAINER_NAME", "")
    ctr.mkdir(mode=0o777, parents=True, exist_ok=True)
    code = NOT_STARTED
    try:
        code = run(ctr, argv[2:])
    finally:
        (ctr / "exitcode").write_text(str(code))
    return code


def run(ctr: Path, command: list[str]) -> int:
    """Start ``command`` as ``startCommand`` does, forward signals to its group, reap until it ends: its exit code."""
    pending: list[int] = []
    group: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        if not group:
            pending[:] = pending or [signum]  # signal.Notify's buffered channel: one kept, the rest dropped
            return
        try:
            os.killpg(group[0], signum)
        except ProcessLookupError:  # the group ended meanwhile
            pass

    for signum in signal.valid_signals() - IGNORED - {signal.SIGKILL, signal.SIGSTOP}:
        try:
            signal.signal(signum, forward)
        except (OSError, ValueError):  # one Python reserves
            continue
    path = shutil.which(command[0])
    if path is None:
        print(f'failed to find name in PATH: exec: "{command[0]}": executable file not found in $PATH',
              file=sys.stderr)
        return NOT_STARTED
    capture = os.environ.get("ARGO_INCLUDE_SCRIPT_OUTPUT") == "true"
    pipe = subprocess.PIPE if capture else None
    process = subprocess.Popen([path, *command[1:]], process_group=0, stdout=pipe, stderr=pipe)  # exec resets
    group.append(process.pid)  # the handlers: the command's own
    copies = [_copy(process.stdout, sys.stdout.buffer, ctr / "stdout", ctr / "combined"),
              _copy(process.stderr, sys.stderr.buffer, ctr / "combined")] if capture else []
    for signum in pending:
        forward(signum, None)
    done = threading.Event()
    threading.Thread(target=_signal_file, args=(ctr / "signal", process.pid, done), daemon=True).start()
    while True:  # osspecific.Wait: reap every child until the command has ended
        pid, status = os.wait()
        if pid == process.pid:
            break
    done.set()
    for copy in copies:
        copy.join(WAIT_DELAY_SECONDS)
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


def _copy(source, *targets) -> threading.Thread:
    """Copy ``source`` to ``targets`` (a stream, then files opened for appending, mode 0666) as it comes."""

    def copy() -> None:
        files = [targets[0], *(open(os.open(t, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o666), "wb", buffering=0)
                               for t in targets[1:])]
        for chunk in iter(lambda: source.read1(65536), b""):
            for target in files:
                target.write(chunk)
                target.flush()

    thread = threading.Thread(target=copy, daemon=True)
    thread.start()
    return thread


def _signal_file(path: Path, pid: int, done: threading.Event) -> None:
    """``startFileSignalHandler``: every 2 s, a positive number in ``path`` is sent to ``pid``'s group."""
    while not done.wait(SIGNAL_POLL_SECONDS):
        try:
            signum = int(path.read_text())
        except (OSError, ValueError):
            continue
        if signum > 0:
            path.unlink(missing_ok=True)
            try:
                os.killpg(pid, signum)
            except ProcessLookupError:
                pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
