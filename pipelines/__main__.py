"""``python -m pipelines`` is the ``kfloop`` command."""
import sys

from pipelines.cli import main

sys.exit(main())
