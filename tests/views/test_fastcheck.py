"""``orch check``'s fast path (``orchestrator/commands/fastcheck.py``) against typer's.

The fast parser takes an argv only when it is sure of it; then the check must receive what
typer would have given it, and print and exit the same. Everything else goes to typer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer.main

from orchestrator import cli
from orchestrator.commands import _base, checking, fastcheck, typercli

# argv -> whether the fast path takes it
ARGVS: list[tuple[list[str], bool]] = [
    (["check"], True),
    (["check", "--json"], True),
    (["-c", "h.yaml", "check", "ct1", "ct2"], True),
    (["--config", "h.yaml", "-vv", "check", "--json", "ct1"], True),
    (["--config=h.yaml", "--verbose", "-v", "check"], True),
    (["check", "ct1", "--timeout", "5", "ct2", "--jobs=3", "--renotify", "0.5"], True),
    (["check", "--db", "/tmp/x.db", "--notify", "http://h/x", "--notify-cmd", "cat -n"], True),
    (["check", "--critical", "stall", "--critical=nan_loss", "--heal", "--no-perfdata"], True),
    (["check", "--no-perfdata", "--perfdata", "--json", "--json"], True),
    (["check", "--timeout", "5", "--timeout", "7", "--", "--odd-name", "x"], True),
    (["-c", "a.yaml", "-c", "b.yaml", "check"], True),
    (["check", "--help"], False),
    (["check", "-h"], False),
    (["--help"], False),
    (["--version"], False),
    (["-c", "h.yaml", "status"], False),
    (["check", "--jobs", "0"], False),
    (["check", "--jobs", "x"], False),
    (["check", "--timeout", "1e3"], False),
    (["check", "--timeout"], False),
    (["check", "--json=1"], False),
    (["check", "--bogus"], False),
    (["check", "-v"], False),
    (["check", "--db", ""], False),
    (["check", "--notify", "-x"], False),
    (["-cX", "check"], False),
    (["-vc", "h.yaml", "check"], False),
    ([], False),
]


def _record(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []

    def fake(targets: list[str], **kwargs: Any) -> int:
        seen.append(
            {
                "targets": list(targets or []),
                **{k: list(v) if isinstance(v, (list, tuple)) else v for k, v in kwargs.items()},
                "config": _base.state.config,
                "verbose": _base.state.verbose,
            }
        )
        return 1

    monkeypatch.setattr(checking, "check", fake)
    return seen


@pytest.mark.parametrize("argv,fast", ARGVS, ids=[" ".join(a) or "(none)" for a, _ in ARGVS])
@pytest.mark.parametrize("webhook", [None, "", "http://env/hook"], ids=["noenv", "empty", "env"])
def test_both_paths_give_the_check_the_same_arguments(
    argv: list[str],
    fast: bool,
    webhook: str | None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if webhook is None:
        monkeypatch.delenv("ORCH_WEBHOOK", raising=False)
    else:
        monkeypatch.setenv("ORCH_WEBHOOK", webhook)
    import os

    assert (fastcheck.parse(argv, os.environ) is not None) == fast
    if not fast:
        return
    seen = _record(monkeypatch)
    monkeypatch.setattr(_base.state, "config", None)
    monkeypatch.setattr(_base.state, "verbose", 0)
    assert typercli.run(argv) == 1
    monkeypatch.setattr(_base.state, "config", None)
    monkeypatch.setattr(_base.state, "verbose", 0)
    assert cli.run(argv) == 1
    assert len(seen) == 2 and seen[0] == seen[1], capsys.readouterr()


def test_the_table_is_the_typer_commands() -> None:
    group = typer.main.get_command(typercli.app)
    params = group.commands["check"].params  # type: ignore[attr-defined]
    opts = {}
    for p in params:
        if p.name == "targets":
            continue
        kinds = [fastcheck.CHECK_OPTIONS[o] for o in p.opts + p.secondary_opts]
        assert {k for k, _ in kinds} == {p.name}
        if p.multiple:
            assert [k for _, k in kinds] == ["multi"]
        elif p.is_flag:  # type: ignore[attr-defined]
            assert [k for _, k in kinds] == ["flag"] + ["off"] * len(p.secondary_opts)
        assert fastcheck.CHECK_DEFAULTS[p.name] == p.default
        assert fastcheck.CHECK_ENVVARS.get(p.name) == p.envvar
        opts.update(dict.fromkeys(p.opts + p.secondary_opts))
    assert set(opts) == set(fastcheck.CHECK_OPTIONS)
    root = {o for p in group.params for o in p.opts}
    assert {"-c", "--config", "-v", "--verbose"} <= root


@pytest.mark.parametrize("json_out", [False, True], ids=["plain", "json"])
def test_same_output_and_exit_through_both_paths(
    tmp_path: Path, json_out: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """A check that cannot run (no such hosts.yaml): UNKNOWN, the same words, code 3."""
    argv = ["-c", str(tmp_path / "missing.yaml"), "check", "--db", str(tmp_path / "o.db")]
    argv += ["--json"] if json_out else []
    outs = []
    for run in (typercli.run, cli.run):
        code = run(argv)
        outs.append((code, capsys.readouterr()))
    assert outs[0] == outs[1] and outs[0][0] == 3, outs


def test_cli_forwards_every_name_typercli_exports() -> None:
    """cli.py lists typercli's names by hand (importing typercli to read ``__all__`` would load
    typer on the fast path): the two lists must not drift apart."""
    from orchestrator import cli
    from orchestrator.commands import typercli

    assert set(cli._FROM_TYPER) == set(typercli.__all__) - {"run"}
    for name in cli._FROM_TYPER:
        assert getattr(cli, name) is getattr(typercli, name)
