"""What ``orch check`` remembers between runs: snapshot history and alert state, in SQLite.

The database lives at ``~/.local/state/orch/orch.db`` (``--db`` or ``$ORCH_DB``
override it). Its directory is created ``0700`` and the file ``0600``: snapshots
carry log lines and alert state names targets, which is nobody else's business.
The journal is WAL, so a reader (``orch watch``, a second check) never blocks on
a writer for long.

Two cron runs may overlap (a slow host, a short interval). :meth:`History.locked`
takes an exclusive ``fcntl.flock`` on ``<db>.lock`` for the read-judge-alert-write
cycle, so the second run sees the first one's alert state and never sends the
same alert again; inside it every write is one ``BEGIN IMMEDIATE`` transaction,
so a crash mid-way leaves the previous state intact.

Rows are keyed by the container's identity, not its name alone (:func:`identities`: the
host's address, the vmid and the inventory file's path), so two inventories that both name
``ct200`` never see each other's snapshots, alerts or restarts. A database of schema 1 (rows
keyed by name) is migrated on open: its rows are kept, and the first inventory that opens it
claims the rows of the names it has (the others stay under their name, shown to no one).
Names that are no container (jobs, ``host:`` rows) and a History opened without an inventory
keep the name as the key.

History is bounded: at most ``keep`` snapshots per target (oldest dropped first). The
restart journal (:mod:`orchestrator.monitor.journal`) keeps :data:`JOURNAL_KEEP` entries per
unit; it lives here so that its budget survives a supervisor's crash and shares the check's lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from orchestrator.config.inventory import Inventory
from orchestrator.errors import OrchError
from orchestrator.monitor.journal import JournalEntry
from orchestrator.wire.model import SchemaError, Severity, Snapshot

log = logging.getLogger(__name__)

DEFAULT_KEEP = 60
"""Snapshots kept per target: five hours of a five-minute cron."""
JOURNAL_KEEP = 500
"""Restart-journal entries kept per unit (a crash loop writes a handful per death)."""

SCHEMA_VERSION = 2
"""``PRAGMA user_version``: 1 (shown as 0, never set) keyed rows by name; 2 by identity."""
UNCLAIMED = "unclaimed-name-rows"
"""Meta key set by the migration from schema 1 until an inventory claims the name-keyed rows."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS snapshots (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    target TEXT NOT NULL,
    taken_at REAL NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS snapshots_target ON snapshots (target, id);
CREATE TABLE IF NOT EXISTS alerts (
    target TEXT NOT NULL,
    kind TEXT NOT NULL,
    gpus TEXT NOT NULL,
    severity INTEGER NOT NULL,
    summary TEXT NOT NULL,
    first_seen REAL NOT NULL,
    last_notified REAL,
    PRIMARY KEY (target, kind, gpus)
);
CREATE TABLE IF NOT EXISTS journal (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    unit TEXT NOT NULL,
    run_id TEXT,
    at REAL NOT NULL,
    action TEXT NOT NULL,
    body TEXT NOT NULL,
    notified_at REAL
);
CREATE INDEX IF NOT EXISTS journal_unit ON journal (unit, id);
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""


class HistoryError(OrchError):
    """The history database cannot be opened or locked.

    >>> str(HistoryError("/tmp/x.db", "locked by another orch check for 30.0 s"))
    '/tmp/x.db: locked by another orch check for 30.0 s; is a check hung? (see docs/cron.md)'
    """

    exit_code = 3

    def __init__(
        self, path: str, problem: str, hint: str = "is a check hung? (see docs/cron.md)"
    ) -> None:
        self.path, self.problem, self.hint = path, problem, hint
        super().__init__(f"{path}: {problem}; {hint}")


class _LockedOrBusy(HistoryError, sqlite3.OperationalError):
    """An ``OperationalError`` of SQLite as a :class:`HistoryError` (code that tells an
    operational error apart, such as a build without JSON functions, still can)."""


BUSY_TIMEOUT_S = 5.0
"""How long a statement waits for a lock another process holds (``BEGIN EXCLUSIVE``
elsewhere) before it is a :class:`HistoryError` (a check then says UNKNOWN, exit 3)."""


