"""``orch init``: a starter hosts.yaml from flags or answers, validated before and after writing.

Pure parts (:func:`parse_gpu_roles`, :func:`render`, :func:`check_answer`) apart from the
one that touches the disk (:func:`write_config`). Questions are asked by a
``prompt`` callable the CLI passes in (typer's), so this module never reads a
terminal itself.

An existing file is never replaced without ``force``; with it, the old file is
copied to ``PATH.bak`` (``PATH.bak.1``, ... when that exists: backups are never
overwritten) before the new one is written atomically, 0600.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from orchestrator.config.inventory import (
    Inventory,
    config_search_paths,
    load_inventory,
    parse_inventory,
)
from orchestrator.errors import ConfigError, Refused, UsageError
from orchestrator.wire.formats import gpu_ranges, parse_gpu_spec
from orchestrator.wire.paths import ensure_private_dir, write_private

DEFAULT_ROLE = "target"
_PLAIN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-/~]*")
_YAML_WORDS = {"yes", "no", "true", "false", "on", "off", "null", "y", "n", "~"}


@dataclass(frozen=True, slots=True)
class Answers:
    """What ``orch init`` writes. ``address`` ``None``: the host name (resolved by DNS or
    ``~/.ssh/config``); ``container`` ``None``: ``lxc<vmid>``; ``gpus`` a spec for
    :func:`parse_gpu_roles` (empty: every GPU, no roles)."""

    host: str = "pve1"
    address: str | None = None
    user: str = "root"
    port: int = 22
    vmid: int = 200
    container: str | None = None
    gpus: str = ""
    workdir: str = "/root/orch"
    identity_file: str | None = None

    @property
    def container_name(self) -> str:
        return self.container or f"lxc{self.vmid}"

    @property
    def host_address(self) -> str:
        return self.address or self.host


@dataclass(frozen=True, slots=True)
class Question:
    """One interactive question: the ``Answers`` field it fills and how its text converts."""

    field: str
    text: str


QUESTIONS = (
    Question("host", "Name of the Proxmox host (used in orch commands)"),
    Question("address", "Its address (IP or DNS name) for SSH"),
    Question("user", "SSH user on the host (pct needs root)"),
    Question("port", "SSH port"),
    Question("vmid", "Container id (vmid) you train in"),
    Question("container", "Name for that container in orch"),
    Question("gpus", "GPUs of the container ('0-7', 'target=0-4 drafter=5-7', 'all')"),
    Question("workdir", "Working directory in the container (runs and logs go here)"),
)


def parse_gpu_roles(text: str) -> dict[str, list[int]]:
    """GPU roles from a spec: ``"0-7"`` (role ``target``), ``"target=0-4 drafter=5-7"``,
    or ``""``/``"all"`` (no roles: every GPU). Raises ``ValueError`` saying why.

    >>> parse_gpu_roles("0-7")
    {'target': [0, 1, 2, 3, 4, 5, 6, 7]}
    >>> parse_gpu_roles("target=0-4 drafter=5-7")
    {'target': [0, 1, 2, 3, 4], 'drafter': [5, 6, 7]}
    >>> parse_gpu_roles("all"), parse_gpu_roles(" ")
    ({}, {})
    >>> parse_gpu_roles("target=0-4 drafter=4")
    Traceback (most recent call last):
    ValueError: GPU 4 is in two roles
    >>> parse_gpu_roles("=3")
    Traceback (most recent call last):
    ValueError: '=3': a role needs a name, as in target=0-4
    """
    text = text.strip()
    if text.lower() in ("", "all"):
        return {}
    roles: dict[str, list[int]] = {}
    if "=" not in text:
        return {DEFAULT_ROLE: parse_gpu_spec(text)}
    seen: set[int] = set()
    for part in text.split():
        role, eq, spec = part.partition("=")
        if not eq or not role:
            raise ValueError(f"{part!r}: a role needs a name, as in target=0-4")
        ids = parse_gpu_spec(spec)
        if seen & set(ids):
            raise ValueError(f"GPU {min(seen & set(ids))} is in two roles")
        seen |= set(ids)
        roles[role] = ids
    return roles


def _scalar(value: object) -> str:
    """A YAML scalar for ``value``: plain when that reads back the same, else JSON-quoted.

    >>> _scalar("pve1"), _scalar("yes"), _scalar("a b#c"), _scalar(22)
    ('pve1', '"yes"', '"a b#c"', '22')
    """
    if isinstance(value, int):
        return str(value)
    text = str(value)
    if _PLAIN.fullmatch(text) and text.lower() not in _YAML_WORDS and not _numberish(text):
        return text
    return json.dumps(text, ensure_ascii=False)


def _numberish(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def render(a: Answers) -> str:
    """The hosts.yaml text for ``a`` (commented, valid for :func:`parse_inventory`).

    >>> inv = parse_inventory(render(Answers(address="10.1.2.6", gpus="0-7")))
    >>> inv.hosts["pve1"].address, inv.containers["lxc200"].gpus["target"]
    ('10.1.2.6', (0, 1, 2, 3, 4, 5, 6, 7))
    """
    host, ct = _scalar(a.host), _scalar(a.container_name)
    lines = [
        "# orch inventory, written by `orch init`. Every key: docs/hosts-yaml.md.",
        "# Check it with: orch hosts   and   orch doctor " + a.container_name,
        "# Keep it private (orch warns when others can write it): chmod 600 <this file>",
        "",
        "hosts:",
        f"  {host}:",
        f"    address: {_scalar(a.host_address)}",
        f"    port: {a.port}",
        f"    user: {_scalar(a.user)}",
    ]
    if a.identity_file:
        lines.append(f"    identity_file: {_scalar(a.identity_file)}")
    else:
        lines.append("    # identity_file: ~/.ssh/id_ed25519   # default: ~/.ssh/id_* or ssh-agent")
    lines += [
        f"    # known_hosts: ~/.ssh/known_hosts    # the default; record the key: orch trust {a.host}",
        "",
        "containers:",
        f"  {ct}:",
        f"    host: {host}",
        f"    vmid: {a.vmid}",
        f"    workdir: {_scalar(a.workdir)}",
        "    session: train",
    ]
    roles = parse_gpu_roles(a.gpus)
    if roles:
        lines.append("    gpus:")
        lines += [f"      {_scalar(r)}: {_scalar(gpu_ranges(ids))}" for r, ids in roles.items()]
    else:
        lines.append('    # gpus: {target: "0-4", drafter: "5-7"}   # by role; unset: every GPU')
    lines += [
        "    # env:                 # the run's environment (names with TOKEN/KEY/SECRET/PASSWORD",
        "    #   NCCL_DEBUG: WARN   # are masked in everything orch writes)",
        "    # requires: [torch]    # modules that must import before launch",
        "    # address: 10.20.0.10  # its address on the job network, for jobs: below",
        "",
        "# jobs:                    # one torchrun job over several containers (docs/jobs.md)",
        "#   train:",
        f"#     nodes: [{ct}, lxc201]   # rank order; each node needs its address",
        "#     collective_timeout: 300",
        "",
    ]
    return "\n".join(lines)


def check_answer(answers: Answers, field: str, raw: str) -> Answers:
    """``answers`` with ``field`` set from the text ``raw``, validated through the real schema.

    Raises ``ValueError`` with a message fit to show beside the question.

    >>> check_answer(Answers(), "port", "2222").port
    2222
    >>> check_answer(Answers(), "port", "0")
    Traceback (most recent call last):
    ValueError: hosts.pve1.port: must be an integer from 1 to 65535 (got 0)
    >>> check_answer(Answers(), "vmid", "abc")
    Traceback (most recent call last):
    ValueError: vmid: 'abc' is not a whole number
    """
    value: Any = raw.strip()
    if field in ("port", "vmid"):
        try:
            value = int(value)
        except ValueError:
            raise ValueError(f"{field}: {raw!r} is not a whole number") from None
    elif field in ("address", "container", "identity_file"):
        value = value or None
    updated = replace(answers, **{field: value})
    validate(updated)
    return updated


def validate(a: Answers) -> Inventory:
    """Parse :func:`render` of ``a``; raises ``ValueError`` naming the key (never a file line:
    the file does not exist yet)."""
    try:
        return parse_inventory(render(a), "<answers>")
    except ConfigError as exc:
        raise ValueError(f"{exc.key}: {exc.problem}" if exc.key else exc.problem) from None


def answers_from(given: Mapping[str, Any]) -> Answers:
    """``Answers`` from flag values (``None``: not given, keeps the default).

    Raises:
        UsageError: a value the schema refuses (names the flag's key).
    """
    known = {f.name for f in fields(Answers)}
    values = {k: v for k, v in given.items() if k in known and v is not None}
    a = Answers(**values)
    try:
        parse_gpu_roles(a.gpus)
        validate(a)
    except ValueError as exc:
        raise UsageError(f"orch init: {exc}") from None
    return a


def ask(
    given: Mapping[str, Any], prompt: Callable[[str, str, Callable[[str], Answers]], Answers]
) -> Answers:
    """Fill what ``given`` (flag values) lacks by asking, one question per missing field.

    ``prompt(text, default, convert)`` shows ``text`` with ``default``, passes the answer
    to ``convert`` and asks again while ``convert`` raises ``ValueError`` (typer's
    ``value_proc`` does exactly this); it returns what ``convert`` returned.
    """
    answers = answers_from(given)
    for q in QUESTIONS:
        if given.get(q.field) is not None:
            continue
        default = {
            "address": answers.host_address,
            "container": answers.container_name,
            "gpus": answers.gpus or "all",
        }.get(q.field, str(getattr(answers, q.field)))
        current = answers

        def convert(raw: str, field: str = q.field, base: Answers = current) -> Answers:
            if field == "gpus":
                parse_gpu_roles(raw)
            return check_answer(base, field, raw)

        answers = prompt(q.text, default, convert)
    return answers


def default_out() -> Path:
    """Where ``orch init`` writes when neither ``--out``, ``-c`` nor ``$ORCH_CONFIG`` says:
    ``~/.config/orch/hosts.yaml`` (the last place the lookup order reads)."""
    return config_search_paths()[-1]


def backup_path(path: Path) -> Path:
    """The first free name of ``PATH.bak``, ``PATH.bak.1``, ``PATH.bak.2``, ...

    >>> backup_path(Path("/nonexistent/hosts.yaml")).name
    'hosts.yaml.bak'
    """
    candidate = path.with_name(path.name + ".bak")
    n = 0
    while candidate.exists() or candidate.is_symlink():
        n += 1
        candidate = path.with_name(f"{path.name}.bak.{n}")
    return candidate


@dataclass(frozen=True, slots=True)
class Written:
    """What :func:`write_config` did: the file, the backup of the old one (or ``None``)."""

    path: Path
    backup: Path | None
    inventory: Inventory


def refuse_existing(out: Path, *, force: bool) -> bool:
    """Whether ``out`` exists (so ``force`` will back it up); raises when it may not be replaced.

    Raises:
        Refused: ``out`` exists and ``force`` is false.
        UsageError: ``out`` is a directory.
    """
    out = Path(out).expanduser()
    if out.is_dir():
        raise UsageError(
            f"{out} is a directory; give --out a file path such as {out / 'hosts.yaml'}"
        )
    if not (out.exists() or out.is_symlink()):
        return False
    if not force:
        raise Refused(
            f"{out} already exists; not overwriting it. Use --force to replace it "
            f"(the old file is kept as {backup_path(out).name})"
        )
    return True


def write_config(answers: Answers, out: Path, *, force: bool = False) -> Written:
    """Write the hosts.yaml for ``answers`` to ``out`` (0600, atomic), then load it back.

    Raises:
        Refused: ``out`` exists and ``force`` is false (exit 4; nothing written).
        UsageError: ``out`` is a directory, or cannot be written.
        ConfigError: the written file does not load (a bug: the text was validated).
    """
    out = Path(out).expanduser()
    try:
        text = render(answers)
        validate(answers)
    except ValueError as exc:
        raise UsageError(f"orch init: {exc}") from None
    backup = None
    if refuse_existing(out, force=force):
        backup = backup_path(out)
        try:
            shutil.copy2(out, backup, follow_symlinks=False)
        except OSError as exc:
            raise UsageError(f"cannot back up {out} to {backup}: {exc.strerror or exc}") from None
    try:
        if not out.parent.exists():
            ensure_private_dir(out.parent)
        write_private(out, text)
    except OSError as exc:
        raise UsageError(f"cannot write {out}: {exc.strerror or exc}") from None
    return Written(out, backup, load_inventory(out))


def stdin_is_terminal() -> bool:
    """Whether questions can be asked (stdin is a TTY); ``False`` when it cannot be told."""
    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except (OSError, ValueError):  # closed or detached stdin
        return False
