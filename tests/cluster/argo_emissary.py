"""Argo's emissary, the entry of a KFP step pod's main container (run in the pod as ``python3 -c``).

Argo's workflow controller makes the main container's command ``/var/run/argo/argoexec emissary -- CMD``. Taken
from argo-workflows ``cmd/argoexec/commands/emissary.go`` (``NewEmissaryCommand``, ``startCommand``) and
``workflow/executor/osspecific/`` (``command_unix.go`` ``StartCommand``: the command in a process group of its own,
``Setpgid``; ``signal_*.go`` ``Kill``, ``CanIgnoreSignal``, ``Wait``): every signal the emissary gets (SIGCHLD and
SIGURG aside) goes to the command's process group, so a deleted pod's SIGTERM, which the kubelet sends to the
container's PID 1, reaches the command (a PID 1 without a handler, as ``sh`` or ``python3`` are, would ignore it);
the emissary reaps whatever ends and exits with the command's exit code, ``128 + signal`` when a signal ended it.

Arguments: ``--``, then the command.
"""
import os
import signal
import subprocess
import sys

IGNORED = {signal.SIGCHLD, signal.SIGURG}
"""``osspecific.CanIgnoreSignal``: what the emissary does not forward."""


def main() -> int:
    if sys.argv[1:2] != ["--"] or len(sys.argv) < 3:
        print("usage: emissary -- COMMAND [ARG...]", file=sys.stderr)
        return 64
    pending: list[int] = []
    group: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        if not group:  # before the command started: kept, then forwarded (signal.Notify's buffered channel)
            pending.append(signum)
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
    command = subprocess.Popen(sys.argv[2:], process_group=0)  # exec resets the handlers: the command's own
    group.append(command.pid)
    for signum in pending:
        forward(signum, None)
    while True:  # osspecific.Wait: reap every child (PID 1 inherits orphans) until the command has ended
        pid, status = os.wait()
        if pid == command.pid:
            code = os.waitstatus_to_exitcode(status)
            return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