def db_error(path: Path | str, exc: sqlite3.Error) -> HistoryError:
    """``exc`` as a :class:`HistoryError` that names ``path`` and says what to do.

    >>> str(db_error("/h.db", sqlite3.DatabaseError("file is not a database")))
    '/h.db: not a usable SQLite database (file is not a database); move it aside: orch starts a new one'
    >>> str(db_error("/h.db", sqlite3.OperationalError("database is locked")))[:60]
    '/h.db: locked by another process for 5 s (database is locked'
    """
    text = str(exc)
    cls = _LockedOrBusy if isinstance(exc, sqlite3.OperationalError) else HistoryError
    if "locked" in text or "busy" in text:
        return cls(
            str(path),
            f"locked by another process for {BUSY_TIMEOUT_S:g} s ({text})",
            "is another orch, or an sqlite3 shell, holding it?",
        )
    if "readonly" in text or "read-only" in text:
        return cls(
            str(path),
            f"read-only ({text})",
            "orch writes its history here: check the file's and directory's permissions, "
            "or choose another with --db / $ORCH_DB",
        )
    if isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.OperationalError):
        return cls(
            str(path),
            f"not a usable SQLite database ({text})",
            "move it aside: orch starts a new one",
        )
    return cls(str(path), f"history database error ({text})", "see docs/cron.md")


class _Connection:
    """A ``sqlite3.Connection`` whose every failure is a :class:`HistoryError` naming the
    database (corrupt, locked, read-only, a full disk): never a traceback."""

    __slots__ = ("_conn", "_path")

    def __init__(self, path: Path, conn: sqlite3.Connection) -> None:
        self._path, self._conn = path, conn

    def execute(self, sql: str, params: Any = ()) -> sqlite3.Cursor:
        try:
            return self._conn.execute(sql, params)
        except sqlite3.Error as exc:
            raise db_error(self._path, exc) from None

    def executemany(self, sql: str, rows: Iterable[Any]) -> sqlite3.Cursor:
        try:
            return self._conn.executemany(sql, rows)
        except sqlite3.Error as exc:
            raise db_error(self._path, exc) from None

    def executescript(self, sql: str) -> sqlite3.Cursor:
        try:
            return self._conn.executescript(sql)
        except sqlite3.Error as exc:
            raise db_error(self._path, exc) from None

    def close(self) -> None:
        self._conn.close()


@dataclass(frozen=True, slots=True)
class AlertState:
    """One finding that is (or was, until recovery is announced) active for a target.

    ``last_notified`` is ``None`` when no notification has been delivered yet
    (the webhook failed): the next check tries again.
    """

    target: str
    kind: str
    gpus: tuple[int, ...]
    severity: Severity
    summary: str
    first_seen: float
    last_notified: float | None = None

    @property
    def key(self) -> tuple[str, str, tuple[int, ...]]:
        return (self.target, self.kind, self.gpus)


def read_journal(
    units: Sequence[str],
    path: Path | None = None,
    *,
    limit: int = 20,
    inventory: Inventory | None = None,
) -> dict[str, list[JournalEntry]]:
    """Each unit's newest journal entries (oldest first) for the views: ``orch status``,
    ``orch watch``, ``orch postmortem``. Never creates the database, never waits for a lock,
    never raises: no file, or one that cannot be read, is an empty journal."""
    path = Path(path) if path is not None else default_path()
    if not path.is_file():
        return {u: [] for u in units}
    try:
        with History.open(path, inventory=inventory) as h:
            return {u: h.journal(u, limit=limit) for u in units}
    except (HistoryError, sqlite3.Error) as exc:
        log.info("%s: restart journal not readable: %s", path, exc)
        return {u: [] for u in units}


def identities(inventory: Inventory | None) -> dict[str, str]:
    """``{container name: its key}``: ``host address/vmid@inventory path`` (a container with no
    vmid: its own address, or its name).

    >>> from orchestrator.config.inventory import builtin_inventory
    >>> identities(builtin_inventory())
    {'local': 'local@-'}
    """
    if inventory is None:
        return {}
    where = str(Path(inventory.path).expanduser().resolve()) if inventory.path else "-"
    out = {}
    for name, c in inventory.containers.items():
        host = inventory.hosts.get(c.host)
        if host is not None and c.vmid is not None:
            out[name] = f"{host.address}/{c.vmid}@{where}"
        else:
            out[name] = f"{c.address or name}@{where}"
    return out


