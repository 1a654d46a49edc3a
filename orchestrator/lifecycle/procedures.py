"""Procedures: ``orch playbook run ID TARGET`` plans a procedure playbook's steps for one
container, prints them (the default, a dry run) or carries them out (``--yes``).

Planning (:func:`plan_procedure`) is pure: placeholders filled, ``foreach: gpu`` unrolled
in the target's GPU order, every argv quoted by ``transport.quoting.command_line`` for
display. Carrying out (:func:`run_procedure`) goes step by step and stops at the first
failure:

* argv steps run in the container through ``Target.transport.run`` (no shell);
* ``stop``: remembers the current run (its manifest: command and GPUs), then
  ``stop.stop`` (SIGINT, SIGTERM, SIGKILL at the grace; log and exit status kept); a
  restart (``expect_run``) refuses when the current run is another one;
* ``settle``: waits (up to its ``timeout_s``) until nothing holds the run any more
  (:func:`~orchestrator.lifecycle.preflight.holders`: its pane, its processes, its GPUs'
  memory, compute processes or a ghost reading); fails naming what still holds it;
* ``launch``: ``launch.launch`` (preflight, deploy, start, verify). A run that was started
  with a custom ``--cmd`` is relaunched with the same command and GPUs; a bundled-trainer
  run (or none) is relaunched the way ``orch launch TARGET`` would (``command:`` from
  hosts.yaml, else the bundled trainer) with its old arguments, then the step's
  ``trainer_args`` (each option replacing the old one: :func:`merge_args`). ``resume: auto``
  adds ``--resume auto`` for the bundled trainer, hard-links the previous run's
  ``checkpoints/`` into the new run, and sets ``ORCH_RESUME=auto`` and
  ``ORCH_RESUME_FROM=<previous run dir>`` for any command. A run that finishes (exit 0)
  before its verification ends counts as started;
* ``verify``: ``runs.status_one`` must show a live run (the one just launched, if any), or
  the one just launched finished with exit status 0;
* ``archive``: renames ``path`` to ``<path>.orch-<UTC stamp>`` when it exists. Never deletes.

A step declaring ``overwrites: PATH`` would replace an existing path: before anything is
done, every such path is checked; if one exists and ``force`` is false the whole procedure
is refused (:class:`~orchestrator.errors.Refused`, exit 4, nothing touched). With
``force`` the path is archived (renamed aside) right before its step.

Exit codes of ``orch playbook run``: 0 done (or dry run printed); 1 a step failed (the
steps before it stay done; the message names the step); 2 unknown playbook or target, or
not a procedure; 3 host or container unreachable; 4 refused (an ``overwrites`` path exists
and no ``--force``, or the relaunch's preflight refused).
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.config.inventory import Inventory
from orchestrator.errors import LaunchFailed, OrchError, Refused, UsageError
from orchestrator.playbooks.loader import Playbook
from orchestrator.wire.formats import ARCHIVE_STAMP, utc_stamp
from orchestrator.wire.secrets import secret_values

SETTLE_POLL_S = 1.0
"""Seconds between the ``settle`` action's snapshots."""
ARCHIVE_SUFFIX = ".orch-"
"""Archived paths become ``<path>.orch-<YYYYmmddTHHMMSSZ>``."""

_EXISTING = (
    "import json, os, sys; print(json.dumps([p for p in sys.argv[1:] if os.path.lexists(p)]))"
)
_ARCHIVE = (
    "import os, sys; src, dst = sys.argv[1:3]; "
    "print(os.rename(src, dst) or 'archived ' + src + ' -> ' + dst) "
    "if os.path.lexists(src) else print('nothing to archive: ' + src + ' does not exist')"
)


@dataclass(frozen=True, slots=True)
class PlannedStep:
    """A procedure step with its placeholders filled: what ``--yes`` would do, exactly."""

    number: int
    name: str
    argv: tuple[str, ...] | None = None
    action: str | None = None
    path: str | None = None
    overwrites: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 600.0
    resume: str | None = None
    trainer_args: tuple[str, ...] = ()

    @property
    def display(self) -> str:
        """The exact command line (quoted by transport.quoting) or ``[orch action] NAME``."""
        from orchestrator.wire.quoting import command_line, with_env

        if self.argv is None:
            more = f" {self.path}" if self.path else ""
            more += f" (resume: {self.resume})" if self.resume else ""
            more += (
                f" (trainer args: {command_line(self.trainer_args)})" if self.trainer_args else ""
            )
            return f"[orch action] {self.action}{more}"
        return command_line(with_env(self.argv, self.env or None))

    def to_dict(self) -> dict[str, Any]:
        """JSON form for ``orch playbook run --json``."""
        return {
            "number": self.number,
            "name": self.name,
            "action": self.action,
            "argv": list(self.argv) if self.argv else None,
            "env": self.env,
            "path": self.path,
            "overwrites": self.overwrites,
            "resume": self.resume,
            "trainer_args": list(self.trainer_args),
            "command": self.display,
        }


