"""Reading composed YAML nodes with line numbers: each mistake becomes a one-line ConfigError.

``NodeReader`` walks the nodes of ``yaml.compose`` (SafeLoader) rather than
loaded objects, so every value keeps its line, duplicate keys are caught
(PyYAML's loader silently keeps the last) and nothing can construct an object.
Text keeps its literal spelling (``FOO: yes`` is ``"yes"``). Any YAML file with
file:line errors (playbooks too) can use it.
"""

from __future__ import annotations

import difflib
import math
import os
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

import yaml

from orchestrator.config.limits import Limits
from orchestrator.config.restart import RESTART_KEYS, TRIGGERS, parse_duration
from orchestrator.config.schema import FieldSpec
from orchestrator.errors import ConfigError
from orchestrator.wire.formats import MAX_GPU_INDEX, parse_gpu_spec

TAG = "tag:yaml.org,2002:"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
_SCALARTAGS = {TAG + t for t in ("str", "int", "float", "bool", "null", "timestamp")}


def check_session_name(name: str) -> str | None:
    """Why tmux cannot hold session ``name`` (``None`` when it can).

    >>> check_session_name("train"), check_session_name("run.1")
    (None, "tmux session names cannot contain '.' or ':' (got 'run.1')")
    """
    if not name:
        return "must not be empty"
    if "." in name or ":" in name:
        return f"tmux session names cannot contain '.' or ':' (got {name!r})"
    if not name.isprintable():
        return f"must not contain control characters (got {name!r})"
    return None


def show(text: str, limit: int = 60) -> str:
    """``text`` made safe for a one-line message: control characters escaped, length capped."""
    shown = text if text.isprintable() else repr(text)[1:-1]
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


def join_key(parent: str, key: str) -> str:
    return f"{parent}.{show(key)}" if parent else show(key)


def suggest(word: str, options: list[str] | tuple[str, ...], label: str = "expected one of") -> str:
    """``"; did you mean 'x'?"`` for the nearest option, else ``"; LABEL: a, b, c"``.

    >>> suggest("prot", ["address", "port"]), suggest("zzz", ["address", "port"])
    ("; did you mean 'port'?", '; expected one of: address, port')
    """
    near = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    if near:
        return f"; did you mean {show(near[0])!r}?"
    return f"; {label}: {', '.join(show(o) for o in options)}"


