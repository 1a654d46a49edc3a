"""Hostile hosts.yaml: random structures and text give an Inventory or a one-line ConfigError.

Never any other exception (a traceback is a bug), and values carrying shell
metacharacters load literally and reach a real shell unchanged, running nothing.
"""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.cli import run
from orchestrator.config.inventory import Inventory, load_inventory, parse_inventory
from orchestrator.config.limits import Limits
from orchestrator.config.schema import CONTAINER_FIELDS, HOST_FIELDS, TOP_LEVEL
from orchestrator.errors import ConfigError
from orchestrator.wire.quoting import command_line, with_env

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["0-4", "5", "a.b", "x:y", "", "-o", "~/k", "/root", "1e3", "yes", "null"]),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
KEYS = sorted({s.key for s in HOST_FIELDS + CONTAINER_FIELDS} | set(Limits.field_names()))
BASE = {
    "defaults": {"user": "root", "poll_interval": 2, "thresholds": {"startup_grace_s": 120}},
    "hosts": {"pve1": {"address": "10.1.2.6", "port": 22, "identity_file": "k"}},
    "containers": {
        "lxc200": {
            "host": "pve1",
            "vmid": 200,
            "workdir": "/root/dflash",
            "session": "train",
            "gpus": {"target": [0, 1, 2, 3, 4], "drafter": "5-7"},
            "env": {"NCCL_DEBUG": "WARN"},
            "requires": ["torch"],
            "thresholds": {"stall_timeout_s": 900, "ignored_xids": [13]},
            "log_patterns": {"oom": "out of memory"},
            "command": ["python3", "train.py"],
        },
        "local": {"host": "local"},
    },
}


def _mappings(doc: dict, out: list[dict]) -> list[dict]:
    out.append(doc)
    for value in doc.values():
        if isinstance(value, dict):
            _mappings(value, out)
    return out


@st.composite
def mutated(draw: st.DrawFn) -> dict:
    """The valid BASE document with 1-3 random edits: a value replaced, a key removed or added."""
    doc = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(1, 3))):
        target = draw(st.sampled_from(_mappings(doc, [])))
        action = draw(st.sampled_from(["set", "delete", "add"]))
        if action == "add" or not target:
            target[draw(st.sampled_from(KEYS) | st.text(max_size=6))] = draw(values)
        elif action == "set":
            target[draw(st.sampled_from(sorted(target)))] = draw(values)
        else:
            del target[draw(st.sampled_from(sorted(target)))]
    return doc


def _outcome(text: str) -> Inventory | ConfigError:
    try:
        return parse_inventory(text, "fuzz.yaml")
    except ConfigError as exc:
        message = str(exc)
        assert "\n" not in message and "\r" not in message, message
        assert message.startswith("fuzz.yaml")
        return exc


@FUZZ
@given(values)
def test_random_structures(data: object) -> None:
    assert isinstance(_outcome(yaml.safe_dump(data)), (Inventory, ConfigError))


@FUZZ
@given(mutated())
def test_random_edits_of_a_valid_file(data: dict) -> None:
    result = _outcome(yaml.safe_dump(data))
    if isinstance(result, Inventory):
        assert "local" in result.containers


@FUZZ
@given(st.text(max_size=200) | st.sampled_from(TOP_LEVEL).map(lambda k: f"{k}: ["))
def test_random_text(text: str) -> None:
    assert isinstance(_outcome(text), (Inventory, ConfigError))


@settings(max_examples=40, deadline=None)
@given(st.binary(max_size=100) | values.map(lambda v: yaml.safe_dump(v).encode()))
def test_random_files_through_the_cli(
    tmp_path_factory: pytest.TempPathFactory, data: bytes
) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "hosts.yaml"
    path.write_bytes(data)
    path.chmod(0o600)
    assert run(["-c", str(path), "hosts", "--json"]) in (0, 2)


printable_name = st.text(
    st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")), min_size=1, max_size=12
).filter(lambda s: s.isprintable() and "/" not in s and not s.startswith("-"))
no_nul = st.text(
    st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=30
)


@FUZZ
@given(name=printable_name, value=no_nul, command=no_nul.filter(str.strip))
def test_names_env_and_commands_load_literally(name: str, value: str, command: str) -> None:
    doc = {"containers": {name: {"host": "local", "env": {"X": value}, "command": command}}}
    inv = parse_inventory(yaml.safe_dump(doc))  # allow_unicode=True garbles U+0085 (PyYAML)
    ct = inv.containers[name]
    assert (ct.name, ct.env["X"], ct.command) == (name, value, command)


HOSTILE = [
    "$(touch {canary})",
    "`touch {canary}`",
    "x; touch {canary}",
    "x && touch {canary} || touch {canary}",
    "'; touch {canary}; '",
    '"; touch {canary}; "',
    "x\ntouch {canary}",
    "$HOME ${{IFS}} * ? [a] ~ > {canary}",
    "| touch {canary} &",
]


@pytest.mark.parametrize("template", HOSTILE)
def test_hostile_values_reach_a_real_shell_unchanged(tmp_path: Path, template: str) -> None:
    """Loaded from a real file, quoted by command_line, run by a real sh: printed back, nothing run."""
    canary = tmp_path / "canary"
    value = template.format(canary=canary)
    path = tmp_path / "hosts.yaml"
    name = "c " + value.replace("/", "_").replace("\n", " ")
    doc = {"containers": {name: {"host": "local", "env": {"X": value}, "command": value}}}
    path.write_text(yaml.safe_dump(doc))
    path.chmod(0o600)
    ct = load_inventory(path).container(name)
    assert ct.name == name
    assert ct.env["X"] == value and ct.command == value
    line = command_line(with_env(["printenv", "X"], ct.env))
    shown = subprocess.run(
        ["sh", "-c", line], capture_output=True, text=True, timeout=10, check=True
    )
    assert shown.stdout == value + "\n"
    echoed = subprocess.run(
        ["sh", "-c", command_line(["printf", "%s", ct.command])],
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    )
    assert echoed.stdout == value
    assert not canary.exists()
