"""``python -m trainer``: see :func:`trainer.cli.main`."""

from __future__ import annotations

import sys

from trainer.cli import main

if __name__ == "__main__":
    sys.exit(main())
