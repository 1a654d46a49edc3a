"""Dataclasses to JSON-native data and back, by their type hints (the wire's generic half).

:func:`dump` gives JSON-native data; :func:`from_dict` reads it back and checks every value
against the field's type hint (SchemaError naming the path of the first that does not fit).
Stdlib only: shipped with the agent, as the rest of ``orchestrator/wire``.
"""

from __future__ import annotations

import dataclasses
import enum
import sys
import types
import typing
from typing import Any, TypeVar

T = TypeVar("T")


class SchemaError(ValueError):
    """A dict could not be read as the dataclass asked for (wrong type, future schema)."""


MAX_INT = 2**53
"""Every integer of the wire is below this in magnitude (a step, a PID, a byte count): the
largest a float, and so every JSON reader, holds exactly; a 400-digit step is a SchemaError."""

_HINTS: dict[type, dict[str, Any]] = {}
_NAMES: dict[type, tuple[str, ...]] = {}
"""Each dataclass's field names (``dataclasses.fields`` once per class, not per value)."""
AS_TEXT: set[type] = set()
"""Enum types written as ``str(value)``, not their value (wire.model: ``Severity``, by name)."""


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls, vars(sys.modules[cls.__module__]))
    return _HINTS[cls]


_AS_IS = frozenset({str, int, float, bool, type(None)})
"""Types :func:`dump` writes as they are: most values of a document (no dataclass check for each)."""


def dump(value: Any) -> Any:
    """``value`` (dataclasses, enums, lists, dicts) as JSON-native data."""
    if type(value) in _AS_IS:
        return value
    names = _NAMES.get(type(value))
    if names is None and dataclasses.is_dataclass(value) and not isinstance(value, type):
        names = _NAMES[type(value)] = tuple(f.name for f in dataclasses.fields(value))
    if names is not None:
        return {n: dump(getattr(value, n)) for n in names}
    if isinstance(value, enum.Enum):
        return str(value) if type(value) in AS_TEXT else value.value
    if isinstance(value, (list, tuple)):
        return [dump(v) for v in value]
    if isinstance(value, dict):
        return {str(k): dump(v) for k, v in value.items()}
    return value


Conv = typing.Callable[[Any, str], Any]
_CONVS: dict[Any, Conv] = {}


def _conv(tp: Any) -> Conv:
    """The reader of values of type ``tp``, worked out once per type and process.

    Reading a stored snapshot used to inspect its type hints at every value (``get_origin``,
    ``dataclasses.fields``): ~1.3 ms a snapshot, the most of what ``orch check`` spent per
    target on the operator (15 stored snapshots each). The readers below do the same checks
    in the same order with the same messages; only the type analysis moved out of the loop.
    """
    got = _CONVS.get(tp)
    if got is None:
        got = _CONVS[tp] = _make_conv(tp)
    return got


def _make_conv(tp: Any) -> Conv:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        nullable = type(None) in args
        convs = [_conv(a) for a in args if a is not type(None)]
        if nullable and len(convs) == 1:  # X | None, most fields: the same checks, no loop
            (one,) = convs

            def optional(value: Any, path: str) -> Any:
                if value is None:
                    return None
                try:
                    return one(value, path)
                except (SchemaError, TypeError, ValueError) as exc:
                    last = exc
                raise SchemaError(str(last))

            return optional

        def union(value: Any, path: str) -> Any:
            if value is None:
                if nullable:
                    return None
                raise SchemaError(f"{path}: null not allowed")
            last: Exception | None = None
            for conv in convs:
                try:
                    return conv(value, path)
                except (SchemaError, TypeError, ValueError) as exc:
                    last = exc
            raise SchemaError(str(last) if last else f"{path}: bad value")

        return union
    if tp is Any:
        return _as_is
    if origin is tuple:
        (item_tp, *_rest) = typing.get_args(tp) or (Any,)
        item = _conv(item_tp)

        def tuple_of(value: Any, path: str) -> Any:
            if not isinstance(value, (list, tuple)):
                raise SchemaError(f"{path}: expected a list, got {type(value).__name__}")
            return tuple(item(v, f"{path}[{i}]") for i, v in enumerate(value))

        return tuple_of
    if origin is dict:
        k_tp, v_tp = typing.get_args(tp) or (str, Any)
        val = _conv(v_tp)

        def dict_of(value: Any, path: str) -> Any:
            if not isinstance(value, dict):
                raise SchemaError(f"{path}: expected a mapping, got {type(value).__name__}")
            return {_key(k_tp, k, path): val(v, f"{path}.{k}") for k, v in value.items()}

        return dict_of
    if tp in READERS:
        return READERS[tp]
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return lambda value, path: from_dict(tp, value, path)
    return _as_is


