"""The SQLite history: permissions, WAL, bounds, alert state, and the cross-process lock."""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.monitor.history import (
    BUSY_TIMEOUT_S,
    AlertState,
    History,
    HistoryError,
    default_path,
)
from orchestrator.wire.model import Severity, Snapshot


def test_creates_private_dir_and_file_in_wal_mode(tmp_path):
    path = tmp_path / "state" / "orch" / "orch.db"
    with History.open(path) as h:
        h.record([Snapshot("ct200", 1.0)])
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    import sqlite3

    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_orch_db_env_overrides_the_default(tmp_path, monkeypatch):
    monkeypatch.setenv("ORCH_DB", str(tmp_path / "x.db"))
    assert default_path() == tmp_path / "x.db"
    monkeypatch.delenv("ORCH_DB")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert default_path() == tmp_path / "xdg" / "orch" / "orch.db"


def test_history_is_bounded_per_target_and_ordered(tmp_path):
    with History.open(tmp_path / "h.db", keep=5) as h:
        for i in range(12):
            h.record([Snapshot("a", float(i)), Snapshot("b", 100.0 + i)])
        a = h.snapshots("a")
        assert [s.taken_at for s in a] == [7.0, 8.0, 9.0, 10.0, 11.0]
        assert [s.taken_at for s in h.snapshots("b", limit=2)] == [110.0, 111.0]
        assert h.snapshots("nobody") == []


def test_snapshots_round_trip_through_json(tmp_path):
    snap = Snapshot.unreachable("ct200", 5.0, "connection refused")
    with History.open(tmp_path / "h.db") as h:
        h.record([snap])
        assert h.snapshots("ct200") == [snap]


def test_last_runs_reads_the_newest_run_offset_without_decoding_snapshots(tmp_path):
    """What a check resumes from: the newest snapshot that has a run, past unreachable ones."""
    from dataclasses import replace

    from tests.views.snapshots import running

    first = running("ct200", at=1.0)
    newer = running("ct200", at=2.0)
    newer = replace(newer, run=replace(newer.run, run_id="r-2", log_offset=4096))
    with History.open(tmp_path / "h.db") as h:
        h.record([first, running("ct201", at=1.0)])
        h.record([newer, Snapshot("ct202", 2.0)])
        h.record([Snapshot.unreachable("ct200", 3.0, "refused")])
        assert h.last_runs(["ct200", "ct201", "ct202", "nobody"]) == {
            "ct200": ("r-2", 4096),
            "ct201": ("r-20250101-1200", 0),
        }


def test_alert_state_round_trip_and_replace_per_target(tmp_path):
    a = AlertState("ct200", "ghost-utilization", (3,), Severity.CRITICAL, "ghost", 1.0, 2.0)
    b = AlertState("ct201", "stall", (), Severity.WARNING, "stall", 1.0, None)
    with History.open(tmp_path / "h.db") as h:
        h.save_alerts(["ct200", "ct201"], [a, b])
        assert h.alerts() == {a.key: a, b.key: b}
        h.save_alerts(["ct200"], [])
        assert h.alerts() == {b.key: b}
        assert h.alerts(["ct200"]) == {}


def test_a_garbage_file_is_one_clear_error(tmp_path):
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(HistoryError, match="bad.db: cannot open history database"):
        History.open(bad)


HOLDER = """
import sys, time
from pathlib import Path
from orchestrator.monitor.history import History
h = History.open(Path(sys.argv[1]))
with h.locked(timeout_s=5):
    print("locked", flush=True)
    sys.stdin.read()
"""


def test_lock_excludes_a_second_process_and_dies_with_the_holder(tmp_path):
    path = tmp_path / "h.db"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with History.open(path) as h:
            started = time.monotonic()
            with (
                pytest.raises(HistoryError, match="locked by another orch check"),
                h.locked(timeout_s=0.3),
            ):
                pass
            assert time.monotonic() - started >= 0.3
            holder.kill()  # a killed check must not wedge the next one
            holder.wait(timeout=5)
            with h.locked(timeout_s=5):
                h.record([Snapshot("ct200", 1.0)])
    finally:
        holder.kill()
        holder.wait(timeout=5)


def _check(db: Path, tmp_path: Path, timeout_s: float = 60.0) -> subprocess.CompletedProcess:
    """``orch check`` of an empty inventory against ``db`` (a real process)."""
    cfg = tmp_path / "hosts.yaml"
    cfg.write_text("hosts: {}\ncontainers: {}\n")
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "-c", str(cfg), "check", "--db", str(db)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=Path(__file__).resolve().parents[2],
    )


def test_a_corrupt_database_is_unknown_3_naming_the_file(tmp_path):
    bad = tmp_path / "orch.db"
    History.open(bad).close()
    with bad.open("r+b") as f:  # a valid header, garbage pages: "database disk image is malformed"
        f.seek(100)
        f.write(b"\xff" * 4000)
    res = _check(bad, tmp_path)
    assert res.returncode == 3, res
    assert "Traceback" not in res.stderr + res.stdout
    assert str(bad) in res.stdout + res.stderr


