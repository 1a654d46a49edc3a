"""The bundled DFlash-style drafter trainer (separate package; never imports ``orchestrator``).

Run it with ``python -m trainer --config trainer/configs/tiny-cpu.yaml``; the output contract that
orch's monitor parses is documented in ``docs/trainer.md``.
"""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