def default_path() -> Path:
    """``$ORCH_DB``, else ``$XDG_STATE_HOME/orch/orch.db``, else ``~/.local/state/orch/orch.db``."""
    env = os.environ.get("ORCH_DB")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "orch" / "orch.db"


def _migrate(raw: sqlite3.Connection) -> None:
    """Schema 1 -> 2: the rows stay; name-keyed ones wait for an inventory to claim them."""
    had = any(
        raw.execute(f"SELECT EXISTS (SELECT 1 FROM {t})").fetchone()[0]  # constant
        for t in ("snapshots", "alerts", "journal")
    )
    if had:
        raw.execute("INSERT OR REPLACE INTO meta VALUES (?, '1')", (UNCLAIMED,))
    raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


class History:
    """The SQLite store. Open with :meth:`open`; use as a context manager to close.

    Not shared between threads: the check's worker threads only fetch snapshots,
    the main thread records them.
    """

    def __init__(
        self, path: Path, conn: _Connection, keep: int, keys: dict[str, str] | None = None
    ) -> None:
        self.path = path
        self._conn = conn
        self.keep = keep
        self._keys = dict(keys or {})
        self._names = {v: k for k, v in self._keys.items()}
        self._depth = 0

    def key(self, name: str) -> str:
        """The rows' key of target ``name`` (:func:`identities`; the name itself otherwise)."""
        return self._keys.get(name, name)

    def _name(self, key: str) -> str:
        return self._names.get(key, key)

    @classmethod
    def open(
        cls,
        path: Path | None = None,
        *,
        keep: int = DEFAULT_KEEP,
        inventory: Inventory | None = None,
    ) -> History:
        """Open (creating if needed, migrating an older schema) the database at ``path``
        (default :func:`default_path`), its rows keyed by ``inventory``'s identities.

        Raises:
            HistoryError: the directory or file cannot be created or is not a database.
        """
        path = Path(path) if path is not None else default_path()
        try:
            if not path.parent.exists():
                path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            if not path.exists():
                fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
                os.close(fd)
            raw = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_S, isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            raise HistoryError(str(path), f"cannot open history database: {exc}") from None
        try:
            raw.execute("PRAGMA journal_mode=WAL")
            raw.execute("PRAGMA synchronous=NORMAL")
            version = raw.execute("PRAGMA user_version").fetchone()[0]
            raw.executescript(_SCHEMA)
            if version < SCHEMA_VERSION:
                _migrate(raw)
        except sqlite3.Error as exc:
            raw.close()
            err = db_error(path, exc)
            raise HistoryError(
                str(path), f"cannot open history database: {err.problem}", err.hint
            ) from None
        history = cls(path, _Connection(path, raw), keep, identities(inventory))
        if history._keys and history.get_meta(UNCLAIMED):
            history._claim()
        return history

    def _claim(self) -> None:
        """Key the name-keyed rows of a migrated database by this inventory's identities."""
        with self._write() as db:
            for name, key in self._keys.items():
                db.execute("UPDATE snapshots SET target = ? WHERE target = ?", (key, name))
                db.execute("UPDATE OR IGNORE alerts SET target = ? WHERE target = ?", (key, name))
                db.execute("UPDATE journal SET unit = ? WHERE unit = ?", (key, name))
            db.execute("DELETE FROM meta WHERE key = ?", (UNCLAIMED,))

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> History:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- locking ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def locked(self, timeout_s: float = 60.0) -> Iterator[None]:
        """Hold the exclusive check lock (``<db>.lock``, flock) for the block.

        Waits up to ``timeout_s`` seconds, polling, then raises ``HistoryError``:
        a check that cannot get the lock must not judge or alert on stale state.
        The lock dies with the process, so a killed check never wedges the next.
        """
        lock_path = self.path.with_name(self.path.name + ".lock")
        try:
            fd = os.open(lock_path, os.O_CREAT | os.O_RDWR, 0o600)
        except OSError as exc:
            raise HistoryError(
                str(lock_path),
                f"cannot open the check lock: {exc.strerror}",
                "check the directory's permissions, or choose --db / $ORCH_DB",
            ) from None
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise HistoryError(
                            str(self.path), f"locked by another orch check for {timeout_s} s"
                        ) from None
                    time.sleep(0.05)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the flock

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Every write inside is one transaction (one commit): a check's snapshots, cursors
        and alert states together. A failure inside rolls all of them back."""
        with self._write():
            yield

    @contextlib.contextmanager
    def _write(self) -> Iterator[_Connection]:
        if self._depth:  # inside batch(): the outer transaction commits
            self._depth += 1
            try:
                yield self._conn
            finally:
                self._depth -= 1
            return
        self._conn.execute("BEGIN IMMEDIATE")
        self._depth = 1
        try:
            yield self._conn
        except BaseException:
            with contextlib.suppress(HistoryError):  # the failure that got here is the one to say
                self._conn.execute("ROLLBACK")
            raise
        finally:
            self._depth = 0
        self._conn.execute("COMMIT")

    # --- snapshots -------------------------------------------------------------------------

    def record(self, snapshots: Iterable[Snapshot]) -> None:
        """Append snapshots and trim each target to the newest ``keep``, in one transaction."""
        snaps = list(snapshots)
        with self._write() as db:
            for snap in snaps:
                db.execute(
                    "INSERT INTO snapshots (target, taken_at, body) VALUES (?, ?, ?)",
                    (
                        self.key(snap.target),
                        snap.taken_at,
                        json.dumps(snap.to_dict(), separators=(",", ":")),
                    ),
                )
            for target in {self.key(s.target) for s in snaps}:
                db.execute(
                    "DELETE FROM snapshots WHERE target = ? AND id NOT IN "
                    "(SELECT id FROM snapshots WHERE target = ? ORDER BY id DESC LIMIT ?)",
                    (target, target, self.keep),
                )

    def snapshots(self, target: str, limit: int | None = None) -> list[Snapshot]:
        """The target's stored snapshots, oldest first (at most ``limit``, the newest ones).

        A row that no longer parses (written by a newer orch) is skipped with a warning.
        """
        rows = self._conn.execute(
            "SELECT body FROM snapshots WHERE target = ? ORDER BY id DESC LIMIT ?",
            (self.key(target), limit if limit is not None else self.keep),
        ).fetchall()
        out: list[Snapshot] = []
        for (body,) in reversed(rows):
            try:
                out.append(Snapshot.from_dict(json.loads(body)))
            except (SchemaError, ValueError) as exc:
                log.warning("%s: skipping unreadable stored snapshot: %s", target, exc)
        return out

    def last_runs(self, targets: Iterable[str]) -> dict[str, tuple[str, int]]:
        """``{target: (run_id, log_offset)}`` of each target's newest stored snapshot with a run.

        Read inside SQLite (``json_extract``), without decoding whole snapshots:
        it is what a check needs before it may start asking the targets. Targets
        with no such snapshot are absent; so are all when the SQLite build has no
        JSON functions (the check then reads the log tail only).
        """
        out: dict[str, tuple[str, int]] = {}
        query = (
            "SELECT json_extract(body, '$.run.run_id'), json_extract(body, '$.run.log_offset') "
            "FROM snapshots WHERE target = ? AND json_extract(body, '$.run.run_id') IS NOT NULL "
            "ORDER BY id DESC LIMIT 1"
        )
        try:
            for target in targets:
                row = self._conn.execute(query, (self.key(target),)).fetchone()
                if row is not None and isinstance(row[1], int):
                    out[target] = (str(row[0]), row[1])
        except sqlite3.OperationalError as exc:  # no JSON1 in this SQLite
            log.info("history: cannot read run offsets in SQLite: %s", exc)
            return {}
        return out

    def newest(self, targets: Iterable[str]) -> dict[str, float]:
        """``{target: taken_at}`` (Unix seconds) of each target's newest stored snapshot; targets
        with none are absent."""
        out: dict[str, float] = {}
        for target in targets:
            row = self._conn.execute(
                "SELECT MAX(taken_at) FROM snapshots WHERE target = ?", (self.key(target),)
            ).fetchone()
            if row is not None and row[0] is not None:
                out[target] = float(row[0])
        return out

    # --- alert state -----------------------------------------------------------------------

    def alerts(
        self, targets: Sequence[str] | None = None
    ) -> dict[tuple[str, str, tuple[int, ...]], AlertState]:
        """Active alert states, keyed like :attr:`Finding.key` (all targets when ``None``: with an
        inventory, all of its containers)."""
        rows = self._conn.execute(
            "SELECT target, kind, gpus, severity, summary, first_seen, last_notified FROM alerts"
        ).fetchall()
        names = targets if targets is not None else list(self._keys) or None
        wanted = {self.key(t) for t in names} if names is not None else None
        out = {}
        for key, kind, gpus, severity, summary, first_seen, last_notified in rows:
            if wanted is not None and key not in wanted:
                continue
            state = AlertState(
                target=self._name(key),
                kind=kind,
                gpus=tuple(json.loads(gpus)),
                severity=Severity(severity),
                summary=summary,
                first_seen=first_seen,
                last_notified=last_notified,
            )
            out[state.key] = state
        return out

    def save_alerts(self, targets: Sequence[str], states: Iterable[AlertState]) -> None:
        """Replace the alert state of ``targets`` with ``states`` (one transaction)."""
        with self._write() as db:
            for target in targets:
                db.execute("DELETE FROM alerts WHERE target = ?", (self.key(target),))
            for s in states:
                db.execute(
                    "INSERT OR REPLACE INTO alerts VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (
                        self.key(s.target),
                        s.kind,
                        json.dumps(list(s.gpus)),
                        int(s.severity),
                        s.summary,
                        s.first_seen,
                        s.last_notified,
                    ),
                )

    # --- restart journal -------------------------------------------------------------------

    def journal(self, unit: str | None = None, *, limit: int = JOURNAL_KEEP) -> list[JournalEntry]:
        """A unit's journal entries (every unit's when ``None``), oldest first, at most ``limit``
        (the newest): with an inventory, every unit is one of its containers. An entry that no
        longer parses is skipped with a warning."""
        where = ""
        args: tuple[str, ...] = ()
        if unit is not None:
            where, args = "WHERE unit = ?", (self.key(unit),)
        elif self._keys:
            where = f"WHERE unit IN ({', '.join('?' * len(self._keys))})"
            args = tuple(self._keys.values())
        rows = self._conn.execute(
            f"SELECT id, body, notified_at FROM journal {where} ORDER BY id DESC LIMIT ?",  # constant SQL
            (*args, limit),
        ).fetchall()
        out: list[JournalEntry] = []
        for rowid, body, notified_at in reversed(rows):
            try:
                entry = JournalEntry.from_dict(json.loads(body))
            except (SchemaError, ValueError) as exc:
                log.warning("journal entry %s unreadable: %s", rowid, exc)
                continue
            out.append(replace(entry, id=rowid, notified_at=notified_at))
        return out

    def append_journal(self, entries: Iterable[JournalEntry]) -> list[JournalEntry]:
        """Append entries (one transaction) and trim each unit to :data:`JOURNAL_KEEP`; returns
        them with their ids."""
        out = []
        with self._write() as db:
            for e in entries:
                body = json.dumps(
                    replace(e, id=None, notified_at=None).to_dict(), separators=(",", ":")
                )
                cur = db.execute(
                    "INSERT INTO journal (unit, run_id, at, action, body, notified_at) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    (self.key(e.unit), e.run_id, e.at, e.action, body, e.notified_at),
                )
                out.append(replace(e, id=cur.lastrowid))
            for unit in {self.key(e.unit) for e in out}:
                db.execute(
                    "DELETE FROM journal WHERE unit = ? AND id NOT IN "
                    "(SELECT id FROM journal WHERE unit = ? ORDER BY id DESC LIMIT ?)",
                    (unit, unit, JOURNAL_KEEP),
                )
        return out

    def journal_notified(self, ids: Iterable[int], at: float) -> None:
        """Mark entries as announced (their notice or page was delivered)."""
        with self._write() as db:
            db.executemany(
                "UPDATE journal SET notified_at = ? WHERE id = ?", [(at, i) for i in ids]
            )

    # --- small key/value (e.g. the last host-probe time) -----------------------------------

    def get_meta(self, key: str) -> str | None:
        row = self._conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        with self._write() as db:
            db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))
