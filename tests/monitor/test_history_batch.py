"""History.batch: a check's writes in one transaction (one commit), all or nothing."""

from __future__ import annotations

import sqlite3

import pytest

from orchestrator.monitor.history import History
from orchestrator.wire.model import Snapshot


def test_writes_inside_a_batch_commit_once_and_together(tmp_path) -> None:
    path = tmp_path / "orch.db"
    commits: list[str] = []
    with History.open(path) as h:
        h._conn._conn.set_trace_callback(  # type: ignore[attr-defined]
            lambda sql: commits.append(sql) if sql.strip().upper() == "COMMIT" else None
        )
        with h.batch():
            h.record([Snapshot("a", 1.0)])
            h.set_meta("kernel-cursor:h0", "s=1")
            h.record([Snapshot("b", 2.0)])
            with sqlite3.connect(path) as other:  # not visible to another reader yet
                assert other.execute("SELECT COUNT(*) FROM snapshots").fetchone()[0] == 0
        assert len(commits) == 1
        assert [s.target for s in h.snapshots("a") + h.snapshots("b")] == ["a", "b"]
        assert h.get_meta("kernel-cursor:h0") == "s=1"


def test_a_failure_inside_a_batch_rolls_every_write_back(tmp_path) -> None:
    with History.open(tmp_path / "orch.db") as h:
        with pytest.raises(RuntimeError), h.batch():
            h.record([Snapshot("a", 1.0)])
            h.set_meta("k", "v")
            raise RuntimeError("boom")
        assert h.snapshots("a") == [] and h.get_meta("k") is None
        h.record([Snapshot("a", 3.0)])  # the connection is usable again
        assert [s.taken_at for s in h.snapshots("a")] == [3.0]