def test_a_database_held_exclusive_elsewhere_is_unknown_3_within_the_deadline(tmp_path):
    db = tmp_path / "orch.db"
    History.open(db).close()
    holder = sqlite3.connect(str(db), isolation_level=None)
    holder.execute("PRAGMA journal_mode=DELETE")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        t0 = time.monotonic()
        res = _check(db, tmp_path)
        elapsed = time.monotonic() - t0
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert res.returncode == 3, res
    assert "Traceback" not in res.stderr + res.stdout
    assert str(db) in res.stdout and "locked" in res.stdout
    assert elapsed < BUSY_TIMEOUT_S * 4, elapsed  # not 30 s per statement


def test_every_statement_failure_is_a_history_error(tmp_path):
    db = tmp_path / "orch.db"
    with History.open(db) as h:
        h._conn.execute("DROP TABLE snapshots")
        with pytest.raises(HistoryError, match=str(db)):
            h.record([Snapshot("ct", 1.0)])


def _inventory(where: Path, address: str, vmid: int):
    from orchestrator.config.inventory import load_inventory

    where.mkdir()
    path = where / "hosts.yaml"
    path.write_text(
        f"hosts:\n  pve1: {{address: {address}}}\ncontainers:\n  ct200: {{host: pve1, vmid: {vmid}}}\n"
    )
    path.chmod(0o600)
    return load_inventory(path)


def test_two_inventories_naming_ct200_never_see_each_other(tmp_path):
    from orchestrator.monitor.history import read_journal
    from orchestrator.monitor.journal import JournalEntry

    db = tmp_path / "orch.db"
    a = _inventory(tmp_path / "a", "10.0.0.1", 200)
    b = _inventory(tmp_path / "b", "10.0.0.2", 300)
    with History.open(db, inventory=a) as h:
        h.record([Snapshot("ct200", 1.0)])
        h.append_journal([JournalEntry("ct200", 1.0, "give-up", "crash loop")])
        h.save_alerts(["ct200"], [AlertState("ct200", "crashed", (), Severity.CRITICAL, "x", 1.0)])
    with History.open(db, inventory=b) as h:
        assert h.snapshots("ct200") == [] and h.journal("ct200") == [] and h.journal() == []
        assert h.alerts(["ct200"]) == {} and h.last_runs(["ct200"]) == {}
        h.record([Snapshot("ct200", 2.0)])
    assert read_journal(["ct200"], db, inventory=b) == {"ct200": []}
    assert [e.action for e in read_journal(["ct200"], db, inventory=a)["ct200"]] == ["give-up"]
    with History.open(db, inventory=a) as h:
        assert [s.taken_at for s in h.snapshots("ct200")] == [1.0]
        assert [s.target for s in h.alerts(["ct200"]).values()] == ["ct200"]


_OLD_SCHEMA = """
CREATE TABLE snapshots (id INTEGER PRIMARY KEY AUTOINCREMENT, target TEXT NOT NULL,
    taken_at REAL NOT NULL, body TEXT NOT NULL);
CREATE INDEX snapshots_target ON snapshots (target, id);
CREATE TABLE alerts (target TEXT NOT NULL, kind TEXT NOT NULL, gpus TEXT NOT NULL,
    severity INTEGER NOT NULL, summary TEXT NOT NULL, first_seen REAL NOT NULL,
    last_notified REAL, PRIMARY KEY (target, kind, gpus));
CREATE TABLE journal (id INTEGER PRIMARY KEY AUTOINCREMENT, unit TEXT NOT NULL, run_id TEXT,
    at REAL NOT NULL, action TEXT NOT NULL, body TEXT NOT NULL, notified_at REAL);
CREATE INDEX journal_unit ON journal (unit, id);
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


def test_a_schema_1_database_is_migrated_its_rows_kept_for_the_first_inventory(tmp_path):
    """The old code's tables (keyed by name): the first inventory to open it claims its rows;
    a second inventory naming the same container does not see them."""
    import json

    db = tmp_path / "old.db"
    with sqlite3.connect(db) as raw:
        raw.executescript(_OLD_SCHEMA)
        body = json.dumps(Snapshot("ct200", 5.0).to_dict())
        raw.execute(
            "INSERT INTO snapshots (target, taken_at, body) VALUES ('ct200', 5.0, ?)", (body,)
        )
        raw.execute("INSERT INTO alerts VALUES ('ct200', 'crashed', '[]', 2, 'x', 5.0, NULL)")
        entry = json.dumps({"unit": "ct200", "at": 5.0, "action": "give-up", "reason": "loop"})
        raw.execute(
            "INSERT INTO journal (unit, at, action, body) VALUES ('ct200', 5.0, 'give-up', ?)",
            (entry,),
        )
    a = _inventory(tmp_path / "a", "10.0.0.1", 200)
    b = _inventory(tmp_path / "b", "10.0.0.2", 300)
    with History.open(db, inventory=a) as h:
        assert [s.taken_at for s in h.snapshots("ct200")] == [5.0]
        assert list(h.alerts(["ct200"])) == [("ct200", "crashed", ())]
        assert [e.action for e in h.journal("ct200")] == ["give-up"]
    with History.open(db, inventory=b) as h:
        assert h.snapshots("ct200") == [] and h.journal("ct200") == [] and h.alerts() == {}
    with sqlite3.connect(db) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == 2
        assert raw.execute("SELECT COUNT(*) FROM snapshots").fetchone()[0] == 1
