"""Fixtures for the trainer tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    """Two shared cores: one intra-op thread keeps in-process runs fast and comparable."""
    torch.set_num_threads(1)
