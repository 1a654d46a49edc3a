"""The bundled DFlash-style drafter trainer (separate package; never imports ``orchestrator``).

Run it with ``python -m trainer --config trainer/configs/tiny-cpu.yaml``; the output contract that
orch's monitor parses is documented in ``docs/trainer.md``.
"""

from __future__ import annotations

from trainer._version import __version__

__all__ = ["__version__"]
