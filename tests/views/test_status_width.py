"""``orch status`` without a terminal (80 columns): it wraps between words, never inside one."""

from __future__ import annotations

import re

from rich.console import Console

from orchestrator.views.launch import status_table

ROWS = [
    {
        "target": "ct200",
        "reachable": True,
        "container": "running",
        "session": "train",
        "run_id": "20261202-051100-tiny-cpu",
        "state": "crashed",
        "run_state": "exited 137",
        "age_s": 125,
        "step": 1234,
        "tokens_per_s": 21500.0,
        "gpus": 8,
        "gpus_busy": 3,
        "gpu_mem_used_gib": 54,
        "gpu_mem_total_gib": 1143,
    },
    {
        "target": "ct201",
        "reachable": False,
        "container": "stopped",
        "session": "train",
        "error": "pve1: unreachable: timed out",
    },
]


def test_80_columns_keep_every_word_and_every_column_whole() -> None:
    console = Console(width=80, color_system=None, record=True)
    console.print(status_table(ROWS, console.width))
    text = console.export_text()
    assert max(map(len, text.splitlines())) <= 80
    words = set(re.findall(r"\S+", text))
    for word in (
        "target",
        "reach",
        "container",
        "session",
        "state",
        "tok/s",
        "mem",
        "running",
        "stopped",
        "crashed",
        "(exited",
        "unreachable:",
        "timed",
        "54/1143",
        "21,500",
    ):
        assert word in words, f"{word!r} broken or missing:\n{text}"
    # the run id is one long word: only it folds
    assert "20261202-" in text
