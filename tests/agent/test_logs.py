"""The agent's log reader keeps what a progress bar said before a ``tqdm.write`` message.

The stream below is what tqdm v4.66.0 (``tqdm/std.py``) wrote to a redirected file for
``tqdm(total=1000, ascii=True, ncols=80)``, three ``update(1)`` calls, then
``tqdm.write("{'loss': ...}")`` and one more update: ``tqdm.write`` clears the bar
(``'\\r' + spaces + '\\r'``), writes the message and its newline, then redraws the bar, so one
raw line holds the bars and the message. Generated once with that tqdm release; the rates are
what it printed.
"""

from __future__ import annotations

import time
from pathlib import Path

from orchestrator.agent.logs import MAX_CR_SEGMENTS, LogReader, cr_segments, tail_lines
from orchestrator.agent.metrics import MetricParser

TQDM_466 = (
    b"\r  0%|                                                  | 0/1000 [00:00<?, ?it/s]"
    b"\r  0%|                                      | 1/1000 [00:00<00:00, 161319.38it/s]"
    b"\r  0%|                                       | 2/1000 [00:00<00:00, 22130.10it/s]"
    b"\r  0%|1                                      | 3/1000 [00:00<00:00, 22051.97it/s]"
    b"\r"
    + b" "
    * 80
    + b"\r{'loss': 2.5, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.03}\n"
    b"\r  0%|1                                      | 3/1000 [00:00<00:00, 22051.97it/s]"
    b"\r  0%|1                                      | 4/1000 [00:00<00:00, 13387.68it/s]"
)


def _log(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "train.log"
    path.write_bytes(data)
    return path


def test_the_bar_before_a_tqdm_write_survives(tmp_path: Path) -> None:
    chunk = LogReader().read(str(_log(tmp_path, TQDM_466)), None)
    assert chunk.lines == (
        "  0%|1                                      | 3/1000 [00:00<00:00, 22051.97it/s]",
        "{'loss': 2.5, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.03}",
    )  # the unterminated bar after the newline waits for its line to end


def test_the_snapshot_reads_the_step_from_that_bar(tmp_path: Path) -> None:
    """HF Trainer's dicts carry no step: the step and rate come from the bar beside them."""
    chunk = LogReader().read(str(_log(tmp_path, TQDM_466)), None)
    m = MetricParser().parse(chunk.lines, time.time())
    assert m is not None
    assert (m.step, m.total_steps, m.loss) == (3, 1000, 2.5)
    assert (m.throughput, m.throughput_unit) == (22051.97, "it/s")


def test_tail_lines_keeps_the_bar_too(tmp_path: Path) -> None:
    lines, size = tail_lines(_log(tmp_path, TQDM_466 + b"\n"), 3)
    assert size == len(TQDM_466) + 1
    assert lines == [
        "{'loss': 2.5, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.03}",
        "  0%|1                                      | 3/1000 [00:00<00:00, 22051.97it/s]",
        "  0%|1                                      | 4/1000 [00:00<00:00, 13387.68it/s]",
    ]


def test_a_cleared_bar_is_not_a_blank_line(tmp_path: Path) -> None:
    chunk = LogReader().read(str(_log(tmp_path, b"\r 9/9 [00:09]\r" + b" " * 40 + b"\r\n")), None)
    assert chunk.lines == (" 9/9 [00:09]",)


def test_a_megabyte_of_redraws_on_one_line_is_bounded(tmp_path: Path) -> None:
    bar = b"\r 50%%|#####     | %d/100000 [00:10<00:10, 5000.00it/s]"
    data = b"".join(bar % i for i in range(20_000)) + b"\n"
    assert len(data) > 1_000_000
    reader = LogReader(max_line_bytes=200, max_read_bytes=4 << 20)
    lines = reader.read(str(_log(tmp_path, data)), 0).lines
    assert len(lines) == MAX_CR_SEGMENTS
    assert lines[-1].startswith(" 50%|#####     | 19999/100000")
    segs = cr_segments(data, 200)
    assert len(segs) == MAX_CR_SEGMENTS and all(len(s) <= 200 for s in segs)


def test_a_single_huge_segment_is_cut_not_lost() -> None:
    raw = b"\r" + b"x" * 100_000
    assert cr_segments(raw, 100) == [b"x" * 303]
