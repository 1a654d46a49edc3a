"""The log matcher: confidence and confirm, stack signatures over a bounded window, the
prefilter, the chunked reader, and the YAML forms of ``match.log`` entries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cli import run as orch
from orchestrator.errors import ConfigError
from orchestrator.playbooks.loader import load_playbooks, parse_playbook
from orchestrator.playbooks.matching import LogMatcher, iter_log_lines, match_log, trie_regex

STACK = """\
id: two-frames
title: Two frames
kind: signature
severity: critical
confidence: probable
confirm: read the exception below the frames
match:
  log:
    - stack: ["frame A", "frame B"]
      within: 5
    - regex: "the message"
      confidence: certain
      confirm: nothing more to check
diagnosis: d
remedy: [r]
"""


@pytest.fixture(scope="module")
def pbs():
    return load_playbooks()


@pytest.fixture()
def stack():
    return [parse_playbook(STACK, "two-frames.yaml")]


def test_bare_killed_is_a_probable_sigkill_naming_the_kernel_log(pbs) -> None:
    (m,) = match_log(["Epoch 3: 40%|████ | 400/1000 [01:02<01:33, loss=2.31]", "Killed"], pbs)
    assert (m.id, m.confidence, m.lineno) == ("sigkill", "probable", 2)
    assert "host kernel log" in m.confirm and "orch postmortem" in m.confirm


def test_the_kernel_oom_line_outranks_the_sigkill_it_caused(pbs) -> None:
    lines = [
        "Killed",
        "[2059991.491542] Out of memory: Killed process 25315 (python3) total-vm:53312244kB",
    ]
    assert [(m.id, m.confidence) for m in match_log(lines, pbs)] == [
        ("oom-killer", "certain"),
        ("sigkill", "probable"),
    ]


def test_a_certain_line_is_the_evidence_even_after_a_probable_one(pbs) -> None:
    lines = [
        "[E ProcessGroupNCCL.cpp:341] Some NCCL operations have failed or timed out.",
        "[E ProcessGroupNCCL.cpp:566] [Rank 0] Watchdog caught collective operation timeout: x",
    ]
    (m,) = match_log(lines, pbs)
    assert (m.id, m.confidence, m.lineno, m.count) == ("nccl-timeout", "certain", 2, 2)
    (p,) = match_log(lines[:1], pbs)
    assert (p.confidence, p.lineno) == ("probable", 1)
    assert "Watchdog caught" in p.confirm


def test_stack_matches_frames_in_order_within_the_window(stack) -> None:
    (m,) = match_log(["x", "frame A", "y", "frame B", "z"], stack)
    assert (m.id, m.lineno, m.confidence, m.confirm) == (
        "two-frames",
        4,
        "probable",
        "read the exception below the frames",
    )
    assert match_log(["frame B", "frame A"], stack) == []  # wrong order
    assert match_log(["frame A frame B"], stack) == []  # one line is not a stack
    assert match_log(["frame A", "1", "2", "3", "4", "frame B"], stack) == []  # 6 lines > 5


def test_stack_keeps_the_newest_start_so_a_late_first_frame_still_counts(stack) -> None:
    lines = ["frame A", *["filler"] * 10, "frame A", "frame B"]
    (m,) = match_log(lines, stack)
    assert m.lineno == 13


def test_stack_state_stays_bounded_over_a_long_log(stack) -> None:
    matcher = LogMatcher(stack)
    matcher.feed("frame A", 1)
    for n in range(2, 200_000):
        matcher.feed("step=1 loss=2.0", n)
    matcher.feed("frame B", 200_000)
    assert matcher.matches() == []  # far outside the window: no stale partial match
    assert sum(len(s) for s in matcher._starts.values()) == 2  # two integers, whatever the length


def test_per_entry_confidence_and_confirm_override_the_playbook(stack) -> None:
    (m,) = match_log(["frame A", "the message"], stack)
    assert (m.confidence, m.confirm) == ("certain", "nothing more to check")
    shown = stack[0].to_dict()["match"]["log"]
    assert shown == [
        {"stack": ["frame A", "frame B"], "within": 5},
        {"regex": "the message", "confidence": "certain", "confirm": "nothing more to check"},
    ]


def test_feed_reports_ids_per_line_for_the_live_detector(pbs) -> None:
    matcher = LogMatcher(pbs)
    assert matcher.feed("step=1 loss=2.0 tok/s=1000", 1) == []
    assert matcher.feed(
        "RuntimeError: CUDA error: an illegal memory access was encountered", 2
    ) == ["illegal-memory-access"]


@pytest.mark.parametrize(
    ("line", "want"),
    [
        ("{'loss': 0.1474, 'grad_norm': nan, 'learning_rate': 0.0001, 'epoch': 0.04}", []),
        ("{'loss': nan, 'grad_norm': nan, 'learning_rate': 0.0001, 'epoch': 0.04}", ["nan-loss"]),
        ("Epoch 1/200 5/5 [====] - 2s 454ms/step - loss: 1.0597 - val_loss: nan", ["nan-loss"]),
        ("loss: 0.5454 (0.6458)  loss_scale: 2048.0000  grad_norm: 10.5632 (inf)", []),
        ("[INFO] info: loss 2.31, throughput infinite", []),
        ("OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768", []),
        (
            "OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 2, reducing to 1",
            ["fp16-loss-scale"],
        ),
    ],
)
def test_loss_columns_and_loss_scales(pbs, line: str, want: list[str]) -> None:
    assert [m.id for m in match_log([line], pbs)] == want


def test_trie_prefilter_accepts_exactly_the_needles() -> None:
    import re

    rx = re.compile(trie_regex(["kill", "killed", "nan", "a.b", "已杀死"]))
    assert [bool(rx.search(s)) for s in ("skill", "nano", "axb", "a.b", "已杀死", "kil")] == [
        True,
        True,
        False,
        True,
        True,
        False,
    ]


@pytest.mark.parametrize("chunk", [1, 7, 64, 1 << 20])
def test_iter_log_lines_is_exact_at_any_chunk_size(tmp_path: Path, chunk: int) -> None:
    text = "first\n\nzweite Zeile: Getötet\r\n已杀死\n" + "x" * 50 + "\nlast without newline"
    p = tmp_path / "x.log"
    p.write_bytes(text.encode("utf-8"))
    got = list(iter_log_lines(p, max_chars=20, chunk_bytes=chunk))
    assert got == [
        "first",
        "",
        "zweite Zeile: Getöte",
        "已杀死",
        "x" * 20,
        "last without newline"[:20],
    ]


def test_iter_log_lines_skips_the_rest_of_a_huge_line_in_small_chunks(tmp_path: Path) -> None:
    p = tmp_path / "x.log"
    p.write_bytes(b"a" * 100_000 + b"\nNo space left on device\n")
    got = list(iter_log_lines(p, max_chars=1024, chunk_bytes=4096))
    assert got == ["a" * 1024, "No space left on device"]


@pytest.mark.parametrize(
    ("entry", "where", "problem"),
    [
        ('{regex: "x", stack: ["a", "b"]}', ":7: match.log[0]", "exactly one of regex, stack"),
        ('{stack: ["a"]}', ":7: match.log[0].stack", "at least 2 regexes"),
        ('{stack: ["a", "b"], within: 500}', ":7: match.log[0].within", "from 2 to 200"),
        ('{regex: "x", within: 3}', ":7: match.log[0].within", "only a stack"),
        ('{regex: "x", confidence: sure}', ":7: match.log[0].confidence", "certain, probable"),
        ('{stack: ["a", "(b"]}', ":7: match.log[0].stack[1]", "bad regex"),
        ('{regexp: "x"}', ":7: match.log[0].regexp", "did you mean 'regex'"),
    ],
)
def test_bad_signature_entry_is_one_error_with_file_line(
    entry: str, where: str, problem: str
) -> None:
    text = STACK.split("match:")[0] + f"match:\n  log:\n    - {entry}\ndiagnosis: d\nremedy: [r]\n"
    text = text.replace("confidence: probable\nconfirm: read the exception below the frames\n", "")
    with pytest.raises(ConfigError) as err:
        parse_playbook(text, "p.yaml")
    assert f"p.yaml{where}" in str(err.value) and problem in str(err.value), str(err.value)


def test_cli_diagnose_json_carries_confidence_and_confirm(capsys, tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text("loading shards\n100%|██████████| 64/64\nKilled\n")
    assert orch(["diagnose", str(log), "--json"]) == 0
    (m,) = json.loads(capsys.readouterr().out)["matches"]
    assert (m["id"], m["confidence"], m["lineno"]) == ("sigkill", "probable", 3)
    assert "kernel log" in m["confirm"]
    assert orch(["diagnose", str(log)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("1. sigkill [critical, probable]") and "\n   confirm: " in out
