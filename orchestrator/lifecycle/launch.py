"""Start and verify a run (changes state): ``orch launch``; its siblings in ``lifecycle/`` hold
the preflight, the trainer bundle, ``stop`` and the read-only ``runs``/``logs``/``status``.

:func:`launch` goes through five phases, each reported to an ``on_phase``
callback (the CLI draws them): **preflight** (container running, no live
session unless ``--force``, assigned GPUs idle, disk free, torch and every
``requires`` module import), **deploy** (the bundled trainer, same content-hash
bundle as the agent, unless a command is given), **start** (the agent's
``launch``: run directory, manifest, wrapper, tmux), **verify** (within the
container's ``startup_timeout_s``: session alive, log exists and grows, process
alive) and **done**. A run that dies during verify fails the launch (exit 1)
with its exit status, last log lines and the playbook diagnosis.

Exit codes: 0 verified; 1 the run died or never proved itself alive
(:class:`~orchestrator.errors.LaunchFailed`); 3 unreachable; 4 refused by
preflight (:class:`PreflightRefused`, nothing was started).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.config.inventory import ContainerConfig, Inventory
from orchestrator.errors import (
    AgentProtocolError,
    AgentRefused,
    LaunchFailed,
    LaunchInterrupted,
    OrchError,
    Refused,
    TransportError,
    UsageError,
)
from orchestrator.lifecycle.bundle import (
    check_trainer_args,
    configured_command,
    runs_on_cpu,
    stand_in_without_torch,
    trainer_bundle,
    trainer_command,
    trainer_config,
)
from orchestrator.lifecycle.preflight import PreflightRefused, busy_gpus, preflight
from orchestrator.lifecycle.runs import launch_request, run_request
from orchestrator.lifecycle.stop import operator, stop
from orchestrator.remote import deploy
from orchestrator.remote.target import Target
from orchestrator.wire.answers import RunStatus, StopAnswer
from orchestrator.wire.formats import new_run_id, parse_gpu_spec
from orchestrator.wire.model import CPU_RUN_ENV
from orchestrator.wire.secrets import redact, secret_values

log = logging.getLogger(__name__)

PhaseCallback = Callable[[str, str, str], None]
"""``on_phase(phase, status, detail)``: status is ``start``, ``ok``, ``fail`` or ``skip``."""

VERIFY_MIN_ALIVE_S = 5.0
"""A run must stay alive this long (and write to its log) before launch calls it verified."""
VERIFY_POLL_S = 0.5
"""Seconds between two looks at a starting run while verifying it, in both launchers (the job
launcher makes one agent call per node a look)."""


class RunDied(LaunchFailed):
    """The run died during launch verification; its facts are attributes (exit 1)."""

    def __init__(
        self,
        message: str,
        state: RunStatus,
        exit_status: int | None,
        log_tail: list[str],
        diagnosis: str | None,
    ) -> None:
        self.state, self.exit_status = state, exit_status
        self.log_tail, self.diagnosis = log_tail, diagnosis
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class LaunchResult:
    """What ``orch launch`` reports. ``verified`` is ``None`` with ``--no-verify``."""

    target: str
    run_id: str
    run_dir: str
    log_path: str
    session: str
    command: str
    gpus: tuple[int, ...]
    verified: bool | None
    elapsed_s: float
    state: RunStatus | None = None
    replaced: StopAnswer | None = None
    phases: tuple[dict[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": True,
            "target": self.target,
            "run_id": self.run_id,
            "run_dir": self.run_dir,
            "log_path": self.log_path,
            "session": self.session,
            "command": self.command,
            "gpus": list(self.gpus),
            "verified": self.verified,
            "elapsed_s": round(self.elapsed_s, 3),
            "state": self.state.to_dict() if self.state is not None else {},
            "replaced": self.replaced.to_dict() if self.replaced is not None else None,
            "phases": list(self.phases),
        }


class LaunchUncertain(TransportError):
    """The connection was lost after the agent was asked to start the run: it may have
    started. Says how to find out, never the agent's boot script.

    >>> str(LaunchUncertain("ct200", "20260101-000000-a", OSError("Socket is closed")))
    ... # doctest: +NORMALIZE_WHITESPACE
    'ct200: the connection was lost after the launch of run 20260101-000000-a was sent
    (Socket is closed): the run may have started. Check with: orch status ct200; orch runs
    ct200; orch logs ct200 --run 20260101-000000-a (a second launch is refused while it lives)'
    """

    def __init__(self, name: str, run_id: str, exc: BaseException) -> None:
        reason = _lost_reason(exc)
        super().__init__(
            f"{name}: the connection was lost after the launch of run {run_id} was sent "
            f"({reason}): the run may have started. Check with: orch status {name}; "
            f"orch runs {name}; orch logs {name} --run {run_id} (a second launch is refused "
            "while it lives)"
        )


def _lost_reason(exc: BaseException) -> str:
    """How the connection was lost, without the remote command line (the agent's boot) and
    without the transport's "unreachable" (the host answered: the run may be live).

    >>> _lost_reason(OSError("h: unreachable: connection lost while running 'pct exec 1 -- x'"))
    'h: connection lost'
    >>> _lost_reason(EOFError())
    'EOFError'
    """
    reason = (str(exc).splitlines() or [""])[0].split(" while running ", 1)[0]
    return reason.replace("unreachable: ", "", 1)[:200] or type(exc).__name__


def resolve_gpus(container: ContainerConfig, text: str | None) -> tuple[int, ...]:
    """``--gpus`` (``0-3,6``) or the container's assignment.

    >>> from orchestrator.config.inventory import ContainerConfig
    >>> c = ContainerConfig(name="ct", host="h", gpus={"target": (0, 1), "drafter": (5,)})
    >>> resolve_gpus(c, None), resolve_gpus(c, "2-3")
    ((0, 1, 5), (2, 3))
    """
    if text is None or text == "":
        return container.gpu_indices
    try:
        return tuple(parse_gpu_spec(text))
    except ValueError as exc:
        raise UsageError(f"--gpus: {exc}") from None


def parse_env_options(items: Sequence[str]) -> dict[str, str]:
    """``--env K=V`` options to a dict (``UsageError`` on a bad item)."""
    from orchestrator.agent.runenv import parse_env

    try:
        return parse_env(items)
    except ValueError as exc:
        raise UsageError(f"--env: {exc}") from None


def diagnose(lines: Sequence[str], exit_status: int | None) -> str | None:
    """The playbook diagnosis for a dead run: the best log match, else one for the exit code."""
    try:
        from orchestrator.playbooks.loader import for_exit_code, load_playbooks, match_log

        books = load_playbooks()
        matches = match_log(lines, books)
        if matches:
            m = matches[0]
            fix = f"; fix: {m.remedy[0]}" if m.remedy else ""
            return f"{m.title} (playbook {m.id}, line: {m.line.strip()[:160]}){fix}"
        if exit_status is not None:
            pb = for_exit_code(exit_status, books)
            if pb is not None:
                fix = f"; fix: {pb.remedy[0]}" if pb.remedy else ""
                return f"{pb.title} (playbook {pb.id}){fix}"
    except (OrchError, ImportError, OSError) as exc:  # a broken playbook must not hide the death
        log.warning("playbooks unavailable for the diagnosis: %s", exc)
    if exit_status == 127:
        return "command not found: check the program name and PATH in the container"
    if exit_status == 126:
        return "command not executable: check its permissions"
    return None


# --- operator side ---------------------------------------------------------------------------


def _noop(_phase: str, _status: str, _detail: str) -> None:
    pass


def launch(
    inventory: Inventory,
    name: str,
    *,
    cmd: str | None = None,
    gpus: str | None = None,
    env: Sequence[str] = (),
    run_name: str | None = None,
    force: bool = False,
    verify: bool = True,
    grace_s: float = 60.0,
    on_phase: PhaseCallback | None = None,
    target: Target | None = None,
    trainer_args: Sequence[str] = (),
    carry_from: str | None = None,
    env_from: str | None = None,
) -> LaunchResult:
    """Preflight, deploy, start and verify a run in container ``name`` (see the module doc).

    ``trainer_args`` go to the bundled trainer after orch's own (``orch launch T -- ARGS``);
    with a command (``--cmd`` or hosts.yaml's ``command``) they are a ``UsageError``.
    ``carry_from``: a run id of the same workdir whose ``checkpoints/`` are hard-linked into the
    new run directory before it starts (a relaunch that resumes; the old run is not changed).
    ``env_from``: a run id whose variables (hosts.yaml ``env``, ``--env``: its 0600 env file,
    read by the agent in the container, never on a command line) the new run gets too.

    Raises:
        PreflightRefused: nothing was started (exit 4).
        LaunchFailed: the run died or never proved itself within the startup timeout (exit 1).
        TransportError / ContainerError / AgentError: as they come.
    """
    report = on_phase or _noop
    t0 = time.monotonic()
    phases: list[dict[str, Any]] = []

    def phase(name_: str, status: str, detail: str = "") -> None:
        phases.append(
            {
                "phase": name_,
                "status": status,
                "detail": detail,
                "at_s": round(time.monotonic() - t0, 3),
            }
        )
        report(name_, status, detail)

    tgt = target or Target(inventory, name)
    c = tgt.container
    assigned = resolve_gpus(c, gpus)
    user_env = {**c.env, **parse_env_options(env)}
    command = cmd or configured_command(c)
    bundled = command is None
    if trainer_args and not bundled:
        raise UsageError(
            "arguments after -- go to the bundled trainer; this launch runs "
            + ("--cmd" if cmd else f"{name}'s command from hosts.yaml")
            + ": put them in that command"
        )
    check_trainer_args(trainer_args)
    config = trainer_config(c, trainer_args) if bundled else None
    if config is not None and runs_on_cpu(config):
        user_env = {**user_env, CPU_RUN_ENV: "cpu"}  # no GPU memory to expect (detect/gpu.py)
    run_id = new_run_id(run_name)
    stand_in = bundled and stand_in_without_torch(user_env, config or "", trainer_args)

    replaced = None
    try:
        phase("preflight", "start", f"{c.session} on {name}, GPUs {_gpu_text(assigned)}")
        try:
            pre = preflight(
                tgt,
                gpus=assigned,
                bundled=bundled,
                force=force,
                config=config,
                gpus_given=bool(gpus),
                torch=bundled and not stand_in,
            )
        except OrchError as exc:
            phase("preflight", "fail", str(exc).splitlines()[0])
            raise
        if pre["live"] and force:
            phase("preflight", "ok", f"live session {c.session!r}: stopping it first (--force)")
            replaced = stop(
                inventory,
                name,
                grace_s=grace_s,
                target=tgt,
                by=f"orch launch --force by {operator()}",
            )
            snap = tgt.snapshot()
            busy = busy_gpus(snap, assigned, c.limits.busy_mem_mib)
            if busy:
                phase("preflight", "fail", busy[0])
                raise PreflightRefused(name, [f"{b}; after stopping the old run" for b in busy])
        else:
            phase(
                "preflight",
                "ok",
                "container running, GPUs idle, disk free"
                + (f", imports ok ({', '.join(pre['imports'])})" if pre["imports"] else "")
                + (", the trainer stand-in: torch not checked" if stand_in else ""),
            )

        run_dir = f"{c.workdir.rstrip('/')}/runs/{run_id}"
        if bundled:
            phase("deploy", "start", "bundled trainer")
            bundle_dir = deploy.ensure_agent(
                tgt.transport, c.workdir, c.python, bundle=trainer_bundle()
            )
            command = trainer_command(c, bundle_dir, run_dir, trainer_args)
            phase("deploy", "ok", bundle_dir)
        else:
            phase("deploy", "skip", "custom command")
    except KeyboardInterrupt:
        left = "; the old run was stopped (--force)" if replaced is not None else ""
        raise LaunchInterrupted(
            f"interrupted before the start step: nothing was started in {name}{left}"
        ) from None
    assert command is not None

    try:
        return _start_and_verify(
            phase,
            tgt,
            name,
            command,
            run_id,
            assigned,
            user_env,
            replaced,
            t0,
            phases,
            grace_s=grace_s,
            force=force,
            carry_from=carry_from,
            env_from=env_from,
            verify=verify,
        )
    except KeyboardInterrupt:
        raise LaunchInterrupted(
            f"interrupted: run {run_id} started in {name} and is still running: "
            f"orch stop {name} stops it (orch status {name} shows it)"
            if any(p["phase"] == "start" and p["status"] == "ok" for p in phases)
            else f"interrupted while starting run {run_id} in {name}: orch status {name} says "
            f"whether it started; orch stop {name} stops it if so"
        ) from None


def _start_and_verify(
    phase: PhaseCallback,
    tgt: Target,
    name: str,
    command: str,
    run_id: str,
    assigned: tuple[int, ...],
    user_env: dict[str, str],
    replaced: Any,
    t0: float,
    phases: list[dict[str, Any]],
    *,
    grace_s: float,
    force: bool,
    carry_from: str | None,
    env_from: str | None = None,
    verify: bool,
) -> LaunchResult:
    """:func:`launch` from its start step: the agent starts the run, then it is verified."""
    c = tgt.container
    phase("start", "start", command)
    req = launch_request(
        c,
        command,
        run_id,
        assigned,
        grace_s=grace_s,
        settle_s=1.0,
        force=force,
        target=name,
        carry_from=carry_from,
        env_from=env_from,
    )
    secrets = secret_values(user_env)
    try:
        answer = tgt.launch(req, user_env, timeout=grace_s + 60.0)
    except (TransportError, AgentProtocolError) as exc:
        phase("start", "fail", "connection lost after the launch was sent")
        raise LaunchUncertain(name, run_id, exc) from None
    except AgentRefused as exc:
        msg = redact(str(exc.said or exc.doc), secrets)
        phase("start", "fail", msg)
        if exc.kind in ("session-live", "run-exists"):
            raise Refused(f"{name}: {msg}") from None
        raise LaunchFailed(f"{name}: could not start the run: {msg}") from None
    replaced = replaced or answer.replaced
    carried = (
        f"; {len(answer.carried)} checkpoint file(s) carried from {carry_from}"
        if carry_from
        else ""
    )
    if answer.carry_error:
        carried += f" ({answer.carry_error})"
    phase("start", "ok", f"run {run_id} in tmux session {c.session!r}{carried}")
    state = answer.state
    result = dict(
        target=name,
        run_id=run_id,
        run_dir=answer.run_dir,
        log_path=answer.log_path,
        session=c.session,
        command=redact(command, secrets),
        gpus=assigned,
        replaced=replaced,
    )
    if not verify:
        phase("verify", "skip", "--no-verify")
        return LaunchResult(
            **result,
            verified=None,
            elapsed_s=time.monotonic() - t0,  # type: ignore[arg-type]
            state=state,
            phases=tuple(phases),
        )

    phase("verify", "start", f"up to {c.limits.startup_timeout_s:g} s")
    try:
        state = verify_run(
            tgt,
            run_id,
            state,
            timeout_s=c.limits.startup_timeout_s,
            started=t0,
            secrets=secrets,
            on_phase=phase,
        )
    except LaunchFailed as exc:
        phase("verify", "fail", str(exc).splitlines()[0])
        raise
    phase("verify", "ok", f"alive, log growing ({state.log_size_bytes} bytes)")
    return LaunchResult(
        **result,
        verified=True,
        elapsed_s=time.monotonic() - t0,  # type: ignore[arg-type]
        state=state,
        phases=tuple(phases),
    )


def _gpu_text(gpus: Sequence[int]) -> str:
    return ",".join(str(g) for g in gpus) or "none"


def verify_run(
    target: Target,
    run_id: str,
    first: RunStatus,
    *,
    timeout_s: float,
    started: float,
    secrets: Sequence[str] = (),
    on_phase: PhaseCallback = _noop,
) -> RunStatus:
    """Poll the run until it proves itself or dies; return its last state.

    Proven: alive (wrapper and command), its session pane alive, the log grew
    since launch, and at least :data:`VERIFY_MIN_ALIVE_S` after start.

    Raises:
        LaunchFailed: it exited or vanished (with exit status, last log lines and
            diagnosis), or it stayed silent for ``timeout_s`` (left running).
    """
    c = target.container
    state = first
    deadline = time.monotonic() + timeout_s
    alive_since = time.monotonic()
    while True:
        if state.state in ("exited", "vanished"):
            raise _died(target.name, state, secrets)
        pane_ok = state.tmux is not None and state.tmux.exists and not state.tmux.pane_dead
        grew = (state.log_size_bytes or 0) > 0
        if (
            state.state == "running"
            and state.command_alive
            and pane_ok
            and grew
            and time.monotonic() - alive_since >= VERIFY_MIN_ALIVE_S
        ):
            return state
        if time.monotonic() >= deadline:
            why = "wrote nothing to its log" if not grew else "did not settle"
            raise LaunchFailed(
                f"{target.name}: run {run_id} is alive but {why} within {timeout_s:g} s "
                f"(it is still running: orch logs -f {target.name}, orch attach {target.name}, "
                f"or orch stop {target.name})"
            )
        time.sleep(VERIFY_POLL_S)
        state = target.call(run_request(c, run_id))


def _died(name: str, state: RunStatus, secrets: Sequence[str]) -> RunDied:
    code = state.exit_status
    if code is None and state.tmux is not None and state.tmux.pane_dead_signal:
        code = 128 + state.tmux.pane_dead_signal
    lines = [redact(str(x), secrets) for x in state.log_tail]
    how = f"exit status {code}" if code is not None else "no exit status (vanished)"
    diagnosis = diagnose(lines, code)
    tail = "\n".join(f"    | {x}" for x in lines[-15:]) or "    (the log is empty)"
    text = (
        f"{name}: run {state.run_id} died during startup: {how}\n"
        f"  last log lines ({state.log_path}):\n{tail}"
        + (f"\n  diagnosis: {diagnosis}" if diagnosis else "")
        + f"\n  the session and run directory are kept: orch logs {name}, orch postmortem {name}"
    )
    return RunDied(text, state, code, lines, diagnosis)
