"""docs/hosts-yaml.md is generated from the schema and Limits; the committed copy must match."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from orchestrator.config.limits import Limits
from orchestrator.config.schema import CONTAINER_FIELDS, HOST_FIELDS, schema_markdown

DOC = Path(__file__).resolve().parents[2] / "docs" / "hosts-yaml.md"


def test_committed_reference_matches_the_code() -> None:
    assert DOC.read_text() == schema_markdown(), (
        "docs/hosts-yaml.md drifted; regenerate: "
        "python -m orchestrator.config.inventory --markdown > docs/hosts-yaml.md"
    )


def test_every_key_and_threshold_is_documented() -> None:
    text = schema_markdown()
    for spec in HOST_FIELDS + CONTAINER_FIELDS:
        assert f"| `{spec.key}` |" in text
    for name in Limits.field_names():
        row = next(line for line in text.splitlines() if line.startswith(f"| `{name}` |"))
        assert not row.endswith("|  |"), f"threshold {name} has no description"


def test_module_entry_point_prints_the_reference() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "orchestrator.config.inventory", "--markdown"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert out == schema_markdown()