def procedure_context(container: Any) -> dict[str, Any]:
    """Placeholder values for a container (a ``config.ContainerConfig``).

    ``venv`` is ``<workdir>/.venv-orch``; ``cache_dir`` is the container's
    ``TORCHINDUCTOR_CACHE_DIR`` or torch's default for root (``/tmp/torchinductor_root``).
    """
    return {
        "python": container.python,
        "workdir": container.workdir,
        "session": container.session,
        "target": container.name,
        "gpus": tuple(container.gpu_indices),
        "venv": f"{container.workdir.rstrip('/')}/.venv-orch",
        "cache_dir": container.env.get("TORCHINDUCTOR_CACHE_DIR", "/tmp/torchinductor_root"),
    }


def plan_procedure(pb: Playbook, context: dict[str, Any]) -> list[PlannedStep]:
    """Expand ``pb``'s steps for one target: placeholders filled, ``foreach: gpu`` unrolled in order.

    Raises UsageError for a signature playbook, or a per-GPU step on a target without GPUs.

    >>> from orchestrator.playbooks.loader import get_playbook, load_playbooks
    >>> pb = get_playbook(load_playbooks(), "prewarm-relaunch")
    >>> ctx = {"python": "python3", "workdir": "/w", "session": "train", "target": "t",
    ...        "gpus": (5, 6), "venv": "/w/.venv-orch", "cache_dir": "/tmp/c"}
    >>> [(s.name, s.env.get("CUDA_VISIBLE_DEVICES")) for s in plan_procedure(pb, ctx)[2:4]]
    [('warm up one device at a time (GPU 5)', '5'), ('warm up one device at a time (GPU 6)', '6')]
    """
    if pb.kind != "procedure":
        raise UsageError(
            f"{pb.id} is a signature playbook, not a procedure; see: orch playbook show {pb.id}"
        )
    out: list[PlannedStep] = []
    gpus = tuple(context.get("gpus") or ())
    for step in pb.steps:
        rounds: list[int | None] = [None]
        if step.foreach == "gpu":
            rounds = list(gpus)
            if not rounds:
                raise UsageError(
                    f"{pb.id}: step {step.name!r} runs per GPU but the target has no gpus: in hosts.yaml"
                )
        for g in rounds:
            values = {**context, "gpus": ",".join(str(i) for i in gpus)}
            if g is not None:
                values["gpu"] = str(g)

            def fill(text: str, values: dict[str, Any] = values, name: str = step.name) -> str:
                try:
                    return text.format_map(values)
                except KeyError as exc:
                    raise UsageError(
                        f"{pb.id}: step {name!r}: {{{exc.args[0]}}} only exists in per-GPU steps"
                    ) from None

            out.append(
                PlannedStep(
                    number=len(out) + 1,
                    name=f"{step.name} (GPU {g})" if g is not None else step.name,
                    argv=tuple(fill(a) for a in step.argv) if step.argv else None,
                    action=step.action,
                    path=fill(step.path) if step.path else None,
                    overwrites=fill(step.overwrites) if step.overwrites else None,
                    env={k: fill(v) for k, v in step.env.items()},
                    timeout_s=step.timeout_s,
                    resume=step.resume,
                    trainer_args=step.trainer_args,
                )
            )
    return out


def format_plan(pb_id: str, target: str, steps: Sequence[PlannedStep]) -> str:
    """The dry-run text: every step's exact command, and what ``--yes`` would refuse."""
    lines = [f"dry run: {pb_id} on {target} ({len(steps)} steps); add --yes to act"]
    for s in steps:
        lines.append(f"  {s.number}. {s.name}\n     {s.display}")
        if s.overwrites:
            lines.append(
                f"     overwrites {s.overwrites}: --yes refuses if it exists; "
                f"--yes --force archives it to {s.overwrites}{ARCHIVE_SUFFIX}<time> first"
            )
    return "\n".join(lines)


