"""``python -m pipelines`` is the ``kfloop`` command."""
import sys

from pipelines.cli.commands import main

sys.exit(main())
