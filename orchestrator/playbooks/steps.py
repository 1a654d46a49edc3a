"""Procedure steps of ``playbooks/*.yaml`` (``steps:``) and the YAML node helpers every
playbook section is read with (through :class:`~orchestrator.config.reader.NodeReader`, so a
mistake is one ``file:line: key: problem``). :mod:`orchestrator.playbooks.loader` reads the rest;
:mod:`orchestrator.lifecycle.procedures` carries the steps out.
"""

from __future__ import annotations

import shlex
import string
from dataclasses import dataclass, field

import yaml

from orchestrator.config.reader import NodeReader, join_key, suggest

ACTIONS = ("stop", "settle", "launch", "verify", "archive")
"""Built-in procedure actions (orchestrator.lifecycle.procedures; see docs/playbooks.md)."""
PLACEHOLDERS = ("python", "workdir", "session", "target", "gpu", "gpus", "venv", "cache_dir")
"""Names a step's ``run``/``argv``/``env`` may use as ``{name}``."""
RESUME_MODES = ("auto",)
"""``resume:`` values of a ``launch`` step."""
_STEP_KEYS = {
    "name",
    "run",
    "argv",
    "action",
    "path",
    "overwrites",
    "foreach",
    "env",
    "timeout_s",
    "note",
    "resume",
    "trainer_args",
}


@dataclass(frozen=True, slots=True)
class Step:
    """One step of a procedure: an argv to run in the container, or a built-in ``action``.

    ``foreach: gpu`` repeats the step once per GPU of the target, in order (sequential
    warm-up is the point of ``prewarm-relaunch``). ``path`` is the ``archive`` action's
    target; ``overwrites`` names a path an argv step would replace (refused unless
    ``--force``, which archives it first). A ``launch`` step may take ``resume: auto`` (the
    relaunch continues from the previous run's checkpoints: ``--resume auto`` for the bundled
    trainer, ``ORCH_RESUME``/``ORCH_RESUME_FROM`` for a custom command) and ``trainer_args``
    (extra arguments for a relaunched bundled trainer; each option replaces the old run's).
    """

    name: str
    argv: tuple[str, ...] | None = None
    action: str | None = None
    path: str | None = None
    overwrites: str | None = None
    foreach: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 600.0
    note: str | None = None
    resume: str | None = None
    trainer_args: tuple[str, ...] = ()


def fields_of(
    r: NodeReader, node: yaml.Node, key: str, allowed: set[str]
) -> dict[str, tuple[yaml.Node, yaml.Node]]:
    """A mapping's (key node, value node) by name; an unknown key names the nearest allowed one."""
    out = {}
    for name, knode, vnode in r.mapping(node, key):
        if name not in allowed:
            raise r.fail(
                knode,
                join_key(key, name),
                f"unknown key{suggest(name, sorted(allowed), 'allowed')}",
            )
        out[name] = (knode, vnode)
    return out


def text_of(
    r: NodeReader,
    fields: dict[str, tuple[yaml.Node, yaml.Node]],
    name: str,
    parent: yaml.Node,
    key: str,
    *,
    required: bool = True,
) -> str | None:
    """The non-empty string at ``name`` (``None`` when absent and not required)."""
    at = join_key(key, name)
    if name not in fields or r.is_null(fields[name][1]):
        if required:
            raise r.fail(parent, at, "missing (required)")
        return None
    value = r.text(fields[name][1], at, "a non-empty string")
    if not value.strip():
        raise r.fail(fields[name][1], at, "must be a non-empty string")
    return value


def items_of(r: NodeReader, node: yaml.Node | None, key: str, what: str) -> list[yaml.Node]:
    """The item nodes of a list (absent or null: no items)."""
    if node is None or r.is_null(node):
        return []
    if not isinstance(node, yaml.SequenceNode):
        raise r.fail(node, key, f"must be a list of {what}")
    return list(node.value)


def strings_of(r: NodeReader, node: yaml.Node | None, key: str) -> list[str]:
    return [
        r.text(n, f"{key}[{i}]", "a string") for i, n in enumerate(items_of(r, node, key, "str"))
    ]


def check_placeholders(r: NodeReader, node: yaml.Node, key: str, text: str) -> None:
    try:
        names = [f for _, f, _, _ in string.Formatter().parse(text) if f is not None]
    except ValueError as exc:
        raise r.fail(node, key, f"bad placeholder: {exc}") from None
    for name in names:
        if name not in PLACEHOLDERS:
            raise r.fail(
                node, key, f"unknown placeholder {{{name}}}; known: {', '.join(PLACEHOLDERS)}"
            )