def describe(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    kind = node.tag.removeprefix(TAG) if node.tag.startswith(TAG) else node.tag
    if kind == "null":
        return "null"
    return f"{kind} {show(str(node.value), 40)!r}"


def compose(path: str, text: str) -> yaml.Node | None:
    """YAML ``text`` as nodes (SafeLoader) that keep their lines; ``None`` for an empty document.

    Raises:
        ConfigError: a syntax error, as ``path:line: YAML syntax error: ...``.

    >>> compose("x.yaml", "a: [1\\n")
    Traceback (most recent call last):
    orchestrator.errors.ConfigError: x.yaml:2: YAML syntax error: while parsing a flow sequence, expected ',' or ']', but got '<stream end>'
    """
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        parts = [str(p) for p in (exc.context, exc.problem) if p] or ["invalid YAML"]
        problem = " ".join(", ".join(parts).split())
        raise ConfigError(
            path, mark.line + 1 if mark else None, "", f"YAML syntax error: {problem}"
        ) from exc
    except yaml.reader.ReaderError as exc:
        line = text[: exc.position].count("\n") + 1
        char = chr(exc.character) if isinstance(exc.character, int) else exc.character
        raise ConfigError(
            path, line, "", f"YAML syntax error: character {char!r} is not allowed"
        ) from exc
    except yaml.YAMLError as exc:
        raise ConfigError(path, None, "", f"YAML error: {show(str(exc), 120)}") from exc
    except RecursionError as exc:
        raise ConfigError(path, None, "", "YAML nested too deeply") from exc


OBSERVE_CHOICES = ("auto", "host", "container")
"""``observe:``'s words (hosts.yaml)."""


class NodeReader:
    """Walks composed YAML nodes of one file, turning each mistake into a ConfigError."""

    def __init__(self, path: str, base_dir: Path) -> None:
        self.path, self.base_dir = path, base_dir
        self._constructor = yaml.SafeLoader("")

    def fail(self, node: yaml.Node | None, key: str, problem: str) -> ConfigError:
        line = node.start_mark.line + 1 if node is not None and node.start_mark else None
        return ConfigError(self.path, line, key, problem)

    # --- shapes ---

    def mapping(
        self, node: yaml.Node, key: str, what: str = "key"
    ) -> list[tuple[str, yaml.Node, yaml.Node]]:
        """The (name, key node, value node) entries of a mapping; null counts as empty."""
        if self.is_null(node):
            return []
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, key, f"must be a mapping (got {describe(node)})")
        seen: dict[str, int] = {}
        out = []
        for knode, vnode in node.value:
            if knode.tag == TAG + "merge":
                raise self.fail(
                    knode,
                    key,
                    "YAML merge keys (<<) are not supported; put shared settings under defaults:",
                )
            if not isinstance(knode, yaml.ScalarNode) or self.is_null(knode):
                raise self.fail(knode, key, f"keys must be plain names (got {describe(knode)})")
            name = str(knode.value)
            line = knode.start_mark.line + 1
            if name in seen:
                raise self.fail(
                    knode, join_key(key, name), f"duplicate {what} (first at line {seen[name]})"
                )
            seen[name] = line
            out.append((name, knode, vnode))
        return out

    def is_null(self, node: yaml.Node) -> bool:
        return isinstance(node, yaml.ScalarNode) and node.tag == TAG + "null"

    def scalar(self, node: yaml.Node, key: str, want: str) -> Any:
        """The Python value of a scalar node (str, int, float, bool, None, date)."""
        if not isinstance(node, yaml.ScalarNode):
            raise self.fail(node, key, f"must be {want} (got {describe(node)})")
        if node.tag not in _SCALARTAGS:
            raise self.fail(node, key, f"unsupported YAML tag {show(node.tag)!r}")
        try:
            return self._constructor.construct_object(node, deep=True)
        except (yaml.YAMLError, ValueError, TypeError, AttributeError, OverflowError) as exc:
            # an explicit tag on a bad value (`!!int x`, `!!timestamp x`) fails in PyYAML
            raise self.fail(node, key, f"must be {want} (got {describe(node)})") from exc

    def text(self, node: yaml.Node, key: str, want: str = "a string") -> str:
        """A non-null scalar's literal spelling (no YAML 1.1 bool/number surprises); no NUL."""
        if not isinstance(node, yaml.ScalarNode) or self.is_null(node):
            raise self.fail(node, key, f"must be {want} (got {describe(node)})")
        if node.tag not in _SCALARTAGS:
            raise self.fail(node, key, f"unsupported YAML tag {show(node.tag)!r}")
        value = str(node.value)
        if "\x00" in value:
            raise self.fail(node, key, "contains a NUL byte, which no command or file can carry")
        return value

    def word(self, node: yaml.Node, key: str, want: str) -> str:
        """Text that travels to ssh as one token: not empty, no spaces, no leading '-'."""
        value = self.text(node, key, want)
        if not value or not value.isprintable() or any(c.isspace() for c in value):
            raise self.fail(node, key, f"must be {want} without spaces (got {show(value)!r})")
        if value.startswith("-"):
            raise self.fail(node, key, f"must not start with '-' (got {show(value)!r})")
        return value

    def integer(self, node: yaml.Node, key: str, lo: int, hi: int | None, want: str) -> int:
        value = self.scalar(node, key, want)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(node, key, f"must be {want} (got {describe(node)})")
        if value < lo or (hi is not None and value > hi):
            raise self.fail(node, key, f"must be {want} (got {value})")
        return value

    def number(self, node: yaml.Node, key: str, lo: float, hi: float | None, want: str) -> float:
        value = self.scalar(node, key, want)
        if isinstance(value, str) and node.style is None and _NUMBER.fullmatch(value):
            value = float(value)  # YAML 1.1 reads `1e3` (no dot) as a string
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(node, key, f"must be {want} (got {describe(node)})")
        if not math.isfinite(value) or value < lo or (hi is not None and value > hi):
            raise self.fail(node, key, f"must be {want} (got {value})")
        return float(value)

    # --- field kinds ---

    def field(self, spec: FieldSpec, node: yaml.Node, key: str) -> Any:
        if spec.nullable and self.is_null(node):
            return None
        return getattr(self, "kind_" + spec.kind)(node, key)

    def kind_address(self, node: yaml.Node, key: str) -> str:
        return self.word(node, key, "a host name or IP address")

    def kind_login(self, node: yaml.Node, key: str) -> str:
        return self.word(node, key, "a user name")

    def kind_alias(self, node: yaml.Node, key: str) -> str:
        return self.word(node, key, "a Host alias of ~/.ssh/config")

    def kind_hostref(self, node: yaml.Node, key: str) -> str:
        return self.text(node, key, "a host name")

    def kind_port(self, node: yaml.Node, key: str) -> int:
        return self.integer(node, key, 1, 65535, "an integer from 1 to 65535")

    def kind_seconds(self, node: yaml.Node, key: str) -> float:
        value = self.number(node, key, 0.0, None, "a number of seconds > 0")
        if value <= 0:
            raise self.fail(node, key, f"must be a number of seconds > 0 (got {value})")
        return value

    def kind_vmid(self, node: yaml.Node, key: str) -> int:
        return self.integer(node, key, 100, 999_999_999, "an integer >= 100")

    def kind_path(self, node: yaml.Node, key: str) -> str:
        value = self.text(node, key, "a path")
        if not value:
            raise self.fail(node, key, "must be a path (got an empty string)")
        path = Path(os.path.expanduser(value))
        return str(path if path.is_absolute() else self.base_dir / path)

    def kind_workdir(self, node: yaml.Node, key: str) -> str:
        value = self.text(node, key, "a path")
        if not value or not value.isprintable():
            raise self.fail(node, key, f"must be a path (got {show(value)!r})")
        return value

    def kind_observe(self, node: yaml.Node, key: str) -> str:
        value = self.text(node, key, "auto, host or container")
        if value not in OBSERVE_CHOICES:
            raise self.fail(node, key, f"must be auto, host or container (got {show(value)!r})")
        return value

    def kind_hostdir(self, node: yaml.Node, key: str) -> str:
        value = self.kind_workdir(node, key)
        if not value.startswith("/") or "\n" in value:
            raise self.fail(
                node, key, f"must be an absolute path on the host (got {show(value)!r})"
            )
        return value

    def kind_text(self, node: yaml.Node, key: str) -> str:
        value = self.text(node, key)
        if not value:
            raise self.fail(node, key, "must not be empty")
        return value

    def kind_framework(self, node: yaml.Node, key: str) -> str:
        from orchestrator.wire.progress_readers import BY_NAME

        value = self.text(node, key, "a framework name")
        if value not in BY_NAME:
            known = ", ".join(sorted(BY_NAME))
            raise self.fail(node, key, f"unknown framework {show(value)!r} (known: {known})")
        return value

    def kind_session(self, node: yaml.Node, key: str) -> str:
        value = self.text(node, key, "a tmux session name")
        problem = check_session_name(value)
        if problem:
            raise self.fail(node, key, problem)
        return value

    def kind_command(self, node: yaml.Node, key: str) -> str:
        from orchestrator.wire.quoting import command_line

        if isinstance(node, yaml.SequenceNode):
            argv = [self.text(item, f"{key}[{i}]") for i, item in enumerate(node.value)]
            if not argv:
                raise self.fail(node, key, "must not be an empty list")
            return command_line(argv)
        value = self.text(node, key, "a string or a list of strings")
        if not value.strip():
            raise self.fail(node, key, "must not be empty")
        return value

    def kind_requires(self, node: yaml.Node, key: str) -> tuple[str, ...]:
        if not isinstance(node, yaml.SequenceNode):
            raise self.fail(node, key, f"must be a list of module names (got {describe(node)})")
        out = []
        for i, item in enumerate(node.value):
            name = self.text(item, f"{key}[{i}]", "a module name")
            if not _MODULE.fullmatch(name):
                raise self.fail(item, f"{key}[{i}]", f"not a Python module name: {show(name)!r}")
            out.append(name)
        return tuple(dict.fromkeys(out))

    def kind_env(self, node: yaml.Node, key: str) -> dict[str, str]:
        out = {}
        for name, knode, vnode in self.mapping(node, key):
            if not _ENV_NAME.fullmatch(name):
                raise self.fail(
                    knode,
                    join_key(key, name),
                    "not a valid environment variable name "
                    "(letters, digits, _; not starting with a digit)",
                )
            out[name] = self.text(vnode, join_key(key, name), "a string, '' for empty")
        return out

    def kind_patterns(self, node: yaml.Node, key: str) -> dict[str, str]:
        out = {}
        for name, _knode, vnode in self.mapping(node, key):
            pattern = self.text(vnode, join_key(key, name), "a regular expression")
            try:
                re.compile(pattern)
            except (re.error, OverflowError, RecursionError, ValueError) as exc:
                raise self.fail(
                    vnode, join_key(key, name), f"not a valid regular expression: {exc}"
                ) from exc
            out[name] = pattern
        return out

    def kind_gpus(self, node: yaml.Node, key: str) -> dict[str, tuple[int, ...]]:
        out: dict[str, tuple[int, ...]] = {}
        owner: dict[int, str] = {}
        for role, knode, vnode in self.mapping(node, key):
            rkey = join_key(key, role)
            if not role or not role.isprintable():
                raise self.fail(knode, rkey, "role names must be printable and not empty")
            items = vnode.value if isinstance(vnode, yaml.SequenceNode) else [vnode]
            ids: list[int] = []
            for i, item in enumerate(items):
                ikey = f"{rkey}[{i}]" if isinstance(vnode, yaml.SequenceNode) else rkey
                ids.extend(self._gpu_item(item, ikey))
            for gpu in ids:
                if gpu in owner:
                    where = (
                        "twice in this role"
                        if owner[gpu] == role
                        else f"already in role {owner[gpu]!r}"
                    )
                    raise self.fail(vnode, rkey, f"GPU {gpu} is {where}")
                owner[gpu] = role
            out[role] = tuple(ids)
        return out

    def _gpu_item(self, node: yaml.Node, key: str) -> list[int]:
        want = "a GPU index (integer >= 0) or a range like '0-4'"
        value = self.scalar(node, key, want)
        if isinstance(value, str):
            try:
                return parse_gpu_spec(value)
            except ValueError as exc:
                raise self.fail(node, key, str(exc)) from exc
        return [self.integer(node, key, 0, MAX_GPU_INDEX, f"a GPU index from 0 to {MAX_GPU_INDEX}")]

    def kind_restart(self, node: yaml.Node, key: str) -> dict[str, Any] | None:
        """``restart:`` as validated attribute values, only the keys given (they merge key by
        key with ``defaults.restart``); ``None`` for ``false``/null: restarts off, also when
        ``defaults`` has a policy (:mod:`orchestrator.config.restart`)."""
        if self.is_null(node) or (
            isinstance(node, yaml.ScalarNode) and self.scalar(node, key, "") is False
        ):
            return None
        if isinstance(node, yaml.ScalarNode):
            raise self.fail(node, key, "must be a mapping {max, window, backoff, on, ...} or false")
        by_key = {s.key: s for s in RESTART_KEYS}
        out: dict[str, Any] = {}
        for name, knode, vnode in self.mapping(node, key):
            sub = join_key(key, name)
            spec = by_key.get(name)
            if spec is None:
                raise self.fail(knode, sub, f"unknown key{suggest(name, list(by_key))}")
            out[spec.attr] = self._restart_value(name, vnode, sub)
        return out

    def _duration(self, node: yaml.Node, key: str, *, zero_ok: bool) -> float:
        want = f"a duration {'>=' if zero_ok else '>'} 0 (seconds, or 90s, 15m, 6h)"
        value = self.scalar(node, key, want)
        if isinstance(value, bool) or value is None:
            raise self.fail(node, key, f"must be {want} (got {describe(node)})")
        try:
            seconds = (
                float(value) if isinstance(value, (int, float)) else parse_duration(str(value))
            )
        except ValueError as exc:
            raise self.fail(node, key, str(exc)) from None
        if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not zero_ok):
            raise self.fail(node, key, f"must be {want} (got {value})")
        return seconds

    def _restart_value(self, name: str, node: yaml.Node, key: str) -> Any:
        if name == "max":
            return self.integer(node, key, 0, 1000, "an integer from 0 to 1000")
        if name in ("window", "settle_timeout", "stop_grace"):
            return self._duration(node, key, zero_ok=False)
        if name == "backoff":
            if not isinstance(node, yaml.SequenceNode):
                return (self._duration(node, key, zero_ok=True),)
            if not node.value:
                raise self.fail(node, key, "must not be an empty list")
            return tuple(
                self._duration(n, f"{key}[{i}]", zero_ok=True) for i, n in enumerate(node.value)
            )
        if name == "on":
            if not isinstance(node, yaml.SequenceNode):
                raise self.fail(node, key, f"must be a list of: {', '.join(TRIGGERS)}")
            words = []
            for i, item in enumerate(node.value):
                word = self.text(item, f"{key}[{i}]", "a death kind")
                if word not in TRIGGERS:
                    raise self.fail(
                        item,
                        f"{key}[{i}]",
                        f"unknown death {show(word)!r}{suggest(word, TRIGGERS)}",
                    )
                words.append(word)
            return tuple(dict.fromkeys(words))
        value = self.scalar(node, key, "true or false")  # retry_unknown
        if not isinstance(value, bool):
            raise self.fail(node, key, f"must be true or false (got {describe(node)})")
        return value

    def kind_thresholds(self, node: yaml.Node, key: str) -> dict[str, Any]:
        types = {f.name: str(f.type) for f in fields(Limits)}
        out: dict[str, Any] = {}
        for name, knode, vnode in self.mapping(node, key):
            tkey = join_key(key, name)
            if name not in types:
                raise self.fail(
                    knode,
                    tkey,
                    f"unknown threshold{suggest(name, list(types))}",
                )
            out[name] = self._threshold(name, types[name], vnode, tkey)
        return out

    def _threshold(self, name: str, type_: str, node: yaml.Node, key: str) -> Any:
        if type_ == "tuple[int, ...]":
            if not isinstance(node, yaml.SequenceNode):
                raise self.fail(node, key, f"must be a list of integers (got {describe(node)})")
            return tuple(
                self.integer(n, f"{key}[{i}]", 0, None, "an integer >= 0")
                for i, n in enumerate(node.value)
            )
        if type_.endswith("| None") and self.is_null(node):
            return None
        if type_.startswith("int"):
            lo = 1 if name.endswith("_samples") else 0
            return self.integer(node, key, lo, None, f"an integer >= {lo}")
        if type_.startswith("float"):
            if name.endswith("_ratio"):
                return self.number(node, key, 0.0, 1.0, "a number from 0 to 1")
            return self.number(node, key, 0.0, None, "a number >= 0")
        return self.scalar(node, key, "a value")  # a Limits field of a type added later
