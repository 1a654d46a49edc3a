"""The trainer's doctests (pytest's --doctest-modules only walks tests/)."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "trainer.args",
    "trainer.checkpoint",
    "trainer.ckptfiles",
    "trainer.config",
    "trainer.copytarget",
    "trainer.data",
    "trainer.faults",
    "trainer.hf",
    "trainer.memwatch",
    "trainer.metrics",
    "trainer.objective",
    "trainer.placement",
    "trainer.schedule",
    "trainer.standin",
    "trainer.verify",
]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0