def archive_name(path: str, now: float | None = None) -> str:
    """Where ``path`` is archived to: ``<path>.orch-<UTC YYYYmmddTHHMMSSZ>``.

    >>> archive_name("/w/.venv-orch/", now=0)
    '/w/.venv-orch.orch-19700101T000000Z'
    """
    stamp = utc_stamp(now, ARCHIVE_STAMP)
    return f"{path.rstrip('/')}{ARCHIVE_SUFFIX}{stamp}"


def merge_args(old: Sequence[str], extra: Sequence[str]) -> tuple[str, ...]:
    """``old`` trainer arguments, then ``extra``; an option of ``extra`` (``--name`` and, unless
    another option follows, its value) first drops the same option from ``old``, so a relaunch
    never carries two (``--warmup none`` becomes ``--warmup sequential``; ``--resume auto``
    is never doubled).

    >>> merge_args(["--steps", "9", "--warmup", "none", "--fault", "x@1"], ["--warmup", "sequential", "--resume", "auto"])
    ('--steps', '9', '--fault', 'x@1', '--warmup', 'sequential', '--resume', 'auto')
    >>> merge_args(["--forever", "--resume", "auto"], ["--resume", "auto"])
    ('--forever', '--resume', 'auto')
    """
    takes_value: dict[str, bool] = {}
    for i, a in enumerate(extra):
        if a.startswith("--"):
            takes_value[a] = i + 1 < len(extra) and not extra[i + 1].startswith("--")
    kept: list[str] = []
    skip = False
    for i, a in enumerate(old):
        if skip:
            skip = False
            continue
        if a in takes_value:
            skip = takes_value[a] and i + 1 < len(old) and not old[i + 1].startswith("--")
            continue
        kept.append(a)
    return (*kept, *extra)


def bundled_trainer_args(command: str, run_dir: str) -> tuple[str, ...] | None:
    """The extra trainer arguments of a manifest's command when it is the bundled trainer
    writing into ``run_dir`` (``orch launch T -- ARGS``), else ``None``.

    The config comes back as ``--config NAME`` for a bundled config (the old bundle's path
    would pin the relaunch to old code), as its path otherwise.

    >>> bundled_trainer_args("env PYTHONPATH=/b python3 -m trainer --config /b/trainer/configs/tiny-cpu.yaml --run-dir /w/runs/r", "/w/runs/r")
    ('--config', 'tiny-cpu')
    >>> bundled_trainer_args("env PYTHONPATH=/b python3 -m trainer --config /c.yaml --run-dir /w/runs/r --forever", "/w/runs/r")
    ('--config', '/c.yaml', '--forever')
    >>> bundled_trainer_args("python3 train.py --run-dir /w/runs/r", "/w/runs/r") is None
    True
    """
    try:
        argv = shlex.split(command)
    except ValueError:
        return None
    pairs = list(zip(argv, argv[1:], strict=False))
    if ("-m", "trainer") not in pairs or ("--run-dir", run_dir) not in pairs:
        return None
    env = dict(a.split("=", 1) for a in argv[: argv.index("-m")] if "=" in a)
    opts = dict(pairs)
    config = opts.get("--config", "")
    bundled = f"{env.get('PYTHONPATH', '')}/trainer/configs/"
    if config.startswith(bundled) and config.endswith(".yaml"):
        config = config.removeprefix(bundled).removesuffix(".yaml")
    extra = argv[argv.index("--run-dir", argv.index("trainer")) + 2 :]
    return (("--config", config) if config else ()) + tuple(extra)


