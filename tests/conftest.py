"""Fixtures shared by every test area (small, additive; one section per owner)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# --- parallel runs (pytest-xdist: ``./dev test``; README, "Tests") ---------------------------
#
# Every pytest process, each xdist worker included, makes its own sandboxes: the session
# fixtures below take their state directory from ``tmp_path_factory`` (one base per worker),
# and everything a sandbox names on the machine derives from that path (cgroup prefix
# ``orch-<id>``, network namespaces ``orchj-<id>``, the lxcpath, sshd on a free port), so two
# workers never share a container, a port or a namespace. What remains machine-wide is
# below: the history database, and the tests that load every CPU on purpose (``serial``).

E2E_FIXTURES = frozenset({"sandbox", "sandbox_config", "sandbox_scenario", "job_cluster", "fleet"})
"""A test that uses one of these goes through a sandbox: it is ``e2e`` (``-m 'not e2e'``
is the quick local loop) whether or not its module says so."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if names & E2E_FIXTURES and item.get_closest_marker("e2e") is None:
            item.add_marker(pytest.mark.e2e)
    longest_modules_first(items)


# xdist's --dist loadscope hands each worker one module at a time, in collection order (with
# --no-loadscope-reorder; by default it sorts modules by their number of tests, which puts the
# end-to-end modules, a few long tests each, last, and one worker alone at the end). The
# longest modules first, the many short ones after them to fill the gaps, ends every worker
# at about the same time. How long each takes: tests/durations.txt.

DURATIONS = Path(__file__).with_name("durations.txt")


def module_seconds(text: str) -> dict[str, float]:
    """``SECONDS PATH`` lines (``#`` comments) to path -> seconds.

    >>> module_seconds("# x\\n12.5 tests/a/test_b.py\\n\\n")
    {'tests/a/test_b.py': 12.5}
    """
    out = {}
    for line in text.splitlines():
        seconds, _, path = line.partition("#")[0].strip().partition(" ")
        if path:
            out[path.strip()] = float(seconds)
    return out


def longest_modules_first(items: list[pytest.Item]) -> None:
    """Reorder ``items`` by module, longest first (tests/durations.txt, else :func:`_guess`
    per test), each module's own order kept (a stable sort).
    Deterministic: every xdist worker collects the same order, as xdist requires."""
    try:
        known = module_seconds(DURATIONS.read_text())
    except OSError:
        known = {}
    root = Path(__file__).resolve().parents[1]
    module: dict[int, str] = {}
    guess: dict[str, float] = {}
    for item in items:
        path = Path(str(item.path)).resolve()
        mod = str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
        module[id(item)] = mod
        guess[mod] = guess.get(mod, 0.0) + _guess(item)
    weight = {mod: known.get(mod, g) for mod, g in guess.items()}
    items.sort(key=lambda item: -weight[module[id(item)]])


def _guess(item: pytest.Item) -> float:
    """Seconds a test not in tests/durations.txt is taken to last: 5 end to end, 2 slow."""
    if item.get_closest_marker("e2e"):
        return 5.0
    return 2.0 if item.get_closest_marker("slow") else 0.01


@pytest.fixture(scope="session", autouse=True)
def own_history_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """``$ORCH_DB`` for this pytest process (one per xdist worker), unless the caller set one:
    a test that runs orch without ``--db`` never writes the operator's
    ``~/.local/state/orch/orch.db``, nor one another worker writes at the same time."""
    if os.environ.get("ORCH_DB"):
        yield
        return
    os.environ["ORCH_DB"] = str(tmp_path_factory.mktemp("history") / "orch.db")
    try:
        yield
    finally:
        os.environ.pop("ORCH_DB", None)


@pytest.fixture(scope="session", autouse=True)
def own_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """``$XDG_CACHE_HOME`` for this pytest process, unless the caller set one: the playbook
    cache of every tmp playbook directory a test loads lands there, not in ~/.cache/orch."""
    if os.environ.get("XDG_CACHE_HOME"):
        yield
        return
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("cache"))
    try:
        yield
    finally:
        os.environ.pop("XDG_CACHE_HOME", None)


# --- sandbox ---------------------------------------------------------------------------------

# ORCH_TEST_LXC_KIND=unprivileged: every sandbox the tests start has unprivileged containers
# (orchestrator/sandbox/unpriv.py), and the temporary directories live where uid 100000 may
# enter: LXC refuses a container whose lxcpath it cannot reach ("Could not access
# /tmp/pytest-of-root. Please grant it x access"), and every pytest session on the machine
# resets /tmp/pytest-of-<user> to 0700.
UNPRIVILEGED = os.environ.get("ORCH_TEST_LXC_KIND") == "unprivileged"
if UNPRIVILEGED:
    os.environ["ORCH_SANDBOX_KIND"] = "unprivileged"


