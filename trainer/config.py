"""Trainer configuration: a YAML file -> typed, validated :class:`TrainConfig`.

Every problem is reported as one :class:`ConfigError` line naming ``file:line: key`` so the CLI can
print it and exit 2 without a traceback.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml


class ConfigError(Exception):
    """A bad config value; ``str()`` is the one line the CLI prints.

    >>> str(ConfigError("c.yaml", 7, "train.lr", "must be > 0, got -1"))
    'c.yaml:7: train.lr: must be > 0, got -1'
    >>> str(ConfigError("c.yaml", None, "train", "missing"))
    'c.yaml: train: missing'
    """

    def __init__(self, file: str, line: int | None, key: str, problem: str) -> None:
        self.file, self.line, self.key, self.problem = file, line, key, problem
        where = f"{file}:{line}" if line is not None else file
        super().__init__(f"{where}: {key}: {problem}")


class DependencyError(Exception):
    """An optional dependency a config asks for is not installed; ``str()`` is the one line."""


@dataclass(frozen=True, slots=True)
class TargetConfig:
    """The frozen target LM (random init from ``seed``, or a local HF checkpoint in ``hf_path``)."""

    vocab_size: int = 64
    d_model: int = 64
    n_layers: int = 4
    n_heads: int = 4
    d_ff: int = 128
    seed: int = 0
    hf_path: str | None = None
    device_map: str | None = None
    dtype: str = "auto"
    """``float32``, ``bfloat16``, ``float16``; ``auto``: float32 built in, the checkpoint's for HF."""
    kind: str = "lm"
    """``lm``: the random causal transformer; ``copy``: greedy next token = the token
    ``copy_period`` positions back (:mod:`trainer.copytarget`), a task only context solves."""
    copy_period: int = 16
    micro_batches: int = 1
    """Built-in target: rows per forward split into this many micro-batches, pipelined over the
    target devices (GPipe order) so they work at once; 1 = one batch, one device at a time."""


@dataclass(frozen=True, slots=True)
class DrafterConfig:
    """The drafter; ``target_layers`` are the target layer indices whose hidden states form the context."""

    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 128
    block_size: int = 4
    target_layers: list[int] = field(default_factory=lambda: [0, 1, 3])
    seed: int = 1


@dataclass(frozen=True, slots=True)
class DataConfig:
    """``kind: synthetic`` (a sparse Markov chain over the vocab), ``text`` (bytes of ``path``) or
    ``target`` (on-policy: ``pool`` sequences the target generates at start-up, each continuing a
    random ``prompt_len``-token prompt at ``temperature``; 0 = greedy)."""

    kind: str = "synthetic"
    path: str | None = None
    seq_len: int = 64
    branching: int = 2
    seed: int = 2
    prompt_len: int = 8
    temperature: float = 0.0
    pool: int = 512


@dataclass(frozen=True, slots=True)
class TrainSection:
    """Optimisation and bookkeeping; ``batch_size`` is sequences per step over all replicas and ranks.

    ``torch_threads``: intra-op threads per op (``torch.set_num_threads``); 0 keeps torch's default.
    On a small CPU box 1 avoids oversubscribing cores with worker threads x OpenMP threads.
    ``loss_decay_gamma``: block slot ``k`` (1..B-1) weighs ``exp(-(k-1)/gamma)`` (DFlash); 0 = flat.
    ``eval_every``: measure ``tau`` (real draft-and-verify) every N steps on ``eval_seqs`` held-out
    sequences x ``blocks_per_seq`` anchors; 0 = never; ``eval_chunk_rows`` verification rows per
    target pass (bounds its memory); ``eval_budget_s``: seconds of evaluation per step, the rest
    continues after the next steps on a snapshot of the drafter (0 = all at the due step).
    ``max_nonfinite_steps``: stop after this
    many steps in a row whose gradient was not finite (each one is skipped).
    """

    steps: int = 200
    batch_size: int = 8
    blocks_per_seq: int = 4
    lr: float = 3e-3
    warmup_steps: int = 10
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    log_every: int = 10
    ckpt_every: int = 50
    keep_ckpts: int = 3
    grad_checkpoint: bool = False
    queue_depth: int = 2
    torch_threads: int = 0
    seed: int = 3
    loss_decay_gamma: float = 0.0
    eval_every: int = 10
    eval_seqs: int = 16
    eval_chunk_rows: int = 64
    eval_budget_s: float = 0.0
    max_nonfinite_steps: int = 10


@dataclass(frozen=True, slots=True)
class DevicesConfig:
    """``target``: devices the target's layers are split across; ``drafter``: one replica per entry."""

    target: list[str] = field(default_factory=lambda: ["cpu"])
    drafter: list[str] = field(default_factory=lambda: ["cpu"])