@dataclass
class _Runner:
    """State carried between the steps of one procedure run."""

    inventory: Inventory
    name: str
    force: bool
    echo: Callable[[str], None]
    tgt: Any = None
    relaunch_cmd: str | None = None
    relaunch_args: tuple[str, ...] = ()
    relaunch_gpus: str | None = None
    previous_run: str | None = None
    previous_dir: str | None = None
    launched_run: str | None = None
    launched_finished: bool = False
    by: str | None = None
    expect_run: str | None = None
    settle_timeout_s: float | None = None
    stop_grace_s: float = 60.0
    results: list[dict[str, Any]] = field(default_factory=list)

    def python(self) -> list[str]:
        return [self.tgt.container.python, "-c"]

    def run_argv(self, argv: Sequence[str], step: str, timeout_s: float = 60.0, env=None) -> str:
        result = self.tgt.transport.run(list(argv), timeout=timeout_s, env=env or None)
        if not result.ok:
            tail = (result.err or result.out).strip().splitlines()[-3:]
            raise OrchError(
                f"{self.name}: {step} failed with exit status {result.exit_status}: "
                + (" | ".join(tail) or "(no output)")
            )
        return result.out

    def existing(self, paths: Sequence[str]) -> list[str]:
        out = self.run_argv([*self.python(), _EXISTING, *paths], "checking paths")
        return list(json.loads(out.strip().splitlines()[-1]))

    def archive(self, path: str, step: str) -> str:
        return self.run_argv([*self.python(), _ARCHIVE, path, archive_name(path)], step).strip()

    def remember_run(self) -> None:
        """Note the current run's command and GPUs so ``launch`` can start the same thing."""
        snap = self.tgt.snapshot()
        run = snap.run
        manifest = run.manifest if run else None
        if self.expect_run is not None and (run is None or run.run_id != self.expect_run):
            raise Refused(
                f"{self.name}: refused, nothing was done: the current run is "
                f"{run.run_id if run else 'none'}, not {self.expect_run}, the one to restart"
            )
        if manifest is None:
            self.echo("  no previous run: the relaunch starts what `orch launch` would")
            return
        assert run is not None
        self.previous_run, self.previous_dir = run.run_id, run.run_dir
        args = bundled_trainer_args(manifest.command, run.run_dir)  # type: ignore[union-attr]
        if args is not None:
            self.relaunch_args = args
            self.echo(f"  previous run {manifest.run_id}: bundled trainer {shlex.join(args)}")
        else:
            self.relaunch_cmd = manifest.command
            self.echo(f"  previous run {manifest.run_id}: custom command, relaunched as is")
        if manifest.gpus:
            self.relaunch_gpus = ",".join(str(g) for g in manifest.gpus)

    def settle(self, timeout_s: float) -> str:
        """Wait until :func:`~orchestrator.lifecycle.preflight.holders` is empty (the run's GPUs
        as its manifest names them, else the container's)."""
        from orchestrator.lifecycle.preflight import holders

        c = self.tgt.container
        gpus = (
            tuple(int(g) for g in self.relaunch_gpus.split(","))
            if self.relaunch_gpus
            else c.gpu_indices
        )
        t0 = time.monotonic()
        while True:
            held = holders(self.tgt.snapshot(), gpus, c.limits)
            if not held:
                return f"free after {time.monotonic() - t0:.1f} s (GPUs {','.join(map(str, gpus)) or 'none'})"
            if time.monotonic() - t0 >= timeout_s:
                raise OrchError(
                    f"{self.name}: still held after {timeout_s:g} s, not relaunched: "
                    + "; ".join(held)
                )
            time.sleep(min(SETTLE_POLL_S, max(0.0, timeout_s - (time.monotonic() - t0))))

    def launch(self, step: PlannedStep) -> str:
        from orchestrator.lifecycle import launch as launch_mod
        from orchestrator.lifecycle.bundle import configured_command

        bundled = self.relaunch_cmd is None and configured_command(self.tgt.container) is None
        resume = step.resume == "auto"
        extra = (*step.trainer_args, *(("--resume", "auto") if resume else ()))
        env = []
        if resume and self.previous_dir:
            env = ["ORCH_RESUME=auto", f"ORCH_RESUME_FROM={self.previous_dir}"]
        res = launch_mod.launch(
            self.inventory,
            self.name,
            cmd=self.relaunch_cmd,
            trainer_args=merge_args(self.relaunch_args, extra) if bundled else (),
            gpus=self.relaunch_gpus,
            env=env,
            run_name="relaunch",
            verify=False,
            target=self.tgt,
            carry_from=self.previous_run if resume else None,
            env_from=self.previous_run,  # its --env variables, from its 0600 env file
        )
        self.launched_run = res.run_id  # known before verifying: a restart journals it either way
        assert res.state is not None
        try:
            launch_mod.verify_run(
                self.tgt,
                res.run_id,
                res.state,
                started=time.monotonic(),
                timeout_s=self.tgt.container.limits.startup_timeout_s,
                secrets=secret_values(self.tgt.container.env),
            )
        except launch_mod.RunDied as exc:
            if exc.exit_status != 0:
                raise
            self.launched_finished = True
            return f"run {res.run_id} started and finished (exit status 0) within its verification"
        return f"run {res.run_id} started and verified ({res.log_path})"

    def verify(self) -> str:
        from orchestrator.lifecycle import runs

        row = runs.status_one(self.inventory, self.name)
        if (
            self.launched_finished
            and row.get("run_id") == self.launched_run
            and row.get("run_state") == "exited 0"
        ):
            return f"run {self.launched_run} finished with exit status 0"
        if row.get("error") or row.get("run_state") != "running":
            why = row.get("error") or f"run state {row.get('run_state')!r}"
            raise LaunchFailed(f"{self.name}: not verified: {why}")
        if self.launched_run and row.get("run_id") != self.launched_run:
            raise LaunchFailed(
                f"{self.name}: not verified: the current run is {row.get('run_id')}, "
                f"not the relaunched {self.launched_run}"
            )
        return f"run {row.get('run_id')} is running (session {row.get('session')})"

    def do(self, step: PlannedStep) -> str:
        from orchestrator.lifecycle import stop as stop_mod

        if step.action == "stop":
            self.remember_run()
            doc = stop_mod.stop(
                self.inventory,
                self.name,
                target=self.tgt,
                by=self.by,
                run_id=self.expect_run,
                grace_s=self.stop_grace_s,
            )
            if not doc.stopped:
                return "nothing was running"
            return f"stopped (signals {', '.join(doc.signals) or 'none'}; exit status {doc.exit_status})"
        if step.action == "settle":
            return self.settle(self.settle_timeout_s or step.timeout_s)
        if step.action == "launch":
            return self.launch(step)
        if step.action == "verify":
            return self.verify()
        if step.action == "archive":
            assert step.path is not None
            return self.archive(step.path, f"step {step.number} ({step.name})")
        assert step.argv is not None
        notes = []
        if step.overwrites and self.force:
            notes.append(self.archive(step.overwrites, f"step {step.number} (archiving)"))
        out = self.run_argv(
            step.argv, f"step {step.number} ({step.name})", step.timeout_s, step.env
        )
        return "\n".join([*notes, *out.strip().splitlines()[-5:]])


