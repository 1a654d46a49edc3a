"""``python -m trainer``: see :func:`trainer.cli.main`; with ``TRAINER_STAND_IN=1`` in the
environment, the torch-free stand-in :func:`trainer.standin.main` (tests only)."""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    if os.environ.get("TRAINER_STAND_IN") == "1":
        from trainer.standin import main
    else:
        from trainer.cli import main
    sys.exit(main())
