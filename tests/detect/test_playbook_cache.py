"""The parsed-playbook cache (orchestrator/playbooks/cache.py): real files in tmp, a real cache
dir ($XDG_CACHE_HOME), real subprocesses where a fresh process is the point."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cli import run as orch
from orchestrator.errors import ConfigError
from orchestrator.playbooks import cache, loader
from orchestrator.playbooks.loader import load_playbooks, match_log

ROOT = Path(__file__).resolve().parents[2]
BOOK = """\
id: my-sig
title: {title}
kind: signature
severity: warning
match:
  log: ["{regex}"]
diagnosis: it went boom
remedy: [stop it]
"""
TABLE = "# source: test\n# form: ^{text}$\n-\tX\tmy-sig\tprobable\tno\tsomething odd\n"


def book(d: Path, title: str = "A test signature", regex: str = "boom") -> Path:
    d.mkdir(parents=True, exist_ok=True)
    path = d / "my-sig.yaml"
    path.write_text(BOOK.format(title=title, regex=regex))
    return path


@pytest.fixture
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    return home


def no_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make a parse fail loudly: a load that still works read the cache."""

    def boom(*_a: object, **_k: object) -> None:
        raise AssertionError("parsed although the cache holds these files")

    monkeypatch.setattr(loader, "parse_playbook", boom)


def test_a_second_load_reads_the_cache_not_the_yaml(
    tmp_path: Path, cache_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = tmp_path / "books"
    book(d)
    first = load_playbooks(d)
    assert cache.path_for(d).is_file() and cache.path_for(d).parent == cache_home / "orch"
    no_parsing(monkeypatch)
    again = load_playbooks(d)
    assert again == first and again[0].title == "A test signature"
    assert [m.id for m in match_log(["it went boom here"], again)] == ["my-sig"]


def test_editing_a_playbook_rebuilds_the_cache(tmp_path: Path, cache_home: Path) -> None:
    d = tmp_path / "books"
    path = book(d)
    assert load_playbooks(d)[0].title == "A test signature"
    before = cache.path_for(d).read_bytes()
    path.write_text(BOOK.format(title="Edited", regex="kaboom"))
    pbs = load_playbooks(d)
    assert pbs[0].title == "Edited"
    assert [m.id for m in match_log(["kaboom"], pbs)] == ["my-sig"]
    assert match_log(["boom"], pbs) == []
    assert cache.path_for(d).read_bytes() != before


def test_a_new_vocabulary_table_is_part_of_the_key(tmp_path: Path, cache_home: Path) -> None:
    d = tmp_path / "books"
    book(d)
    assert match_log(["something odd"], load_playbooks(d)) == []
    (d / "vocab").mkdir()
    (d / "vocab" / "t.tsv").write_text(TABLE)
    assert [m.id for m in match_log(["something odd"], load_playbooks(d))] == ["my-sig"]
    assert match_log(["something odd"], load_playbooks(d, vocab=False)) == []


@pytest.mark.parametrize(
    "content",
    [b"", b"not a pickle at all", b"\x80\x05\x95garbage", pickle.dumps(("key", "x")), b"\x80"],
    ids=["empty", "text", "truncated", "other-payload", "one-byte"],
)
def test_a_corrupt_cache_is_rebuilt_without_a_word(
    tmp_path: Path, cache_home: Path, content: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path / "books"
    book(d)
    expected = load_playbooks(d)
    cache.path_for(d).write_bytes(content)
    assert load_playbooks(d) == expected
    key, payload = pickle.loads(cache.path_for(d).read_bytes())  # rewritten whole
    assert payload[0] == expected and len(key) == 64
    assert capsys.readouterr().err == ""


def test_an_unwritable_cache_dir_only_costs_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    d = tmp_path / "books"
    book(d)
    assert [p.id for p in load_playbooks(d)] == ["my-sig"]
    assert [p.id for p in load_playbooks(d)] == ["my-sig"]


def test_an_invalid_set_is_never_cached(tmp_path: Path, cache_home: Path) -> None:
    d = tmp_path / "books"
    book(d, regex="(unclosed")
    for _ in range(2):
        with pytest.raises(ConfigError, match=r"my-sig\.yaml:6: match\.log\[0\]: bad regex"):
            load_playbooks(d)
    assert not cache.path_for(d).exists()


def test_each_playbook_directory_has_its_own_entry(
    tmp_path: Path, cache_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A user's directory (``--playbooks DIR``) is keyed apart from the bundled set."""
    a, b = tmp_path / "a", tmp_path / "b"
    book(a, title="From A", regex="alpha failed")
    book(b, title="From B", regex="alpha failed")
    assert cache.path_for(a) != cache.path_for(b)
    log = tmp_path / "x.log"
    log.write_text("step 1\nalpha failed\n")
    for d, title in ((a, "From A"), (b, "From B"), (a, "From A")):
        assert orch(["diagnose", "--json", "--playbooks", str(d), str(log)]) == 0
        assert json.loads(capsys.readouterr().out)["matches"][0]["title"] == title
    bundled = load_playbooks()
    assert cache.path_for(loader.DEFAULT_DIR).is_file()
    assert "my-sig" not in {p.id for p in bundled}


def _fresh(code: str, cache_home: Path) -> str:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache_home), "PYTHONPATH": str(ROOT)}
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout


def test_a_cached_process_compiles_no_playbook_regex_a_healthy_log_does_not_need(
    cache_home: Path,
) -> None:
    """The point of the cache: a later process neither parses YAML nor compiles ~700 regexes;
    a healthy line is rejected by the prefilter alone, a failure line compiles only its own."""
    code = (
        "from orchestrator.playbooks import loader, matching\n"
        "pbs = loader.load_playbooks()\n"
        "print(matching.compile_once.cache_info().currsize)\n"
        "m = loader.match_log(['step=10 loss=2.31 tok/s=21000', 'epoch 1 done'], pbs)\n"
        "print(len(m), matching.compile_once.cache_info().currsize)\n"
        "m = loader.match_log(['torch.OutOfMemoryError: CUDA out of memory.'], pbs)\n"
        "print(m[0].id, matching.compile_once.cache_info().currsize)\n"
    )
    cold = _fresh(code, cache_home).split("\n")
    assert int(cold[0]) > 500  # the first process parsed and validated every regex
    warm = _fresh(code, cache_home).split("\n")
    assert warm[0] == "0"
    assert warm[1] == "0 0"
    pid, compiled = warm[2].split()
    assert pid == "cuda-oom" and 0 < int(compiled) < 20