@pytest.hookimpl(tryfirst=True)  # before the tmp_path plugin reads --basetemp
def pytest_configure(config: pytest.Config) -> None:
    if not UNPRIVILEGED:
        return
    if not config.option.basetemp and not hasattr(config, "workerinput"):
        config.option.basetemp = f"/tmp/orch-unprivileged-{os.getpid()}"
    mktemp = pytest.TempPathFactory.mktemp

    def traversable(self: pytest.TempPathFactory, basename: str, numbered: bool = True) -> Path:
        path = mktemp(self, basename, numbered)  # pytest makes it 0700
        path.chmod(0o711)
        return path

    pytest.TempPathFactory.mktemp = traversable  # type: ignore[method-assign]


@pytest.fixture(scope="session", autouse=True)
def _traversable_basetemp(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Unprivileged containers: traversal (x, not listing) of the base temp directory for
    the containers' mapped root."""
    if UNPRIVILEGED:
        base = tmp_path_factory.getbasetemp()
        for path in (base.parent, base):
            if path.stat().st_uid == os.getuid() and path != Path("/tmp"):
                path.chmod(path.stat().st_mode | 0o011)


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A running sandbox for the whole session: 3 containers (ct200-ct202), 8 GPUs, healthy.

    Real LXC containers where they can run (root, the lxc package), else process mode;
    ``ORCH_TEST_ISOLATION=lxc|process`` forces one. Yields
    ``orchestrator.sandbox.manager.SandboxInfo`` (``config_path`` is its hosts.yaml;
    ``workdir(ct)`` the host path of a workdir, ``container_workdir(ct)`` orch's);
    tears everything down (containers, sshd, cgroups) at the end. Skips when tmux,
    sshd or a C compiler is missing (the message names the apt package).
    """
    from orchestrator.sandbox import manager
    from orchestrator.sandbox.fakenvml import MissingTool
    from tests.helpers import SANDBOX_ISOLATION

    state_dir: Path = tmp_path_factory.mktemp("sandbox")
    try:
        info = manager.up(
            state_dir, containers=3, gpus=8, scenario="healthy", isolation=SANDBOX_ISOLATION
        )
    except MissingTool as exc:
        pytest.skip(str(exc))
    try:
        yield info
    finally:
        manager.down(state_dir)


@pytest.fixture
def sandbox_scenario(sandbox: object) -> Iterator[Callable[[object], str]]:
    """A function that switches the session sandbox's scenario; ``healthy`` is restored afterwards."""
    from orchestrator.sandbox import manager

    state_dir = sandbox.state_dir  # type: ignore[attr-defined]
    yield lambda scenario: manager.set_scenario(state_dir, scenario)  # type: ignore[arg-type]
    manager.set_scenario(state_dir, "healthy")


# --- launch (shared by e2e areas) ------------------------------------------------------------


@pytest.fixture(scope="session")
def sandbox_config(
    sandbox: object, tmp_path_factory: pytest.TempPathFactory
) -> Callable[..., Path]:
    """A function writing a copy of the sandbox's hosts.yaml with changes; returns its path.

    ``write(session=None, *, host=None, containers=None, **every)``: ``session`` sets
    every container's tmux session (use one per test area so areas never share a
    run); ``every`` sets keys on every container (a callable value is called with
    that container's dict, e.g. ``env=lambda ct: {"X": ct["workdir"] + "/x"}``);
    ``containers`` (``{"ct201": {...}}``) then sets keys on one container;
    ``host`` updates the sandbox host. Each call writes a new file (0600) in its own
    temporary directory; the sandbox's own file is never touched.
    """
    import yaml

    base = Path(sandbox.config_path).read_text()  # type: ignore[attr-defined]

    def write(
        session: str | None = None,
        *,
        host: dict[str, object] | None = None,
        containers: dict[str, dict[str, object]] | None = None,
        **every: object,
    ) -> Path:
        doc = yaml.safe_load(base)
        if session is not None:
            every = {"session": session, **every}
        for ct in doc["containers"].values():
            ct.update({k: v(ct) if callable(v) else v for k, v in every.items()})
        for name, over in (containers or {}).items():
            doc["containers"][name].update(over)
        for h in doc["hosts"].values():
            h.update(host or {})
        path = tmp_path_factory.mktemp("config") / "hosts.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        path.chmod(0o600)
        return path

    return write


# --- jobs ------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def job_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """4 LXC containers on 2 simulated hosts on one job network (tests/jobs/cluster.py), for
    the multi-node job tests; skipped where real LXC containers or ``ip`` are not available.
    Each test undoes its own faults (``cluster.cleanup()``)."""
    from orchestrator.sandbox import lxc, manager, network
    from tests.helpers import SANDBOX_ISOLATION
    from tests.jobs.cluster import start

    why = lxc.unavailable() or network.unavailable()
    if why is not None or SANDBOX_ISOLATION == "process":
        pytest.skip(
            f"multi-node jobs need LXC containers and a job network: {why or 'process mode'}"
        )
    state_dir: Path = tmp_path_factory.mktemp("jobs-sandbox")
    cluster = start(state_dir, tmp_path_factory.mktemp("jobs"))
    try:
        yield cluster
    finally:
        cluster.cleanup()
        manager.down(state_dir)
