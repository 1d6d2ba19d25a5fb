"""The ``kfloop`` command line: :func:`main` is the console script."""
from pipelines.cli.commands import main

__all__ = ["main"]
