"""Start, verify, stop and inspect runs (changes state): ``orch launch|stop|logs|runs|status|attach``.

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

import importlib.util
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import __version__, deploy
from orchestrator.config.inventory import ContainerConfig, Inventory
from orchestrator.errors import (
    AgentError,
    ContainerNotRunning,
    LaunchFailed,
    OrchError,
    Refused,
    UsageError,
)
from orchestrator.model import Snapshot
from orchestrator.secrets import redact, secret_values
from orchestrator.target import Target, agent_argv, parse_document
from orchestrator.transport.quoting import command_line, with_env

log = logging.getLogger(__name__)

PhaseCallback = Callable[[str, str, str], None]
"""``on_phase(phase, status, detail)``: status is ``start``, ``ok``, ``fail`` or ``skip``."""

VERIFY_MIN_ALIVE_S = 5.0
"""A run must stay alive this long (and write to its log) before launch calls it verified."""
VERIFY_POLL_S = 0.5
IMPORT_CHECK_TIMEOUT_S = 180.0
"""Importing torch on a cold container can take a minute; a hung import is reported."""

_IMPORT_CHECK = r"""
import importlib, json, sys
out = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
        out[name] = None
    except BaseException as exc:
        out[name] = ('%s: %s' % (type(exc).__name__, exc))[:300]
cuda = None
if 'torch' in out and out['torch'] is None:
    try:
        cuda = sys.modules['torch'].cuda.device_count()
    except BaseException:
        pass