@dataclass(frozen=True, slots=True)
class TrainConfig:
    """The whole config; ``source`` is the file it came from (for messages)."""

    target: TargetConfig = field(default_factory=TargetConfig)
    drafter: DrafterConfig = field(default_factory=DrafterConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainSection = field(default_factory=TrainSection)
    devices: DevicesConfig = field(default_factory=DevicesConfig)
    source: str = "<defaults>"

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict of every section (``source`` left out)."""
        out = dataclasses.asdict(self)
        out.pop("source")
        return out


_SECTIONS: dict[str, type] = {
    "target": TargetConfig,
    "drafter": DrafterConfig,
    "data": DataConfig,
    "train": TrainSection,
    "devices": DevicesConfig,
}


def _line_map(node: yaml.Node, prefix: str = "") -> dict[str, int]:
    """Map dotted key paths to 1-based line numbers from a composed YAML node."""
    lines: dict[str, int] = {}
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = f"{prefix}{key_node.value}"
            lines[key] = key_node.start_mark.line + 1
            lines.update(_line_map(value_node, key + "."))
    return lines


def _describe(hint: Any) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
    origin = typing.get_origin(hint)
    if origin is list:
        return f"a list of {_describe(typing.get_args(hint)[0]).split(' ', 1)[1]}s"
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        return f"{_describe(inner[0])} or null"
    return names.get(hint, str(hint))


def _coerce(value: Any, hint: Any) -> tuple[bool, Any]:
    """Return (ok, value) converting ``value`` to ``hint`` without lossy guesses.

    >>> _coerce(3, float)
    (True, 3.0)
    >>> _coerce(True, int)
    (False, True)
    >>> _coerce(["cpu"], list[str])
    (True, ['cpu'])
    >>> _coerce(None, str | None)
    (True, None)
    """
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return True, None
        inner = [a for a in typing.get_args(hint) if a is not type(None)][0]
        return _coerce(value, inner)
    if origin is list:
        if not isinstance(value, list):
            return False, value
        item = typing.get_args(hint)[0]
        out = []
        for v in value:
            ok, cv = _coerce(v, item)
            if not ok:
                return False, value
            out.append(cv)
        return True, out
    if hint is bool:
        return isinstance(value, bool), value
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return True, float(value)
        return False, value
    if hint is str:
        return isinstance(value, str), value
    return False, value


def _build(raw: dict[str, Any], file: str, lines: dict[str, int]) -> TrainConfig:
    sections: dict[str, Any] = {}
    for name, section_raw in raw.items():
        if name not in _SECTIONS:
            known = ", ".join(_SECTIONS)
            raise ConfigError(file, lines.get(name), name, f"unknown section (known: {known})")
        cls = _SECTIONS[name]
        if section_raw is None:
            section_raw = {}
        if not isinstance(section_raw, dict):
            raise ConfigError(file, lines.get(name), name, "must be a mapping of keys")
        hints = typing.get_type_hints(cls)
        known_keys = {f.name for f in fields(cls)}
        values: dict[str, Any] = {}
        for key, value in section_raw.items():
            dotted = f"{name}.{key}"
            if key not in known_keys:
                raise ConfigError(
                    file,
                    lines.get(dotted),
                    dotted,
                    f"unknown key (known: {', '.join(sorted(known_keys))})",
                )
            ok, converted = _coerce(value, hints[key])
            if not ok:
                raise ConfigError(
                    file,
                    lines.get(dotted),
                    dotted,
                    f"must be {_describe(hints[key])}, got {value!r}",
                )
            values[key] = converted
        sections[name] = cls(**values)
    cfg = TrainConfig(**sections, source=file)
    _check(cfg, file, lines)
    return cfg


def _check(cfg: TrainConfig, file: str, lines: dict[str, int]) -> None:
    """Cross-field checks; raises ConfigError naming the offending key."""

    def fail(key: str, problem: str) -> None:
        raise ConfigError(file, lines.get(key), key, problem)

    positive = {
        "target.vocab_size": cfg.target.vocab_size,
        "target.d_model": cfg.target.d_model,
        "target.n_layers": cfg.target.n_layers,
        "target.n_heads": cfg.target.n_heads,
        "target.d_ff": cfg.target.d_ff,
        "target.micro_batches": cfg.target.micro_batches,
        "drafter.d_model": cfg.drafter.d_model,
        "drafter.n_layers": cfg.drafter.n_layers,
        "drafter.n_heads": cfg.drafter.n_heads,
        "drafter.d_ff": cfg.drafter.d_ff,
        "drafter.block_size": cfg.drafter.block_size,
        "data.seq_len": cfg.data.seq_len,
        "data.branching": cfg.data.branching,
        "train.steps": cfg.train.steps,
        "train.batch_size": cfg.train.batch_size,
        "train.blocks_per_seq": cfg.train.blocks_per_seq,
        "train.log_every": cfg.train.log_every,
        "train.ckpt_every": cfg.train.ckpt_every,
        "train.keep_ckpts": cfg.train.keep_ckpts,
        "train.queue_depth": cfg.train.queue_depth,
        "train.lr": cfg.train.lr,
        "train.eval_seqs": cfg.train.eval_seqs,
        "train.eval_chunk_rows": cfg.train.eval_chunk_rows,
        "train.max_nonfinite_steps": cfg.train.max_nonfinite_steps,
        "data.prompt_len": cfg.data.prompt_len,
        "data.pool": cfg.data.pool,
    }
    for key, value in positive.items():
        if value <= 0:
            fail(key, f"must be > 0, got {value}")
    for key, value in {
        "train.warmup_steps": cfg.train.warmup_steps,
        "train.weight_decay": cfg.train.weight_decay,
        "train.grad_clip": cfg.train.grad_clip,
        "train.torch_threads": cfg.train.torch_threads,
        "train.loss_decay_gamma": cfg.train.loss_decay_gamma,
        "train.eval_every": cfg.train.eval_every,
        "train.eval_budget_s": cfg.train.eval_budget_s,
        "data.temperature": cfg.data.temperature,
    }.items():
        if value < 0:
            fail(key, f"must be >= 0, got {value}")
    if cfg.target.hf_path is None and cfg.target.d_model % cfg.target.n_heads:
        fail("target.n_heads", f"must divide target.d_model={cfg.target.d_model}")
    if cfg.target.hf_path is None and (cfg.target.d_model // cfg.target.n_heads) % 2:
        fail("target.n_heads", "head size target.d_model/n_heads must be even (rotary embedding)")
    if (
        cfg.drafter.d_model % cfg.drafter.n_heads
        or (cfg.drafter.d_model // cfg.drafter.n_heads) % 2
    ):
        fail(
            "drafter.n_heads",
            f"must divide drafter.d_model={cfg.drafter.d_model} into even head sizes",
        )
    if not cfg.drafter.target_layers:
        fail("drafter.target_layers", "must name at least one target layer")
    if cfg.target.hf_path is None:
        bad = [i for i in cfg.drafter.target_layers if not 0 <= i < cfg.target.n_layers]
        if bad:
            fail("drafter.target_layers", f"{bad} outside 0..{cfg.target.n_layers - 1}")
    if cfg.target.kind not in TARGET_KINDS:
        fail("target.kind", f"must be one of {', '.join(TARGET_KINDS)}, got {cfg.target.kind!r}")
    if cfg.target.kind == "copy":
        if cfg.target.d_model < cfg.target.vocab_size:
            fail("target.d_model", f"must be >= target.vocab_size={cfg.target.vocab_size} (copy)")
        if not cfg.drafter.block_size <= cfg.target.copy_period < cfg.data.seq_len:
            fail(
                "target.copy_period",
                f"must be in drafter.block_size..data.seq_len-1 = "
                f"{cfg.drafter.block_size}..{cfg.data.seq_len - 1}, got {cfg.target.copy_period}",
            )
    if cfg.target.dtype not in DTYPES:
        fail("target.dtype", f"must be one of {', '.join(DTYPES)}, got {cfg.target.dtype!r}")
    if cfg.data.kind not in DATA_KINDS:
        kinds = ", ".join(repr(k) for k in DATA_KINDS)
        fail("data.kind", f"must be one of {kinds}, got {cfg.data.kind!r}")
    if cfg.data.kind == "text":
        if not cfg.data.path:
            fail("data.path", "required when data.kind is 'text'")
        elif not Path(cfg.data.path).is_file():
            fail("data.path", f"no such file: {cfg.data.path}")
        if cfg.target.hf_path is None and cfg.target.vocab_size != 256:
            fail("target.vocab_size", "must be 256 for data.kind 'text' (bytewise tokens)")
    if cfg.data.branching > cfg.target.vocab_size:
        fail("data.branching", f"must be <= target.vocab_size={cfg.target.vocab_size}")
    if cfg.data.seq_len < cfg.drafter.block_size + 2:
        fail("data.seq_len", f"must be >= drafter.block_size + 2 = {cfg.drafter.block_size + 2}")
    if (
        cfg.data.kind == "target"
        and cfg.data.prompt_len >= cfg.data.seq_len - cfg.drafter.block_size
    ):
        fail(
            "data.prompt_len",
            f"must be < data.seq_len - drafter.block_size = "
            f"{cfg.data.seq_len - cfg.drafter.block_size}",
        )
    lo, hi = anchor_range(cfg)
    if hi - lo + 1 < cfg.train.blocks_per_seq:
        fail(
            "train.blocks_per_seq",
            f"{cfg.train.blocks_per_seq} anchors per sequence, but only {hi - lo + 1} positions "
            f"({lo}..{hi}) can start a block (anchors are drawn without replacement)",
        )
    if not cfg.devices.target:
        fail("devices.target", "must list at least one device")
    if not cfg.devices.drafter:
        fail("devices.drafter", "must list at least one device")
    if len(cfg.devices.target) > cfg.target.n_layers and cfg.target.hf_path is None:
        fail("devices.target", f"more devices than target.n_layers={cfg.target.n_layers}")
    for key, devs in (
        ("devices.target", cfg.devices.target),
        ("devices.drafter", cfg.devices.drafter),
    ):
        for dev in devs:
            if dev != "cpu" and not (dev.startswith("cuda:") and dev[5:].isdigit()):
                fail(key, f"device {dev!r} must be 'cpu' or 'cuda:N'")
    if cfg.train.batch_size % len(cfg.devices.drafter):
        fail(
            "train.batch_size",
            f"{cfg.train.batch_size} is not divisible by {len(cfg.devices.drafter)} drafter devices",
        )


TARGET_KINDS = ("lm", "copy")
DTYPES = ("auto", "float32", "bfloat16", "float16")
DATA_KINDS = ("synthetic", "text", "target")


def anchor_range(cfg: TrainConfig) -> tuple[int, int]:
    """First and last position a block may start at: ``[x[a], MASK x (B-1)]`` must fit in the
    sequence, with context before it, and on-policy blocks start at the prompt's last token or later.

    >>> anchor_range(TrainConfig())
    (1, 60)
    >>> anchor_range(replace(TrainConfig(), data=DataConfig(kind="target", prompt_len=8)))
    (7, 60)
    """
    lo = max(1, cfg.data.prompt_len - 1) if cfg.data.kind == "target" else 1
    return lo, cfg.data.seq_len - cfg.drafter.block_size


def shift_cuda(devices: list[str], offset: int) -> list[str]:
    """``devices`` with every ``cuda:N`` moved to ``cuda:N+offset`` (``cpu`` stays).

    >>> shift_cuda(["cuda:0", "cpu", "cuda:7"], 8)
    ['cuda:8', 'cpu', 'cuda:15']
    """
    return [f"cuda:{int(d[5:]) + offset}" if d.startswith("cuda:") else d for d in devices]


def for_local_rank(cfg: TrainConfig, local_rank: int) -> TrainConfig:
    """The devices of torchrun's process ``LOCAL_RANK``: the config names the CUDA devices of one
    process; local rank ``r`` uses them shifted by ``r x (highest index + 1)``, so the ranks of
    one node never share a GPU.

    >>> c = TrainConfig(devices=DevicesConfig(target=["cuda:0", "cuda:1"], drafter=["cuda:2"]))
    >>> d = for_local_rank(c, 1).devices
    >>> d.target, d.drafter
    (['cuda:3', 'cuda:4'], ['cuda:5'])
    >>> for_local_rank(c, 0) is c
    True
    """
    cuda = [
        int(d[5:]) for d in (*cfg.devices.target, *cfg.devices.drafter) if d.startswith("cuda:")
    ]
    if local_rank == 0 or not cuda:
        return cfg
    offset = local_rank * (max(cuda) + 1)
    return replace(
        cfg,
        devices=DevicesConfig(
            target=shift_cuda(cfg.devices.target, offset),
            drafter=shift_cuda(cfg.devices.drafter, offset),
        ),
    )


def load_config(path: str | Path, overrides: list[str] | None = None) -> TrainConfig:
    """Load and validate a YAML config, then apply ``section.key=value`` overrides.

    Raises:
        ConfigError: unreadable file, bad YAML, unknown key, wrong type or inconsistent values.
    """
    file = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(file, None, "file", f"cannot read: {exc.strerror or exc}") from None
    try:
        node = yaml.compose(text)
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        raise ConfigError(file, line, "yaml", str(getattr(exc, "problem", exc))) from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(file, 1, "top level", "must be a mapping of sections")
    lines = _line_map(node) if node is not None else {}
    for item in overrides or []:
        key, sep, value = item.partition("=")
        section, dot, name = key.partition(".")
        if not sep or not dot or not name:
            raise ConfigError("--set", None, item, "expected SECTION.KEY=VALUE")
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError:
            parsed = value
        raw.setdefault(section, {})
        if not isinstance(raw[section], dict):
            raise ConfigError(file, lines.get(section), section, "must be a mapping of keys")
        raw[section][name] = parsed
        lines[key] = None  # type: ignore[assignment]  # an override has no line in the file
    return _build(raw, file, lines)


def with_steps(cfg: TrainConfig, steps: int) -> TrainConfig:
    """Copy of ``cfg`` with ``train.steps`` replaced."""
    return replace(cfg, train=replace(cfg.train, steps=steps))