def parse_step(r: NodeReader, node: yaml.Node, key: str) -> Step:
    """One procedure step (``steps[i]``); raises ConfigError naming its line and key."""
    if not isinstance(node, yaml.MappingNode):
        raise r.fail(node, key, "a step must be a mapping")
    f = fields_of(r, node, key, _STEP_KEYS)
    name = text_of(r, f, "name", node, key)
    forms = [k for k in ("run", "argv", "action") if k in f]
    if len(forms) != 1:
        raise r.fail(node, key, "needs exactly one of run, argv, action")
    argv: tuple[str, ...] | None = None
    action = None
    if "run" in f:
        run = text_of(r, f, "run", node, key)
        assert run is not None
        check_placeholders(r, f["run"][1], f"{key}.run", run)
        try:
            argv = tuple(shlex.split(run))
        except ValueError as exc:
            raise r.fail(f["run"][1], f"{key}.run", f"cannot split into argv: {exc}") from None
    elif "argv" in f:
        items = items_of(r, f["argv"][1], f"{key}.argv", "str")
        if not items:
            raise r.fail(f["argv"][1], f"{key}.argv", "must not be empty")
        words = [r.text(n, f"{key}.argv[{i}]", "a string") for i, n in enumerate(items)]
        for i, (n, word) in enumerate(zip(items, words, strict=True)):
            check_placeholders(r, n, f"{key}.argv[{i}]", word)
        argv = tuple(words)
    else:
        action = r.text(f["action"][1], f"{key}.action", "an action name")
        if action not in ACTIONS:
            raise r.fail(
                f["action"][1],
                f"{key}.action",
                f"unknown action {action!r}; known: {', '.join(ACTIONS)}",
            )
    path = text_of(r, f, "path", node, key, required=False)
    if (action == "archive") != (path is not None):
        raise r.fail(
            f["path"][1] if "path" in f else node,
            f"{key}.path",
            "the archive action needs path:, and only it takes one",
        )
    overwrites = text_of(r, f, "overwrites", node, key, required=False)
    if overwrites is not None and argv is None:
        raise r.fail(
            f["overwrites"][1], f"{key}.overwrites", "only run/argv steps take overwrites:"
        )
    for k, value in (("path", path), ("overwrites", overwrites)):
        if value is not None:
            check_placeholders(r, f[k][1], f"{key}.{k}", value)
    foreach = text_of(r, f, "foreach", node, key, required=False)
    if foreach is not None and foreach != "gpu":
        raise r.fail(f["foreach"][1], f"{key}.foreach", "only 'gpu' is supported")
    env: dict[str, str] = {}
    if "env" in f:
        env_node = f["env"][1]
        if not isinstance(env_node, yaml.MappingNode) and not r.is_null(env_node):
            raise r.fail(env_node, f"{key}.env", "must be a mapping of NAME: value")
        for name_, _k, vnode in r.mapping(env_node, f"{key}.env"):
            value = r.text(vnode, f"{key}.env.{name_}", "a string or number")
            check_placeholders(r, vnode, f"{key}.env.{name_}", value)
            env[name_] = value
    timeout = 600.0
    if "timeout_s" in f:
        timeout = r.number(
            f["timeout_s"][1], f"{key}.timeout_s", 0.0, None, "a number of seconds > 0"
        )
        if timeout <= 0:
            raise r.fail(f["timeout_s"][1], f"{key}.timeout_s", "must be a number of seconds > 0")
    resume, trainer_args = _relaunch_keys(r, f, action, key)
    return Step(
        name=name or "",
        argv=argv,
        action=action,
        path=path,
        overwrites=overwrites,
        foreach=foreach,
        env=env,
        timeout_s=timeout,
        note=text_of(r, f, "note", node, key, required=False),
        resume=resume,
        trainer_args=trainer_args,
    )


def _relaunch_keys(
    r: NodeReader, f: dict[str, tuple[yaml.Node, yaml.Node]], action: str | None, key: str
) -> tuple[str | None, tuple[str, ...]]:
    """``resume`` and ``trainer_args`` of a ``launch`` step (only it takes them)."""
    for k in ("resume", "trainer_args"):
        if k in f and action != "launch":
            raise r.fail(f[k][0], f"{key}.{k}", "only the launch action takes it")
    resume = None
    if "resume" in f:
        resume = r.text(f["resume"][1], f"{key}.resume", "a resume mode")
        if resume not in RESUME_MODES:
            raise r.fail(
                f["resume"][1], f"{key}.resume", f"must be one of: {', '.join(RESUME_MODES)}"
            )
    args = tuple(
        strings_of(r, f["trainer_args"][1] if "trainer_args" in f else None, f"{key}.trainer_args")
    )
    for i, a in enumerate(args):
        if a in ("--run-dir", "--config") or a.startswith(("--run-dir=", "--config=")):
            raise r.fail(
                f["trainer_args"][1],
                f"{key}.trainer_args[{i}]",
                f"{a.split('=')[0]} is orch's to set, not a relaunch's",
            )
    return resume, args
