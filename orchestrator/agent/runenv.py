"""The run's environment: what ``launch`` gets on its stdin, what the run gets, how it is stored.

``orch launch`` sends the run's variables (hosts.yaml ``env``, ``--env``) as one JSON document
on the agent's stdin (``launch --env-stdin``), never as arguments: ``ps`` shows every command
line to everyone on the host and in the container. The agent writes the run's whole
environment (:func:`run_environment`) into the run directory's 0600 ``env`` file
(:func:`env_records`), which the wrapper exports before anything else.

Pure functions; runs inside the container (standard library only).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence

_ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_env(items: Sequence[str]) -> dict[str, str]:
    """``K=V`` items to a dict; the value is kept byte for byte.

    >>> parse_env(["A=1", "B=x=y; $(rm -rf /)"])
    {'A': '1', 'B': 'x=y; $(rm -rf /)'}
    >>> parse_env(["1A=x"])
    Traceback (most recent call last):
    ...
    ValueError: bad --env item '1A=x' (want NAME=VALUE)
    """
    env: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not _ENV_KEY_RE.match(key):
            raise ValueError(f"bad --env item {item!r} (want NAME=VALUE)")
        env[key] = value
    return env


MAX_ENV_DOC_BYTES = 1 << 20
"""Most bytes of the environment document ``launch --env-stdin`` reads."""

_NOT_INHERITED = ("TMUX", "TMUX_PANE")
"""The agent's own variables a run does not get: they name the tmux the agent ran in, if any."""


def parse_env_document(data: bytes) -> dict[str, str]:
    """The run's variables from ``launch --env-stdin``'s stdin: ``{"env": {"NAME": "value"}}``.

    Values arrive byte for byte; an error names the variable, never its value.

    >>> parse_env_document(b'{"env": {"HF_TOKEN": "hf_x", "A": "1 2; $(x)"}}')
    {'HF_TOKEN': 'hf_x', 'A': '1 2; $(x)'}
    >>> parse_env_document(b'{"env": {"HF_TOKEN": 7}}')
    Traceback (most recent call last):
    ...
    ValueError: env document: HF_TOKEN: the value is not a string
    >>> parse_env_document(b"")
    {}
    """
    if len(data) > MAX_ENV_DOC_BYTES:
        raise ValueError(f"env document larger than {MAX_ENV_DOC_BYTES} bytes")
    if not data.strip():
        return {}
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ValueError("env document: not a JSON object in UTF-8") from None
    env = doc.get("env") if isinstance(doc, dict) else None
    if not isinstance(env, dict):
        raise ValueError('env document: want {"env": {"NAME": "value", ...}}')
    for key, value in env.items():
        if not _ENV_KEY_RE.match(key):
            raise ValueError(f"env document: bad variable name {key!r}")
        if not isinstance(value, str) or "\x00" in value:
            what = "holds a NUL byte" if isinstance(value, str) else "is not a string"
            raise ValueError(f"env document: {key}: the value {what}")
    return dict(env)


def run_environment(
    agent_env: Mapping[str, str], env: Mapping[str, str], internal: Mapping[str, str]
) -> dict[str, str]:
    """The run's whole environment: the agent's own, the run's variables, then orch's.

    The agent's own environment is the one its transport set explicitly (under pct:
    ``env -i`` with PATH, HOME, LANG and hosts.yaml's non-secret ``env``), so the run gets
    that and nothing of whichever tmux server happens to run. Names that are not shell
    identifiers and :data:`_NOT_INHERITED` are left out.

    >>> run_environment({"PATH": "/usr/bin", "TMUX": "/tmp/t,1,0", "a-b": "x"},
    ...                 {"HF_TOKEN": "t", "PATH": "/venv/bin"}, {"ORCH_RUN_DIR": "/r"})
    {'PATH': '/venv/bin', 'HF_TOKEN': 't', 'ORCH_RUN_DIR': '/r'}
    """
    base = {k: v for k, v in agent_env.items() if _ENV_KEY_RE.match(k) and k not in _NOT_INHERITED}
    return {**base, **env, **internal}


def env_records(env: Mapping[str, str]) -> bytes:
    """``env`` as the :data:`~orchestrator.agent.rundir.ENV` file holds it: ``NAME=VALUE\\0`` each.

    >>> env_records({"A": "1", "B": "x\\ny"})
    b'A=1\\x00B=x\\ny\\x00'
    """
    return b"".join(f"{k}={v}".encode("utf-8", "surrogateescape") + b"\0" for k, v in env.items())


def parse_env_records(data: bytes) -> dict[str, str]:
    """The :data:`~orchestrator.agent.rundir.ENV` file back: ``NAME=VALUE\\0`` records (a
    record without ``=`` or with a bad name is skipped).

    >>> parse_env_records(b"A=1\\x00B=x\\ny=z\\x00junk\\x00")
    {'A': '1', 'B': 'x\\ny=z'}
    """
    env: dict[str, str] = {}
    for rec in data.split(b"\0"):
        key, sep, value = rec.decode("utf-8", "surrogateescape").partition("=")
        if sep and _ENV_KEY_RE.match(key):
            env[key] = value
    return env


RELAUNCH_OWN = ("CUDA_DEVICE_ORDER", "CUDA_VISIBLE_DEVICES", "PYTHONUNBUFFERED")
"""Variables a relaunch sets itself (:func:`run_env`), never carried from the run it replaces."""


def carried_env(previous: Mapping[str, str], names: Sequence[str]) -> dict[str, str]:
    """The variables of the run a relaunch replaces that it keeps: those the old run was given
    (its manifest's ``env`` names: hosts.yaml ``env``, ``--env``), with their values from its
    0600 ``env`` file; not the GPU assignment nor ``ORCH_*`` (the relaunch sets its own).

    >>> carried_env({"HF_TOKEN": "s", "CUDA_VISIBLE_DEVICES": "0", "PATH": "/b", "ORCH_RESUME": "auto"},
    ...             ["HF_TOKEN", "CUDA_VISIBLE_DEVICES", "ORCH_RESUME", "GONE"])
    {'HF_TOKEN': 's'}
    """
    return {k: previous[k] for k in names
            if k in previous and k not in RELAUNCH_OWN and not k.startswith("ORCH_")}  # fmt: skip


def run_env(user_env: Mapping[str, str], gpus: Sequence[int]) -> dict[str, str]:
    """The variables a run gets: the GPU assignment, unbuffered Python, then the user's.

    >>> run_env({"LR": "1"}, (0, 2))
    {'CUDA_DEVICE_ORDER': 'PCI_BUS_ID', 'CUDA_VISIBLE_DEVICES': '0,2', 'PYTHONUNBUFFERED': '1', 'LR': '1'}
    """
    env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(user_env)
    return env