print(json.dumps({'modules': out, 'cuda_devices': cuda}))
"""
DFLASH_CONFIG = "dflash-8gpu"
DFLASH_CUDA_DEVICES = 8
"""The bundled ``dflash-8gpu`` config puts work on ``cuda:0`` .. ``cuda:7``."""


class RunDied(LaunchFailed):
    """The run died during launch verification; its facts are attributes (exit 1)."""

    def __init__(
        self,
        message: str,
        state: dict[str, Any],
        exit_status: int | None,
        log_tail: list[str],
        diagnosis: str | None,
    ) -> None:
        self.state, self.exit_status = state, exit_status
        self.log_tail, self.diagnosis = log_tail, diagnosis
        super().__init__(message)


class PreflightRefused(Refused):
    """Preflight found reasons not to start; nothing was started (exit 4).

    >>> str(PreflightRefused("ct200", ["GPU 3 busy", "disk full"]))
    'ct200: launch refused, nothing was started:\\n  - GPU 3 busy\\n  - disk full'
    """

    def __init__(self, target: str, problems: Sequence[str]) -> None:
        self.target, self.problems = target, list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{target}: launch refused, nothing was started:\n{lines}")


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
    state: dict[str, Any] = field(default_factory=dict)
    replaced: dict[str, Any] | None = None
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
            "state": self.state,
            "replaced": self.replaced,
            "phases": list(self.phases),
        }


# --- pure checks -----------------------------------------------------------------------------


def busy_gpus(snapshot: Snapshot, gpus: Sequence[int], busy_mem_mib: float) -> list[str]:
    """One line per assigned GPU that holds memory above ``busy_mem_mib`` or a compute process.

    >>> from orchestrator.model import GpuSample, GpuProcess
    >>> snap = Snapshot(target="ct", taken_at=0, gpus=(
    ...     GpuSample(index=0, memory_used_mib=0.0, processes=()),
    ...     GpuSample(index=3, memory_used_mib=117000.0, processes=(GpuProcess(pid=41, used_memory_mib=116900.0),))))
    >>> busy_gpus(snap, [0, 3], 1024.0)
    ['GPU 3 busy: 117000 MiB used, processes: pid 41 (116900 MiB)']
    >>> busy_gpus(snap, [5], 1024.0)
    ['GPU 5 is assigned but the container does not see it (GPUs seen: 0, 3)']
    """
    seen = {g.index: g for g in snapshot.gpus}
    out = []
    for index in gpus:
        g = seen.get(index)
        if g is None:
            have = ", ".join(str(i) for i in sorted(seen)) or "none"
            out.append(
                f"GPU {index} is assigned but the container does not see it (GPUs seen: {have})"
            )
            continue
        if g.error:
            out.append(f"GPU {index} reports an error: {g.error}")
            continue
        mem = g.memory_used_mib or 0.0
        procs = g.processes or ()
        if mem > busy_mem_mib or procs:
            shown = ", ".join(
                f"pid {p.pid}"
                + (f" ({p.used_memory_mib:.0f} MiB)" if p.used_memory_mib else "")
                + (f" {p.name}" if p.name else "")
                for p in procs
            )
            out.append(
                f"GPU {index} busy: {mem:.0f} MiB used" + (f", processes: {shown}" if shown else "")
            )
    return out


def resolve_gpus(container: ContainerConfig, text: str | None) -> tuple[int, ...]:
    """``--gpus`` (``0-3,6``) or the container's assignment.

    >>> from orchestrator.config.inventory import ContainerConfig
    >>> c = ContainerConfig(name="ct", host="h", gpus={"target": (0, 1), "drafter": (5,)})
    >>> resolve_gpus(c, None), resolve_gpus(c, "2-3")
    ((0, 1, 5), (2, 3))
    """
    from orchestrator.agent.runs import parse_gpus

    if text is None or text == "":
        return container.gpu_indices
    try:
        return parse_gpus(text)
    except ValueError as exc:
        raise UsageError(f"--gpus: {exc}") from None


def parse_env_options(items: Sequence[str]) -> dict[str, str]:
    """``--env K=V`` options to a dict (``UsageError`` on a bad item)."""
    from orchestrator.agent.runs import parse_env

    try:
        return parse_env(items)
    except ValueError as exc:
        raise UsageError(f"--env: {exc}") from None


def new_run_id(name: str | None, now: float | None = None) -> str:
    """``YYYYmmdd-HHMMSS[-NAME]`` (UTC).

    >>> new_run_id("lr3e4", now=0)
    '19700101-000000-lr3e4'
    """
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if now is None else now))
    return f"{stamp}-{name}" if name else stamp


def diagnose(lines: Sequence[str], exit_status: int | None) -> str | None:
    """The playbook diagnosis for a dead run: the best log match, else one for the exit code."""
    try:
        from orchestrator.playbooks import for_exit_code, load_playbooks, match_log

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


# --- the bundled trainer ---------------------------------------------------------------------


_trainer_bundle: deploy.Bundle | None = None


def trainer_root() -> Path:
    """The bundled trainer package's directory (installed beside orchestrator, or found by import).

    Raises:
        OrchError: the trainer is not installed.
    """
    root = Path(__file__).resolve().parents[2] / "trainer"
    if not (root / "__main__.py").is_file():
        spec = importlib.util.find_spec("trainer")
        if spec is None or not spec.origin:
            raise OrchError("the bundled trainer is not installed; pip install orch[trainer]")
        root = Path(spec.origin).resolve().parent
    return root


def trainer_bundle() -> deploy.Bundle:
    """The ``trainer`` package (``*.py`` and ``configs/*.yaml``) as a content-hash bundle."""
    global _trainer_bundle
    if _trainer_bundle is None:
        root = trainer_root()
        files = deploy.package_files(root, "trainer")
        for path in sorted((root / "configs").glob("*.yaml")):
            files[f"trainer/configs/{path.name}"] = path.read_bytes()
        _trainer_bundle = deploy.make_bundle(files, kind="trainer")
    return _trainer_bundle


def _config_arg(trainer_args: Sequence[str]) -> tuple[int, str] | None:
    """(index, value) of a ``--config`` in the extra trainer arguments, else ``None``.

    >>> _config_arg(["--steps", "5", "--config=tiny-cpu"])
    (2, 'tiny-cpu')
    >>> _config_arg(["--config", "/x.yaml"]), _config_arg(["--steps", "5"])
    ((0, '/x.yaml'), None)
    """
    for i, a in enumerate(trainer_args):
        if a == "--config" and i + 1 < len(trainer_args):
            return i, trainer_args[i + 1]
        if a.startswith("--config="):
            return i, a.removeprefix("--config=")
    return None


def check_trainer_args(trainer_args: Sequence[str]) -> None:
    """Refuse extra trainer arguments orch must own; raises ``UsageError`` (exit 2).

    >>> check_trainer_args(["--steps", "100", "--fault", "crash@4"])
    >>> check_trainer_args(["--run-dir", "/tmp/x"])
    Traceback (most recent call last):
    ...
    orchestrator.errors.UsageError: --run-dir is orch's (the run directory, $ORCH_RUN_DIR); drop it
    """
    for a in trainer_args:
        if a == "--run-dir" or a.startswith("--run-dir="):
            raise UsageError("--run-dir is orch's (the run directory, $ORCH_RUN_DIR); drop it")
    if trainer_args and trainer_args[-1] == "--config":
        raise UsageError("--config needs a value: a bundled config name (tiny-cpu) or a path")


def trainer_config(container: ContainerConfig, trainer_args: Sequence[str] = ()) -> str:
    """The bundled trainer's config: ``--config`` in the extra arguments, else hosts.yaml's
    ``trainer_config``, else ``dflash-8gpu`` when GPUs are assigned, else ``tiny-cpu``.

    A bundled config is named without ``/`` (``tiny-cpu``); anything else is a path in the
    container. Launch preflight refuses ``dflash-8gpu`` where torch sees fewer than 8 CUDA
    devices (a CPU-only container with GPUs assigned, like the sandbox's).

    >>> from orchestrator.config.inventory import ContainerConfig
    >>> ct = ContainerConfig(name="ct", host="h", gpus={"all": (0, 1)})
    >>> trainer_config(ct), trainer_config(ct, ["--config", "tiny-cpu"])
    ('dflash-8gpu', 'tiny-cpu')
    """
    given = _config_arg(trainer_args)
    if given is not None:
        return given[1]
    return container.trainer_config or (DFLASH_CONFIG if container.gpu_indices else "tiny-cpu")


def trainer_command(
    container: ContainerConfig, bundle_dir: str, run_dir: str, trainer_args: Sequence[str] = ()
) -> str:
    """The shell command that runs the bundled trainer from ``bundle_dir`` into ``run_dir``.

    The config is :func:`trainer_config`'s; ``trainer_args`` (``orch launch T -- ARGS``)
    follow ``--run-dir``, each one quoted (a ``--config`` among them replaces orch's).

    >>> from orchestrator.config.inventory import ContainerConfig
    >>> trainer_command(ContainerConfig(name="ct", host="h", trainer_config="tiny-cpu"), "/b", "/r")
    'env PYTHONPATH=/b python3 -m trainer --config /b/trainer/configs/tiny-cpu.yaml --run-dir /r'
    >>> trainer_command(ContainerConfig(name="ct", host="h"), "/b", "/r",
    ...                 ["--steps", "9", "--set", "train.lr=1e-3; rm -rf /"])
    "env PYTHONPATH=/b python3 -m trainer --config /b/trainer/configs/tiny-cpu.yaml --run-dir /r --steps 9 --set 'train.lr=1e-3; rm -rf /'"
    """
    check_trainer_args(trainer_args)
    cfg = trainer_config(container, trainer_args)
    if "/" not in cfg:
        cfg = f"{bundle_dir}/trainer/configs/{cfg.removesuffix('.yaml')}.yaml"
    extra = list(trainer_args)
    given = _config_arg(extra)
    if given is not None:  # theirs, resolved like trainer_config, in place of orch's
        i = given[0]
        del extra[i : i + (1 if extra[i].startswith("--config=") else 2)]
    argv = [container.python, "-m", "trainer", "--config", cfg, "--run-dir", run_dir, *extra]
    return command_line(with_env(argv, {"PYTHONPATH": bundle_dir}))


def configured_command(container: ContainerConfig) -> str | None:
    """The container's ``command`` as shell text (an argv list is quoted)."""
    cmd: Any = container.command
    if cmd is None:
        return None
    return cmd if isinstance(cmd, str) else command_line([str(a) for a in cmd])


# --- operator side ---------------------------------------------------------------------------


def _noop(_phase: str, _status: str, _detail: str) -> None:
    pass


def _run_args(c: ContainerConfig) -> list[str]:
    return ["--workdir", c.workdir, "--session", c.session]


def container_status(target: Target) -> str:
    """``pct status`` for a container (``running`` for local); raises ContainerNotFound."""
    status = getattr(target.transport, "status", None)
    return "running" if target.container.is_local or status is None else str(status())


def _imports(target: Target, modules: Sequence[str]) -> tuple[dict[str, str | None], int | None]:
    """Import each module with the container's python: (name -> error text or ``None``,
    ``torch.cuda.device_count()`` when torch imported, else ``None``)."""
    c = target.container
    res = target.transport.run(
        [c.python, "-c", _IMPORT_CHECK, *modules], timeout=IMPORT_CHECK_TIMEOUT_S
    )
    if not res.stdout.strip():
        err = (res.err.strip().splitlines() or ["no output"])[-1][:300]
        return dict.fromkeys(modules, f"{c.python} failed (exit {res.exit_status}): {err}"), None
    doc = parse_document(target.name, res.stdout)
    found = doc.get("modules") or {}
    cuda = doc.get("cuda_devices")
    return {m: found.get(m) for m in modules}, cuda if isinstance(cuda, int) else None


def _cuda_problem(
    name: str, config: str, need: int, cuda_devices: int | None, gpus: Sequence[int]
) -> str | None:
    """Why ``config`` cannot run here (too few CUDA devices for the run), else ``None``.

    The run sees ``min(torch's count, assigned GPUs)`` devices (``CUDA_VISIBLE_DEVICES``).

    >>> _cuda_problem("ct200", "dflash-8gpu", 8, 0, range(8)).split(";")[0]
    "the bundled trainer's config 'dflash-8gpu' needs 8 CUDA devices, torch in ct200 sees 0"
    >>> _cuda_problem("ct200", "dflash-8gpu", 8, 8, range(8)) is None
    True
    """
    if not need or cuda_devices is None:
        return None
    visible = min(cuda_devices, len(gpus)) if gpus else cuda_devices
    if visible >= need:
        return None
    of = f" ({len(gpus)} GPUs assigned)" if gpus and len(gpus) < cuda_devices else ""
    return (
        f"the bundled trainer's config {config!r} needs {need} CUDA devices, torch in {name} "
        f"sees {cuda_devices}{of}; set trainer_config: tiny-cpu for {name} in hosts.yaml, "
        f"or launch with: orch launch {name} -- --config tiny-cpu"
    )


def preflight(
    target: Target,
    *,
    gpus: Sequence[int],
    bundled: bool,
    force: bool,
    config: str | None = None,
) -> dict[str, Any]:
    """Check the container before anything starts; ``PreflightRefused`` lists every problem.

    ``config``: the bundled trainer's config (:func:`trainer_config`); ``dflash-8gpu`` is
    refused where torch sees fewer CUDA devices than it uses. Returns the facts, the
    snapshot's session, the import results and torch's CUDA device count.
    """
    c = target.container
    host = c.host
    state = container_status(target)
    if state != "running":
        raise ContainerNotRunning(host, c.vmid or 0)
    modules = (["torch"] if bundled else []) + [
        m for m in c.requires if m != "torch" or not bundled
    ]
    with ThreadPoolExecutor(max_workers=3) as pool:
        f_snap = pool.submit(target.snapshot)
        f_facts = pool.submit(target.facts)
        f_imp = pool.submit(_imports, target, modules) if modules else None
        snap, facts = f_snap.result(), f_facts.result()
        imports, cuda_devices = f_imp.result() if f_imp else ({}, None)
    problems: list[str] = []
    live = bool(snap.session and snap.session.exists and snap.session.pane_dead is False)
    if live and not force:
        run = snap.run.run_id if snap.run else "unknown run"
        problems.append(
            f"tmux session {c.session!r} is live ({run}); stop it (orch stop {target.name}) "
            f"or relaunch with --force (stops it gracefully, keeps its run directory)"
        )
    if not live or not force:
        # With --force the old run is stopped first and holds the GPUs until then.
        problems += [
            f"{p}; free it (orch stop, or kill the holder) or pick others with --gpus"
            for p in busy_gpus(snap, gpus, c.limits.busy_mem_mib)
        ]
    free_mib = (facts.get("disk") or {}).get("free_mib")
    need_mib = c.limits.min_free_disk_gib * 1024
    if isinstance(free_mib, (int, float)) and free_mib < need_mib:
        problems.append(
            f"only {free_mib / 1024:.1f} GiB free in {c.workdir} (need {c.limits.min_free_disk_gib:g}); "
            f"free disk space (old checkpoints?) or lower thresholds.min_free_disk_gib"
        )
    if not (facts.get("tmux") or {}).get("version"):
        problems.append("tmux is not installed in the container; install it (apt install tmux)")
    for module, err in imports.items():
        if err:
            problems.append(
                f"module {module!r} does not import with {c.python} ({err}); "
                f"install it in the container ({c.python} -m pip install {module})"
            )
    if bundled and config is not None and config.removesuffix(".yaml") == DFLASH_CONFIG:
        why = _cuda_problem(target.name, DFLASH_CONFIG, DFLASH_CUDA_DEVICES, cuda_devices, gpus)
        if why:
            problems.append(why)
    if problems:
        raise PreflightRefused(target.name, problems)
    return {"facts": facts, "live": live, "imports": imports, "snapshot": snap,
            "cuda_devices": cuda_devices}  # fmt: skip


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
) -> LaunchResult:
    """Preflight, deploy, start and verify a run in container ``name`` (see the module doc).

    ``trainer_args`` go to the bundled trainer after orch's own (``orch launch T -- ARGS``);
    with a command (``--cmd`` or hosts.yaml's ``command``) they are a ``UsageError``.

    Raises:
        PreflightRefused: nothing was started (exit 4).
        LaunchFailed: the run died or never proved itself within the startup timeout (exit 1).
        TransportError / ContainerError / AgentError: as they come.
    """
    report = on_phase or _noop
    t0 = time.monotonic()
    phases: list[dict[str, Any]] = []

    def phase(name_: str, status: str, detail: str = "") -> None:
        phases.append({"phase": name_, "status": status, "detail": detail,
                       "at_s": round(time.monotonic() - t0, 3)})  # fmt: skip
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
    run_id = new_run_id(run_name)

    phase("preflight", "start", f"{c.session} on {name}, GPUs {_gpu_text(assigned)}")
    try:
        pre = preflight(tgt, gpus=assigned, bundled=bundled, force=force, config=config)
    except OrchError as exc:
        phase("preflight", "fail", str(exc).splitlines()[0])
        raise
    replaced = None
    if pre["live"] and force:
        phase("preflight", "ok", f"live session {c.session!r}: stopping it first (--force)")
        replaced = stop(inventory, name, grace_s=grace_s, target=tgt,
                        by=f"orch launch --force by {operator()}")  # fmt: skip
        snap = tgt.snapshot()
        busy = busy_gpus(snap, assigned, c.limits.busy_mem_mib)
        if busy:
            phase("preflight", "fail", busy[0])
            raise PreflightRefused(name, [f"{b}; after stopping the old run" for b in busy])
    else:
        phase("preflight", "ok", "container running, GPUs idle, disk free"
              + (", imports ok" if pre["imports"] else ""))  # fmt: skip

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
    assert command is not None

    phase("start", "start", command)
    args = ["launch", *_run_args(c), "--cmd", command, "--run-id", run_id, "--gpus",
            ",".join(str(g) for g in assigned), "--grace", str(grace_s), "--settle", "1.0",
            "--orch-version", __version__, "--target", name]  # fmt: skip
    if force:
        args.append("--force")
    for key, value in user_env.items():
        args += ["--env", f"{key}={value}"]
    doc = tgt.agent(args, timeout=grace_s + 60.0)
    secrets = secret_values(user_env)
    if not doc.get("ok"):
        msg = redact(str(doc.get("message") or doc), secrets)
        phase("start", "fail", msg)
        if doc.get("error") in ("session-live", "run-exists"):
            raise Refused(f"{name}: {msg}")
        raise LaunchFailed(f"{name}: could not start the run: {msg}")
    replaced = replaced or doc.get("replaced")
    phase("start", "ok", f"run {run_id} in tmux session {c.session!r}")
    state = doc.get("state") or {}
    result = dict(
        target=name, run_id=run_id, run_dir=doc["run_dir"], log_path=doc["log_path"],
        session=c.session, command=redact(command, secrets), gpus=assigned, replaced=replaced,
    )  # fmt: skip
    if not verify:
        phase("verify", "skip", "--no-verify")
        return LaunchResult(**result, verified=None, elapsed_s=time.monotonic() - t0,  # type: ignore[arg-type]
                            state=state, phases=tuple(phases))  # fmt: skip

    phase("verify", "start", f"up to {c.limits.startup_timeout_s:g} s")
    try:
        state = verify_run(tgt, run_id, state, timeout_s=c.limits.startup_timeout_s,
                           started=t0, secrets=secrets, on_phase=phase)  # fmt: skip
    except LaunchFailed as exc:
        phase("verify", "fail", str(exc).splitlines()[0])
        raise
    phase("verify", "ok", f"alive, log growing ({state.get('log_size_bytes')} bytes)")
    return LaunchResult(**result, verified=True, elapsed_s=time.monotonic() - t0,  # type: ignore[arg-type]
                        state=state, phases=tuple(phases))  # fmt: skip


def _gpu_text(gpus: Sequence[int]) -> str:
    return ",".join(str(g) for g in gpus) or "none"


def verify_run(
    target: Target,
    run_id: str,
    first: dict[str, Any],
    *,
    timeout_s: float,
    started: float,
    secrets: Sequence[str] = (),
    on_phase: PhaseCallback = _noop,
) -> dict[str, Any]:
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
        st = state.get("state")
        if st in ("exited", "vanished"):
            raise _died(target.name, state, secrets)
        tmux = state.get("tmux") or {}
        pane_ok = tmux.get("exists") and not tmux.get("pane_dead")
        grew = (state.get("log_size_bytes") or 0) > 0
        if (st == "running" and state.get("command_alive") and pane_ok and grew
                and time.monotonic() - alive_since >= VERIFY_MIN_ALIVE_S):  # fmt: skip
            return state
        if time.monotonic() >= deadline:
            why = "wrote nothing to its log" if not grew else "did not settle"
            raise LaunchFailed(
                f"{target.name}: run {run_id} is alive but {why} within {timeout_s:g} s "
                f"(it is still running: orch logs -f {target.name}, orch attach {target.name}, "
                f"or orch stop {target.name})"
            )
        time.sleep(VERIFY_POLL_S)
        state = target.agent(
            ["runs", *_run_args(c), "--run-id", run_id, "--tail", "30"], timeout=30
        )


def _died(name: str, state: dict[str, Any], secrets: Sequence[str]) -> RunDied:
    code = state.get("exit_status")
    tmux = state.get("tmux") or {}
    if code is None and tmux.get("pane_dead_signal"):
        code = 128 + int(tmux["pane_dead_signal"])
    lines = [redact(str(x), secrets) for x in state.get("log_tail") or []]
    how = f"exit status {code}" if code is not None else "no exit status (vanished)"
    diagnosis = diagnose(lines, code)
    tail = "\n".join(f"    | {x}" for x in lines[-15:]) or "    (the log is empty)"
    text = (
        f"{name}: run {state.get('run_id')} died during startup: {how}\n"
        f"  last log lines ({state.get('log_path')}):\n{tail}"
        + (f"\n  diagnosis: {diagnosis}" if diagnosis else "")
        + f"\n  the session and run directory are kept: orch logs {name}, orch postmortem {name}"
    )
    return RunDied(text, state, code, lines, diagnosis)


# --- the rest of the lifecycle ---------------------------------------------------------------


def operator() -> str:
    """``user@host`` of whoever runs orch here (for ``stop_requested``); never raises."""
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "?"
    return f"{user}@{socket.gethostname()}"


def stop(
    inventory: Inventory,
    name: str,
    *,
    grace_s: float = 60.0,
    run_id: str | None = None,
    target: Target | None = None,
    by: str | None = None,
) -> dict[str, Any]:
    """SIGINT, SIGTERM at half the grace, SIGKILL at ``grace_s``; idempotent. Session and run stay.

    The agent first writes ``stop_requested`` in the run directory (time, signal,
    ``by``, default ``orch stop by user@host``): the end reads as a stop, not a crash.
    """
    tgt = target or Target(inventory, name)
    args = ["stop", "--workdir", tgt.container.workdir, "--grace", str(grace_s),
            "--by", by or f"orch stop by {operator()}"]  # fmt: skip
    if run_id:
        args += ["--run-id", run_id]
    doc = tgt.agent(args, timeout=grace_s + 30.0)
    if doc.get("ok") is False:
        raise AgentError(f"{name}: stop: {doc.get('message')}")
    return doc


def runs(inventory: Inventory, name: str, *, target: Target | None = None) -> dict[str, Any]:
    """Every run in the container's workdir with its state and log size."""
    tgt = target or Target(inventory, name)
    return tgt.agent(["runs", *_run_args(tgt.container)], timeout=30)


def logs(
    inventory: Inventory,
    name: str,
    *,
    lines: int = 50,
    run_id: str | None = None,
    target: Target | None = None,
) -> dict[str, Any]:
    """The last ``lines`` lines of a run's log (read from the end, never the whole file)."""
    tgt = target or Target(inventory, name)
    args = ["logs", "--workdir", tgt.container.workdir, "-n", str(lines)]
    if run_id:
        args += ["--run-id", run_id]
    doc = tgt.agent(args, timeout=30)
    if doc.get("ok") is False:
        raise UsageError(f"{name}: {doc.get('message')}")
    return doc


def follow_logs(
    inventory: Inventory,
    name: str,
    *,
    lines: int = 50,
    run_id: str | None = None,
    target: Target | None = None,
    interval_s: float = 0.5,
) -> Iterator[dict[str, Any]]:
    """Chunks of new log lines over one long-lived agent command, by byte offset; ends after exit."""
    tgt = target or Target(inventory, name)
    args = ["logs", "--workdir", tgt.container.workdir, "-n", str(lines), "-f",
            "--interval", str(interval_s)]  # fmt: skip
    if run_id:
        args += ["--run-id", run_id]
    stream = tgt.transport.stream(agent_argv(tgt.container.python, tgt.bundle_dir(), args))
    with stream:
        for line in stream:
            doc = parse_document(tgt.name, line)
            if doc.get("ok") is False:
                raise UsageError(f"{name}: {doc.get('message')}")
            yield doc


def status_one(inventory: Inventory, name: str) -> dict[str, Any]:
    """One row of ``orch status``: never raises; problems are in ``error``.

    ``state`` is the word ``watch`` and ``check`` show (:func:`views.state.target_state`).
    """
    row: dict[str, Any] = {"target": name, "reachable": False, "container": None, "error": None,
                           "state": "unreachable"}  # fmt: skip
    try:
        tgt = Target(inventory, name)
        row["container"] = container_status(tgt)
        if row["container"] != "running":
            row["reachable"], row["state"] = True, "stopped"
            return row
        snap = tgt.snapshot()
    except OrchError as exc:
        row["error"] = str(exc)
        return row
    row["reachable"] = snap.reachable
    return {**row, **summarize(snap, tgt.container)}


def summarize(snap: Snapshot, container: ContainerConfig) -> dict[str, Any]:
    """The status columns from one snapshot (pure)."""
    from orchestrator.monitor.state import target_state

    sess = snap.session
    run = snap.run
    started = run.manifest.started_at if run and run.manifest else None
    gpus = [g for g in snap.gpus if not container.gpu_indices or g.index in container.gpu_indices]
    used = sum(g.memory_used_mib or 0.0 for g in gpus)
    total = sum(g.memory_total_mib or 0.0 for g in gpus)
    if run is None:
        run_state = None
    elif run.exit_status is not None:
        run_state = f"exited {run.exit_status}"
    elif sess and sess.exists and sess.pane_dead is False:
        run_state = "running"
    else:
        run_state = "vanished"
    return {
        "session": None if sess is None else ("live" if sess.exists and sess.pane_dead is False
                                              else "dead pane" if sess.exists else "none"),
        "run_id": run.run_id if run else None,
        "run_state": run_state,
        "state": target_state(snap, startup_grace_s=container.limits.startup_grace_s),
        "age_s": round(snap.taken_at - started, 1) if started else None,
        "step": snap.metrics.step if snap.metrics else None,
        "tokens_per_s": snap.metrics.tokens_per_s if snap.metrics else None,
        "gpus": len(gpus),
        "gpu_mem_used_gib": round(used / 1024, 1),
        "gpu_mem_total_gib": round(total / 1024, 1),
        "gpus_busy": sum(1 for g in gpus if (g.memory_used_mib or 0) > container.limits.busy_mem_mib),
        "errors": list(snap.errors),
    }  # fmt: skip


def status(inventory: Inventory, names: Sequence[str]) -> list[dict[str, Any]]:
    """``orch status``: every target queried concurrently, in the order given."""
    if not names:
        return []
    with ThreadPoolExecutor(max_workers=min(16, len(names))) as pool:
        return list(pool.map(lambda n: status_one(inventory, n), names))


def attach_argv(inventory: Inventory, name: str) -> list[str]:
    """The interactive command that attaches to the run's tmux session.

    Local: ``tmux attach -t =SESSION``. Remote: ``ssh -t`` to the host, then
    ``pct exec VMID -- tmux attach``, the remote part quoted by ``command_line``.
    """
    c = inventory.container(name)
    tmux = ["tmux", "attach-session", "-t", f"={c.session}"]
    if c.is_local:
        return tmux
    host = inventory.host_of(c)
    assert host is not None
    ssh = ["ssh", "-t", "-p", str(host.port), "-o", "StrictHostKeyChecking=yes"]
    if host.identity_file:
        ssh += ["-i", host.identity_file]
    if host.known_hosts:
        ssh += ["-o", f"UserKnownHostsFile={host.known_hosts}"]
    if host.proxy_jump:
        ssh += ["-J", host.proxy_jump]
    dest = host.ssh_config if host.ssh_config and not host.address else host.address
    remote = ["pct", "exec", str(c.vmid), "--", *with_env(tmux, {"TERM": "xterm-256color"})]
    return [*ssh, f"{host.user}@{dest}", command_line(remote)]
