"""A target with no recent history is sampled twice in one round, on either path; on the host
path the second call reads the kernel log from the same cursor as the first, so a host-wide
event of that window is kept once and the next round continues after the second."""

from __future__ import annotations

from orchestrator.config.inventory import ContainerConfig, HostConfig, Inventory
from orchestrator.monitor import rounds
from orchestrator.monitor.observer import Observer
from orchestrator.wire.model import HostDocument, KernelEvent, Snapshot

STRAY = KernelEvent(
    kind="xid", line="NVRM: Xid (PCI:0000:ee:00): 79, pid=1, name=x", at=9.0, xid=79
)


class Link:
    """A host observer that reads the kernel log after ``cursor`` (as ``host-observe`` does)."""

    def __init__(self, names: list[str], fail_second: bool = False) -> None:
        self.names, self.fail_second = names, fail_second
        self.cursor: str | None = None
        self.since: float | None = None
        self.resume: dict[str, tuple[str, int]] = {}
        self.read_from: list[str | None] = []

    def observe(self, timeout: float = 30.0) -> HostDocument:
        self.read_from.append(self.cursor)
        if self.fail_second and len(self.read_from) == 2:
            raise TimeoutError("no answer within 30 s")
        events = (STRAY,) if self.cursor == "c0" else ()
        self.cursor = f"c{len(self.read_from)}"  # what HostLink.remember does
        at = 10.0 + len(self.read_from)
        return HostDocument(
            "pve1",
            at,
            kernel_cursor=self.cursor,
            containers={"ct": Snapshot("ct", at, source="host")},
            kernel_events=events,
        )


def _inventory() -> Inventory:
    cfg = ContainerConfig(name="ct", host="pve1", vmid=200)
    return Inventory(
        path=None, hosts={"pve1": HostConfig("pve1", "127.0.0.1")}, containers={"ct": cfg}
    )


def _observer(link: Link) -> Observer:
    obs = Observer(_inventory(), ["ct"], host_link=lambda host, names: link)
    obs.cursors["pve1"] = ("c0", 5.0)
    return obs


def test_the_second_host_call_reads_from_the_same_cursor(monkeypatch) -> None:
    monkeypatch.setattr(rounds, "PAIR_GAP_S", 0.0)
    link = Link(["ct"])
    obs = _observer(link)
    got = obs.round(pair={"ct"})
    assert link.read_from == ["c0", "c0"]
    assert set(got.earlier) == {"ct"} and got.snaps["ct"].taken_at == 12.0
    assert got.hosts["pve1"].events == [STRAY]  # in both documents, kept once
    assert got.cursors["pve1"][0] == obs.cursors["pve1"][0] == "c2"
    obs.round()  # the next round continues after the second call, unpaired
    assert link.read_from == ["c0", "c0", "c2"]


def test_a_failed_second_sample_keeps_the_first(monkeypatch) -> None:
    monkeypatch.setattr(rounds, "PAIR_GAP_S", 0.0)
    link = Link(["ct"], fail_second=True)
    obs = _observer(link)
    got = obs.round(pair={"ct"})
    assert got.snaps["ct"].reachable and got.snaps["ct"].taken_at == 11.0
    assert not got.earlier and got.hosts["pve1"].events == [STRAY]
    assert obs.cursors["pve1"][0] == "c1"  # where the first read stopped


def test_the_deadline_during_the_second_sample_keeps_the_first() -> None:
    pair = rounds.Pair(lambda: "first", lambda first: "second")
    pair.first = "first"  # the first answered; the round's deadline cut the second short
    got = rounds.settle({"t:ct": pair}, {"t:ct": TimeoutError("no answer within 30 s")})
    assert got == {"t:ct": "first"}


def test_a_read_that_continues_the_log_keeps_the_runs_newest_progress(monkeypatch) -> None:
    """The second sample of a pair reads the log after the first's offset: a stalled run prints
    nothing there, yet its step is still the first's (check --json shows it, stall sees it)."""
    from orchestrator.wire.model import Metrics, RunState

    monkeypatch.setattr(rounds, "PAIR_GAP_S", 0.0)
    run = RunState("r1", "/w/runs/r1", log_offset=10)
    seen = [Metrics(step=74, loss=2.5), None]

    def fetch(name: str, resume: tuple[str, int] | None) -> Snapshot:
        return Snapshot(name, 20.0 + len(seen), run=run, metrics=seen.pop(0))

    obs = Observer(
        Inventory(path=None, hosts={}, containers={"ct": ContainerConfig(name="ct", host="local")}),
        ["ct"],
        fetch=fetch,
    )
    got = obs.round(pair={"ct"})
    assert got.snaps["ct"].metrics == Metrics(step=74, loss=2.5)
    other = RunState("r2", "/w/runs/r2")  # a new run: the old run's progress is not its own
    assert obs.carry(Snapshot("ct", 30.0, run=other)).metrics is None
