"""The bundled trainer: its content-hash bundle, its config and the command that runs it (pure
but for reading the installed package).

``orch launch`` without a command deploys this bundle to ``<workdir>/.orch/trainer-<hash>/``
(:func:`orchestrator.remote.deploy.make_bundle`) and runs :func:`trainer_command`.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator.config.inventory import ContainerConfig
from orchestrator.errors import (
    OrchError,
    UsageError,
)
from orchestrator.remote import deploy
from orchestrator.wire.quoting import command_line, with_env

DFLASH_CONFIG = "dflash-8gpu"


DFLASH_CUDA_DEVICES = 8
"""The bundled ``dflash-8gpu`` config puts work on ``cuda:0`` .. ``cuda:7``."""


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
    argv = [container.python, *trainer_argv(container, bundle_dir, run_dir, trainer_args)]
    return command_line(with_env(argv, {"PYTHONPATH": bundle_dir}))


def trainer_argv(
    container: ContainerConfig, bundle_dir: str, run_dir: str, trainer_args: Sequence[str] = ()
) -> list[str]:
    """The bundled trainer's arguments after the interpreter: ``-m trainer --config ...
    --run-dir ... [trainer_args]`` (a job runs them under torchrun).

    >>> from orchestrator.config.inventory import ContainerConfig
    >>> trainer_argv(ContainerConfig(name="ct", host="h"), "/b", "/r", ["--config", "/c.yaml"])
    ['-m', 'trainer', '--config', '/c.yaml', '--run-dir', '/r']
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
    return ["-m", "trainer", "--config", cfg, "--run-dir", run_dir, *extra]


def configured_command(container: ContainerConfig) -> str | None:
    """The container's ``command`` as shell text (an argv list is quoted)."""
    cmd: Any = container.command
    if cmd is None:
        return None
    return cmd if isinstance(cmd, str) else command_line([str(a) for a in cmd])


def runs_on_cpu(config: str) -> bool:
    """Whether bundled trainer config ``config`` (a name in trainer/configs/) puts every stage
    on the CPU (its ``devices:`` lists only ``cpu``). A path (the container's own file) or an
    unreadable config: False, so nothing is assumed about it.

    >>> runs_on_cpu("tiny-cpu"), runs_on_cpu("instant-cpu.yaml"), runs_on_cpu("dflash-8gpu")
    (True, True, False)
    >>> runs_on_cpu("/etc/their.yaml")
    False
    """
    import yaml

    if "/" in config:
        return False
    try:
        path = trainer_root() / "configs" / f"{config.removesuffix('.yaml')}.yaml"
        doc = yaml.safe_load(path.read_text())
        devices = [d for stage in (doc.get("devices") or {}).values() for d in stage]
    except (OrchError, OSError, yaml.YAMLError, AttributeError, TypeError):
        return False
    return bool(devices) and all(str(d) == "cpu" for d in devices)


STAND_IN_ENV = "TRAINER_STAND_IN"
"""``TRAINER_STAND_IN=1`` in a container's ``env`` runs the torch-free stand-in of the bundled
trainer (``trainer/__main__.py``, ``trainer/standin.py``; the test sandbox sets it)."""


def stand_in_without_torch(env: dict[str, str], config: str, trainer_args: Sequence[str]) -> bool:
    """Whether this bundled run is the stand-in and never imports torch, so launch preflight
    need not time ``import torch`` (~2 CPU-s) for it. Conservative: ``False`` unless ``env``
    selects the stand-in, ``config`` is a bundled all-CPU config (:func:`runs_on_cpu`; a GPU
    config keeps its CUDA check), ``env`` sets no ``WORLD_SIZE`` above 1 and no argument
    makes the stand-in hand the run to the real trainer (``trainer/standin.py``'s one rule,
    :func:`trainer.standin.argv_needs_torch`: a fault only torch fires, ``--compile``, a Hugging
    Face target, torchrun, or arguments it cannot read).

    >>> on = {"TRAINER_STAND_IN": "1"}
    >>> stand_in_without_torch(on, "tiny-cpu", ["--fault", "crash@4"])
    True
    >>> stand_in_without_torch({}, "tiny-cpu", []), stand_in_without_torch(on, "dflash-8gpu", [])
    (False, False)
    >>> stand_in_without_torch(on, "tiny-cpu", ["--fault", "fx-race@3"])
    False
    >>> stand_in_without_torch({**on, "WORLD_SIZE": "2"}, "tiny-cpu", [])
    False
    """
    if env.get(STAND_IN_ENV) != "1" or not runs_on_cpu(config):
        return False
    from trainer.standin import argv_needs_torch  # torch-free; only bundled launches ask

    path = trainer_root() / "configs" / f"{config.removesuffix('.yaml')}.yaml"
    return argv_needs_torch([*trainer_args, "--config", str(path)], env) is None
