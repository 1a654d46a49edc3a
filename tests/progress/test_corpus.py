"""Every real excerpt of tests/data/progress reads as the person who read it says, through the
same function ``orch diagnose LOG --json`` uses; each reader is exercised by real lines."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

from orchestrator.wire.progress import read_log
from orchestrator.wire.progress_readers import READERS
from tests.progress.corpus import Case, judge, load, score

CASES = load()


def test_corpus_is_big_and_sourced() -> None:
    assert len(CASES) >= 36
    assert len({c.path.parent.name for c in CASES}) >= 12
    for c in CASES:
        assert c.source.startswith("https://github.com/"), c.name
        assert c.lines and any(x.strip() for x in c.lines), c.name


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_excerpt_reads_as_expected(case: Case) -> None:
    framework, r = read_log(case.lines)
    verdict = judge(case, r)
    assert all(verdict.values()), f"{case.name} ({framework}): {verdict} from {r}"


def test_score_meets_the_target() -> None:
    """At least 33 of 36 (the issue's bar), scaled to the corpus size, for each of the three."""
    s = score(CASES)
    n = int(s["n"])  # type: ignore[call-overload]
    for key in ("step", "loss", "throughput"):
        assert int(s[key]) >= n * 33 / 36, (key, s)  # type: ignore[call-overload]


HELDOUT2 = load(Path(__file__).resolve().parent.parent / "data" / "progress_heldout2")
HELDOUT3 = load(Path(__file__).resolve().parent.parent / "data" / "progress_heldout3")
HELDOUT4 = load(Path(__file__).resolve().parent.parent / "data" / "progress_heldout4")
HELDOUT5 = load(Path(__file__).resolve().parent.parent / "data" / "progress_heldout5")
HELDOUT6 = load(Path(__file__).resolve().parent.parent / "data" / "progress_heldout6")
HELDOUT7 = load(Path(__file__).resolve().parent.parent / "data" / "progress_heldout7")
HELDOUT8 = load(Path(__file__).resolve().parent.parent / "data" / "progress_heldout8")
HELDOUT9 = load(Path(__file__).resolve().parent.parent / "data" / "progress_heldout9")
HELDOUT10 = load(Path(__file__).resolve().parent.parent / "data" / "progress_heldout10")


def test_every_framework_reader_meets_real_lines() -> None:
    """Each table of progress_readers detects at least one real excerpt (of the corpus or of
    held-out set 2, whose misses the tinygrad and torch_xla readers were written for, or of set
    3, whose misses the torchtune, detectron2, modded-nanogpt, paddle and maskrcnn-benchmark
    readers were written for, or of set 4, whose misses the nemo, darknet, espnet2, chainer,
    allennlp, flair, yolox, yolov5 and openpcdet readers were written for, or of sets 6 and 7,
    whose misses the basicsr, parlai, fasttext, detectron and opennmt-py readers were written
    for, or of set 8, whose misses the timm reader was written for)."""
    seen = {
        read_log(c.lines)[0]
        for c in (*CASES, *HELDOUT2, *HELDOUT3, *HELDOUT4, *HELDOUT6, *HELDOUT7, *HELDOUT8)
    }
    missing = [r.name for r in READERS if r.name not in seen]
    assert not missing, missing


def test_diagnose_json_reports_the_progress_object() -> None:
    """``orch diagnose LOG --json``: the ``progress`` object, null where the log does not say."""
    log = next(c.path for c in CASES if c.name == "megatron/mixtral-tflops")
    out = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "diagnose", "--json", str(log)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    got = json.loads(out)["progress"]
    assert got == {
        "framework": "megatron",
        "step": 73,
        "total_steps": 100,
        "loss": 1.798953,
        "loss_nonfinite": None,
        "throughput": {"value": 224.0, "unit": "TFLOP/s/device"},
        "eta_s": None,
    }
    text = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "diagnose", str(log)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert "progress (megatron): step 73/100, loss 1.799, 224 TFLOP/s/device" in text


def test_heldout2_after_adjusting() -> None:
    """Held-out set 2 (docs/progress.md): every excerpt reads as labelled once the readers were
    adjusted for the frozen readers' misses (no longer held out: a regression guard)."""
    s = score(HELDOUT2)
    assert len(HELDOUT2) >= 36
    assert (s["step"], s["loss"], s["throughput"]) == (s["n"],) * 3, s["misses"]


def test_heldout3_is_new_and_not_below_its_frozen_score() -> None:
    """Held-out set 3 (docs/progress.md): collected after the readers were frozen at dd362b7, no
    URL shared with the earlier sets; frozen score step 41, loss 44, throughput 31 of 48; after
    the adjustment for its misses (docs/progress.md) 44, 46, 45, and after set 4's (the
    Ultralytics reader, the generic loss names) 45, 47, 45; after set 5's (the generic epoch
    families) 44, 47, 45: ner-toolkit's 'epoch:0, batch: 171' is labelled no step, where the
    generic reader now counts the first epoch's position as the run's step (set 5's icefall,
    MXNet and Sockeye excerpts are labelled so). Never worse than that."""
    assert len(HELDOUT3) >= 40
    _assert_new_and_at_least(HELDOUT3, (*CASES, *HELDOUT2), step=44, loss=47, throughput=45)


def _assert_new_and_at_least(
    cases: list[Case], earlier: tuple[Case, ...], *, step: int, loss: int, throughput: int
) -> None:
    """A held-out set shares no URL and no line with a number in it with ``earlier`` (a
    paste's `...` may recur), and reads at least the given counts."""
    assert not {c.source for c in earlier} & {c.source for c in cases}

    def numbered(group: Iterable[Case]) -> set[str]:
        lines = (line.strip() for c in group for line in c.lines)
        return {s for s in lines if any(ch.isdigit() for ch in s)}

    assert not numbered(earlier) & numbered(cases)
    s = score(cases)
    right = {k: int(str(s[k])) for k in ("step", "loss", "throughput")}
    floor = {"step": step, "loss": loss, "throughput": throughput}
    assert all(right[k] >= floor[k] for k in floor), (right, s["misses"])


@pytest.mark.parametrize(
    ("line", "want"),
    [
        # meta-pytorch/torchtune#2605 (StdoutLogger.log_dict); class_loss/kd_loss are parts
        (
            "Step 8 | loss:1.85 class_loss:2.0 kd_loss:1.7 lr:2e-05 "
            "tokens_per_second_per_gpu:351.9",
            ("torchtune", 8, 1.85, 351.9, "tokens/s/device"),
        ),
        # a torchtune log without a rate: gpu_resources is bytes, never a throughput
        (
            "Step 17 | loss:0.97 lr:2e-05 gpu_resources:40627453440 ",
            ("torchtune", 17, 0.97, None, None),
        ),
        # facebookresearch/detectron2#3363 (CommonMetricPrinter): time is seconds per iteration
        (
            "[08/14 10:48:18 d2.utils.events]:  eta: 0:22:36  iter: 9079  total_loss: 0.4138  "
            "loss_cls: 0.07042  time: 0.4564  data_time: 0.0458  lr: 0.0003  max_mem: 1962M",
            ("detectron2", 9079, 0.4138, 0.4564, "s/step"),
        ),
        # KellerJordan/modded-nanogpt#65: val_loss is not the training loss; step_avg in ms
        (
            "step:625/1480 val_loss:3.6328 train_time:164680ms step_avg:267.77ms",
            ("modded-nanogpt", 625, None, 0.26777, "s/step"),
        ),
        # facebookresearch/fairseq#2493: JsonProgressBar.print's tag-prefixed epoch stats
        (
            '2021-01-05 23:15:06 | INFO | train | {"epoch": 62, "train_loss": "531.664", '
            '"train_wps": "2933.6", "train_ups": "0.31", "train_num_updates": "1914"}',
            ("fairseq", 1914, 531.664, 2933.6, "words/s"),
        ),
        # PaddlePaddle/PaddleDetection (ppdet/engine/callbacks.py): an image is a sample
        (
            "[07/21 14:47:48] ppdet.engine INFO: Epoch: [0] [ 60/200] learning_rate: 0.000075 "
            "loss: 113.562012 eta: 10 days, 14:16:13 batch_cost: 7.1558 data_cost: 6.5692 "
            "ips: 4.4719 images/s",
            ("paddle", 60, 113.562012, 4.4719, "samples/s"),
        ),
        # PaddleSpeech deepspeech2 model.py: 'train time' is the step's seconds
        (
            "Train: Rank: 0, epoch: 1, step: 5316, batch : 1565/1876, lr: 0.00000000, "
            "data time: 0.000s, train time: 2.994s, batch size: 64, train_loss: 16.016537",
            ("paddle", 5316, 16.016537, 2.994, "s/step"),
        ),
        # maskrcnn-benchmark MetricLogger: 'median (global_avg)', the median is the step's
        (
            "maskrcnn_benchmark.trainer INFO: eta: 0:17:37  iter: 87940  loss: 0.6097 (0.9191)  "
            "time: 0.5063 (0.5132)  data: 0.0062 (0.0078)  lr: 0.000025  max mem: 3210",
            ("maskrcnn-benchmark", 87940, 0.6097, 0.5063, "s/step"),
        ),
        # mmcv 1.x TextLoggerHook by iteration (IterBasedRunner); data_time is not the time
        (
            "2023-06-21 05:37:33,547 - mmseg - INFO - Iter [400/21600]\tlr: 9.992e-03, eta: 0:56:25, "
            "time: 0.141, data_time: 0.008, memory: 22159, loss: 1.8561",
            ("mmengine", 400, 1.8561, 0.141, "s/step"),
        ),
    ],
)
def test_set3_readers_read_their_format_strings(line: str, want: tuple[object, ...]) -> None:
    """The readers added for set 3's misses, one real line each, units kept apart."""
    fw, r = read_log([line])
    assert (fw, r.step, r.loss, r.rate, r.unit) == want


def test_heldout4_is_new_and_not_below_its_frozen_score() -> None:
    """Held-out set 4 (docs/progress.md): collected after the readers were frozen at 30de210, no
    URL shared with the earlier sets; frozen score step 23, loss 18, throughput 23 of 36; after
    the adjustment for its misses (docs/progress.md; seen, so no longer held out) 36, 36, 36:
    never worse than that."""
    assert len(HELDOUT4) == 36
    _assert_new_and_at_least(
        HELDOUT4, (*CASES, *HELDOUT2, *HELDOUT3), step=36, loss=36, throughput=36
    )


def test_heldout5_is_new_and_not_below_its_blind_score() -> None:
    """Held-out set 5 (docs/progress.md): collected blind to the readers, no URL or line shared
    with the earlier sets; scored step 16, loss 19, throughput 21 of 36 by the readers frozen at
    30de210 and 17, 20, 21 by set 4's adjustment (090af0e); after the generic families written
    for its misses (seen, so no longer held out) 33, 35, 36 read in process (through the CLI's
    JSON a NaN or infinite loss is null: 33, 33, 36): never worse than that."""
    assert len(HELDOUT5) == 36
    _assert_new_and_at_least(
        HELDOUT5, (*CASES, *HELDOUT2, *HELDOUT3, *HELDOUT4), step=33, loss=35, throughput=36
    )


def test_heldout6_is_new_and_not_below_its_blind_score() -> None:
    """Held-out set 6 (docs/progress.md): collected blind to the readers, no URL or line shared
    with the earlier sets; scored before any change by the generic families (802dc02): step 24,
    loss 32 (31 through the CLI, whose JSON writes a NaN loss as null), throughput 28 of 36;
    after the tables and names adjustments made from it (seen, so no longer held out) 30, 35,
    35: never worse than that."""
    assert len(HELDOUT6) == 36
    _assert_new_and_at_least(
        HELDOUT6,
        (*CASES, *HELDOUT2, *HELDOUT3, *HELDOUT4, *HELDOUT5),
        step=30,
        loss=35,
        throughput=35,
    )


def test_heldout7_is_new_and_not_below_its_blind_score() -> None:
    """Held-out set 7 (docs/progress.md): collected blind to the readers, no URL or line shared
    with the earlier sets; scored before any change by the readers of 3dd8239 (set 6's misses
    not yet adjusted): step 28, loss 29 (27 through the CLI, whose JSON writes a NaN loss as
    null), throughput 32 of 36; after the tables and names adjustments made from it (seen) 31,
    35, 35: never worse than that."""
    assert len(HELDOUT7) == 36
    _assert_new_and_at_least(
        HELDOUT7,
        (*CASES, *HELDOUT2, *HELDOUT3, *HELDOUT4, *HELDOUT5, *HELDOUT6),
        step=31,
        loss=35,
        throughput=35,
    )


def test_heldout8_is_new_and_not_below_its_blind_score() -> None:
    """Held-out set 8 (docs/progress.md): collected blind to the readers, no URL or line shared
    with the earlier sets; scored once before any change by the readers of 85133c1: step 29,
    loss 30, throughput 28 of 36 (the same in process and through the CLI); after the
    adjustment made from it (seen, so no longer held out) 32, 31, 31: never worse than that."""
    assert len(HELDOUT8) == 36
    _assert_new_and_at_least(
        HELDOUT8,
        (*CASES, *HELDOUT2, *HELDOUT3, *HELDOUT4, *HELDOUT5, *HELDOUT6, *HELDOUT7),
        step=32,
        loss=31,
        throughput=31,
    )


def test_heldout9_is_new_and_not_below_its_blind_score() -> None:
    """Held-out set 9 (docs/progress.md): collected blind after the readers were frozen at
    9dfb7d7, no URL or line shared with the earlier sets; scored once before any change: step
    27, loss 31, throughput 29 of 36 (the same in process and through the CLI); after the
    adjustment made from it (seen) 28, 32, 34: never worse than that."""
    assert len(HELDOUT9) == 36
    _assert_new_and_at_least(
        HELDOUT9,
        (*CASES, *HELDOUT2, *HELDOUT3, *HELDOUT4, *HELDOUT5, *HELDOUT6, *HELDOUT7, *HELDOUT8),
        step=28,
        loss=32,
        throughput=34,
    )


def test_heldout10_is_new_and_not_below_its_blind_score() -> None:
    """Held-out set 10 (docs/progress.md): collected blind after the readers were frozen at
    7f059c4, labelled by each field's newest value, no URL or line shared with the earlier
    sets; scored once before any change: step 31, loss 33, throughput 30 of 36; 31 after the
    thousands-suffix fix made from it (seen)."""
    assert len(HELDOUT10) == 36
    earlier = (*CASES, *HELDOUT2, *HELDOUT3, *HELDOUT4, *HELDOUT5, *HELDOUT6, *HELDOUT7)
    _assert_new_and_at_least(
        HELDOUT10, (*earlier, *HELDOUT8, *HELDOUT9), step=31, loss=33, throughput=31
    )
