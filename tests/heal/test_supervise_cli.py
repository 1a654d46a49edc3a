"""``orch supervise``'s refusals: one line, the documented exit code, nothing started."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.cli import run


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "hosts.yaml"
    path.write_text(text)
    path.chmod(0o600)
    return path


def test_no_policy_anywhere_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _config(tmp_path, "containers:\n  ct: {host: local}\n")
    assert run(["-c", str(cfg), "supervise", "--db", str(tmp_path / "o.db")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no container has a restart: policy in hosts.yaml")
    assert not (tmp_path / "o.db").exists()


def test_a_named_container_without_policy_is_exit_2(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    cfg = _config(
        tmp_path, "containers:\n  a: {host: local, restart: {max: 1}}\n  b: {host: local}\n"
    )
    assert run(["-c", str(cfg), "supervise", "b", "--db", str(tmp_path / "o.db")]) == 2
    assert "b: no restart: policy in hosts.yaml" in capsys.readouterr().err


def test_an_unusable_database_is_exit_3(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    cfg = _config(tmp_path, "defaults:\n  restart: {max: 1}\ncontainers:\n  a: {host: local}\n")
    (tmp_path / "not-a-dir").write_text("x")
    db = tmp_path / "not-a-dir" / "o.db"
    assert run(["-c", str(cfg), "supervise", "a", "--db", str(db), "--rounds", "1"]) == 3
    assert "cannot open history database" in capsys.readouterr().err


def test_one_round_over_an_idle_target_journals_nothing(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """The built-in local target, no run: a round decides nothing and stops cleanly (exit 0)."""
    cfg = _config(
        tmp_path,
        "defaults:\n  restart: {max: 1}\ncontainers:\n  a:\n    host: local\n"
        f"    workdir: {tmp_path / 'w'}\n",
    )
    db = tmp_path / "o.db"
    assert (
        run(["-c", str(cfg), "supervise", "a", "--db", str(db), "--rounds", "1", "--json-lines"])
        == 0
    )
    out = capsys.readouterr().out.splitlines()
    assert '"event": "start"' in out[0] and '"event": "stopped"' in out[-1]
    assert not [x for x in out if '"event": "journal"' in x]