def _as_is(value: Any, path: str) -> Any:
    return value


def _float(value: Any, path: str) -> float:
    if type(value) is float:
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SchemaError(f"{path}: expected a number, got {value!r:.40}")
    try:
        return float(value)
    except OverflowError:
        raise SchemaError(f"{path}: number out of range ({len(str(value))} digits)") from None


def _int(value: Any, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SchemaError(f"{path}: expected an integer, got {value!r:.40}")
    if not -MAX_INT < value < MAX_INT:
        raise SchemaError(f"{path}: integer out of range (|n| >= 2**53)")
    return value


def _str(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise SchemaError(f"{path}: expected a string, got {value!r:.40}")
    return value


def _bool(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        raise SchemaError(f"{path}: expected true/false, got {value!r:.40}")
    return value


READERS: dict[Any, Conv] = {float: _float, int: _int, str: _str, bool: _bool}
"""Readers of the leaf types; a module adds its own (wire.model: ``Severity``)."""


def _key(tp: Any, key: Any, path: str) -> Any:
    """A mapping key read back from JSON, where every key is a string (``dict[int, ...]``)."""
    if tp is int and not isinstance(key, int):
        try:
            return int(key)
        except ValueError:
            raise SchemaError(f"{path}: key {key!r:.40} is not an integer") from None
    return key if tp is int else str(key)


Field = tuple[str, Conv, "type | None", bool]
_FIELDS: dict[type, tuple[Field, ...]] = {}
_PLAIN = (str, bool, float)
"""Leaf types whose reader returns a value of exactly that type unchanged (an ``int`` is one
too, within :data:`MAX_INT`)."""


def _fields(cls: type) -> tuple[Field, ...]:
    """``cls``'s fields, once per class: (name, reader, plain type, nullable). A field whose
    type is a plain leaf (``str``, ``int``, ``float``, ``bool``, optionally ``| None``) names
    it, so :func:`from_dict` takes a value of exactly that type as it is, without a call:
    ~300 values a snapshot, most of what reading the stored history cost."""
    got = _FIELDS.get(cls)
    if got is None:
        hints = _hints(cls)
        out = []
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            tp = hints[f.name]
            args = typing.get_args(tp)
            nullable = typing.get_origin(tp) in (typing.Union, types.UnionType) and (
                len(args) == 2 and type(None) in args
            )
            leaf = next(a for a in args if a is not type(None)) if nullable else tp
            plain = leaf if leaf in (*_PLAIN, int) else None
            out.append((f.name, _conv(tp), plain, nullable))
        got = _FIELDS[cls] = tuple(out)
    return got


def from_dict(cls: type[T], data: Any, path: str = "") -> T:
    """An instance of the dataclass ``cls`` read from ``data`` (unknown keys ignored);
    SchemaError naming the path of a value of the wrong type."""
    if not isinstance(data, dict):
        raise SchemaError(f"{path or cls.__name__}: expected a mapping, got {type(data).__name__}")
    kwargs = {}
    for name, conv, plain, nullable in _fields(cls):
        if name not in data:
            continue
        value = data[name]
        if plain is not None and (
            (value is None and nullable)
            or (
                type(value) is plain and (plain is not int or -MAX_INT < value < MAX_INT)  # type: ignore[operator]
            )
        ):
            kwargs[name] = value  # what the reader would return, checked the same way
        else:
            kwargs[name] = conv(value, f"{path}.{name}" if path else name)
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise SchemaError(f"{path or cls.__name__}: {exc}") from None