def run_procedure(
    steps: Sequence[PlannedStep],
    inventory: Inventory,
    target: str,
    *,
    force: bool = False,
    echo: Callable[[str], None] = print,
    by: str | None = None,
    expect_run: str | None = None,
    settle_timeout_s: float | None = None,
    stop_grace_s: float = 60.0,
    launched: list[str] | None = None,
) -> list[dict[str, Any]]:
    """Carry out planned steps in order on ``target``; stops at the first failure.

    Returns one ``{"number", "name", "status": "done", "output"}`` per step. Each step is
    echoed before it runs and its output (last lines) after. A restart (``orch supervise``)
    passes ``by`` (who stops, for ``stop_requested``), ``expect_run`` (the dead run: refused
    when another is current), ``settle_timeout_s`` and ``stop_grace_s`` (its policy's: the stop
    step's grace, seconds) and ``launched``, a list
    that gets the id of the run the ``launch`` step started, even when it died at once.

    Raises:
        Refused: a step's ``overwrites`` path exists and ``force`` is false (nothing done).
        OrchError: a step failed (LaunchFailed for launch/verify, exit 1); the message
            names the step. TransportError: unreachable (exit 3).
    """
    from orchestrator.remote.target import Target

    r = _Runner(
        inventory=inventory,
        name=target,
        force=force,
        echo=echo,
        by=by,
        expect_run=expect_run,
        settle_timeout_s=settle_timeout_s,
        stop_grace_s=stop_grace_s,
    )
    r.tgt = Target(inventory, target)
    guarded = [s for s in steps if s.overwrites]
    if guarded:
        found = set(r.existing([s.overwrites for s in guarded if s.overwrites]))
        clashes = [s for s in guarded if s.overwrites in found]
        if clashes and not force:
            raise Refused(
                f"{target}: refused, nothing was done: "
                + "; ".join(
                    f"step {s.number} ({s.name}) would overwrite {s.overwrites}, which exists"
                    for s in clashes
                )
                + "; add --force to archive it first (renamed aside, never deleted)"
            )
    for step in steps:
        echo(f"[{step.number}/{len(steps)}] {step.name}: {step.display}")
        try:
            output = r.do(step)
        finally:
            if launched is not None and r.launched_run and r.launched_run not in launched:
                launched.append(r.launched_run)
        for line in output.splitlines():
            echo(f"  {line}")
        r.results.append(
            {"number": step.number, "name": step.name, "status": "done", "output": output}
        )
    return r.results
