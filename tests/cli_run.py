"""Run the ``kfloop`` command line in this process and capture what it printed."""
from __future__ import annotations

from pipelines.cli.commands import main


def cli(capsys, *args: str) -> tuple[int, str, str]:
    """``kfloop ARGS``: (exit code, stdout, stderr), with anything printed before the call dropped."""
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err
