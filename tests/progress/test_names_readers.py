"""Readers of frameworks that print their values under their own names (docs/progress.md,
"Names, non-finite loss and counters"): each asserted on lines built by formatting the
framework's own format string (the reader's ``source``) with values, plus the held-out
excerpts of sets 6 and 7 it now reads; and the non-finite loss through ``orch diagnose --json``.
"""

from __future__ import annotations

import datetime
import json
import math
import sys
from pathlib import Path

import pytest

from orchestrator.monitor.job_rates import job_rates
from orchestrator.wire.progress import Reading, detect, read_log
from orchestrator.wire.progress_summary import summary
from tests.progress.corpus import Case, _diagnose, judge, load

DATA = Path(__file__).resolve().parent.parent / "data"


def _basicsr(epoch: int, it: int, lrs: list[float], t: float, dt: float, logs: dict) -> str:
    """BasicSR 04d24493 basicsr/utils/logger.py MessageLogger.__call__, verbatim format."""
    message = f"[{'train_hat'[:5]}..][epoch:{epoch:3d}, iter:{it:8,d}, lr:("
    for v in lrs:
        message += f"{v:.3e},"
    message += ")] "
    eta_str = str(datetime.timedelta(seconds=int(3 * 86400 + 3600)))
    message += f"[eta: {eta_str}, "
    message += f"time (data): {t:.3f} ({dt:.3f})] "
    for k, v in logs.items():
        message += f"{k}: {v:.4e} "
    return "2024-01-01 10:00:00,000 INFO: " + message


def test_basicsr_one_l_term_is_the_loss_several_are_parts() -> None:
    line = _basicsr(14, 135100, [2e-4], 0.861, 0.002, {"l_pix": 0.01213})
    assert detect(line) == "basicsr"
    fw, r = read_log([line])
    assert (fw, r.step, r.loss, r.rate, r.unit) == ("basicsr", 135100, 0.01213, 0.861, "s/step")
    assert r.eta_s == 3 * 86400 + 3600
    gan = _basicsr(
        3, 4000, [1e-4, 1e-4], 0.5, 0.01, {"l_g_pix": 0.01, "l_g_gan": 0.07, "l_d_real": 0.3}
    )
    fw, r = read_log([gan])
    assert (r.step, r.loss, r.rate) == (4000, None, 0.5)
    # BasicSR 0.x codes/train.py: '<epoch:{:3d}, iter:{:8,d}, lr:{:.3e}> ' + '{:s}: {:.4e} '
    old = "<epoch:{:3d}, iter:{:8,d}, lr:{:.3e}> ".format(86, 107600, 2.5e-5)  # noqa: UP032
    old += "{:s}: {:.4e} ".format("l_pix", 1.9925e-3)
    fw, r = read_log([old])
    assert (fw, r.step, r.loss, r.rate) == ("basicsr", 107600, 1.9925e-3, None)


def _parlai(t: float, exs: int, report: dict, epochs: float | None = None) -> str:
    """ParlAI 0089bed6 parlai/scripts/train_model.py TrainLoop.log."""
    logs = [f"time:{t}s", f"total_exs:{exs}"]
    if epochs is not None:
        logs.append(f"epochs:{round(epochs, 2)}")
    return "[ {} ] {}".format(" ".join(logs), report)


def test_parlai_updates_loss_and_rates() -> None:
    line = _parlai(
        82.0,
        2190,
        {
            "exs": 570,
            "mean_loss": 4.698,
            "tokens_per_batch": 5807.0,
            "updates": 19,
            "total_train_updates": 73,
        },
        0.03,
    )
    assert detect(line) == "parlai"
    fw, r = read_log([line])
    assert (fw, r.step, r.loss, r.rate) == ("parlai", 73, 4.698, None)
    line = _parlai(
        6.0,
        9728,
        {
            "exs": 2368,
            "num_updates": 304,
            "loss": 17.45,
            "nll_loss": 0.79,
            "tps": 5120.0,
            "ups": 2.5,
        },
    )
    valid = "valid:{}".format({"exs": 1000, "num_updates": 304, "loss": 28.08})  # not the loss
    fw, r = read_log([line, valid])
    assert (fw, r.step, r.loss, r.rate, r.unit) == ("parlai", 304, 17.45, 5120.0, "tokens/s")
    fw, r = read_log([_parlai(1.0, 32, {"exs": 32, "train_loss": 330.1, "exps": 31.5})])
    assert (r.step, r.loss, r.rate, r.unit) == (None, 330.1, 31.5, "samples/s")


def _fasttext(progress: float, wst: float, lr: float, loss: float, new: bool = True) -> str:
    """fastText 8ca5bf09 src/fasttext.cc FastText::printInfo (setw/setprecision as there)."""
    name = " avg.loss: " if new else " loss: "
    return (
        f"Progress: {progress * 100:5.1f}% words/sec/thread: {int(wst):7d} lr: {lr:9.6f}"
        f"{name}{loss:9.6f} ETA:   0h11m"
    )


def test_fasttext_words_per_thread_as_its_own_unit() -> None:
    line = _fasttext(0.123, 1770342.7, 0.0877, 1.385707)
    assert detect(line) == "fasttext"
    fw, r = read_log([line])
    assert (fw, r.step, r.loss, r.rate, r.unit) == (
        "fasttext",
        None,
        1.385707,
        1770342.0,
        "words/s/thread",
    )
    fw, r = read_log([_fasttext(0.5, 95000, 0.05, 0.25, new=False)])
    assert (r.loss, r.rate) == (0.25, 95000.0)
    # two nodes' per-thread rates: their mean, never their sum
    (jr,) = job_rates([(100.0, "words/s/thread", None), (300.0, "words/s/thread", None)])
    assert (jr.value, jr.how) == (200.0, "mean per thread")


def test_detectron_json_stats_time_is_seconds_per_iteration() -> None:
    stats = dict(
        iter=55080, lr=0.01, time=0.266505, loss=0.024404, eta="0:21:51", mb_qsize=64, mem=6407
    )
    stats["loss_cls"] = 0.0019
    line = "json_stats: " + json.dumps(stats, sort_keys=True)  # logging.py log_json_stats
    assert detect(line) == "detectron"
    fw, r = read_log([line])
    assert (fw, r.step, r.loss, r.rate, r.unit, r.eta_s) == (
        "detectron",
        55080,
        0.024404,
        0.266505,
        "s/step",
        1311.0,
    )


def test_opennmt_py_target_tokens_and_epoch_counter() -> None:
    # OpenNMT-py 0.x Statistics.output
    fmt = "Epoch %2d, %5d/%5d; acc: %6.2f; ppl: %6.2f; xent: %6.2f; %3.0f src tok/s; %3.0f tgt tok/s; %6.0f s elapsed"
    line = fmt % (13, 64650, 64667, 56.1, 8.6, 2.15, 4980.4, 5043.2, 101234)
    assert detect(line) == "opennmt-py"
    fw, r = read_log([line])
    assert (fw, r.step, r.loss, r.rate, r.unit) == (
        "opennmt-py",
        12 * 64667 + 64650,
        2.15,
        5043.0,
        "tokens/s",
    )
    ppl_only = "Epoch %2d, %5d/%5d; acc: %6.2f; ppl: %6.2f; %3.0f src tok/s; %3.0f tgt tok/s; %6.0f s elapsed"
    fw, r = read_log([ppl_only % (1, 50, 1000, 4.2, 2981.6, 3465, 3541, 10)])
    assert (r.step, r.loss, r.rate) == (50, None, 3541.0)  # ppl is not the loss
    step = (
        "Step %2d/%5d; acc: %6.2f; ppl: %5.2f; xent: %4.2f; lr: %7.5f; %3.0f/%3.0f tok/s; %6.0f sec"
    )
    fw, r = read_log(
        [
            "[2018-11-26 15:12:08,893 INFO] "
            + step % (5750, 50000, 0.12, math.nan, math.nan, 0.00071, 1664, 2365, 21477)
        ]
    )
    assert (fw, r.step, r.total_steps, r.rate) == ("opennmt-py", 5750, 50000, 2365.0)
    assert r.loss is not None and math.isnan(r.loss)
    line = step % (300, 1000, 41.2, 30.12, 3.41, 0.0007, 9021, 8770, 612)
    fw, r = read_log(["[2024-01-01 10:00:00,000 INFO] " + line])
    assert (fw, r.step, r.total_steps, r.loss, r.rate) == ("opennmt-py", 300, 1000, 3.41, 8770.0)


HELD_OUT = (
    "progress_heldout7/basicsr",
    "progress_heldout7/parlai",
    "progress_heldout7/fasttext",
    "progress_heldout6/detectron-caffe2",
    "progress_heldout6/opennmt",
)


@pytest.mark.parametrize("where", HELD_OUT)
def test_the_held_out_excerpts_they_now_read(where: str) -> None:
    root = DATA / where
    cases = [c for c in load(root.parent) if c.path.parent == root]
    assert cases
    for c in cases:
        _, r = read_log(c.lines)
        assert all(judge(c, r).values()), (c.name, r)


def test_nonfinite_loss_is_named_beside_a_null_loss() -> None:
    for v, word in ((math.nan, "nan"), (math.inf, "inf"), (-math.inf, "-inf"), (2.5, None)):
        s = summary(None, Reading(step=1, loss=v))
        assert s["loss_nonfinite"] == word


def test_nonfinite_loss_through_the_cli(tmp_path: Path) -> None:
    """JSON's loss is null; loss_nonfinite names it, and score_cli judges a nan label by it."""
    line = "I0425 10:13:21.206111  9167 solver.cpp:65] Iteration 220, loss = nan"
    case = Case(tmp_path / "caffe" / "nan.log", "-", {"step": "220", "loss": "nan"}, (line,))
    p = _diagnose(case, tmp_path, sys.executable)
    assert (p["step"], p["loss"], p["loss_nonfinite"]) == (220, None, "nan")
    assert json.loads(json.dumps(p)) == p  # plain JSON, no NaN


def test_hf_speed_metrics_samples_per_second() -> None:
    """transformers trainer_utils.py speed_metrics: result[f"{split}_samples_per_second"] =
    round(num_samples / runtime, 3); a fork logs split 'train_step' each step, after the bar."""
    split = "train_step"
    logs = {f"{split}_runtime": 0.6717, f"{split}_samples_per_second": round(36 / 0.6717, 3)}
    bar = " 99%|█████████▊| 2090/2120 [26:04<00:20,  1.43it/s]"
    fw, r = read_log([bar, str({**logs, "epoch": 0.99})])
    assert (fw, r.step, r.total_steps, r.rate, r.unit) == (None, 2090, 2120, 53.595, "samples/s")
    root = DATA / "progress_heldout6" / "hf-trainer"
    (case,) = [c for c in load(root.parent) if c.name == "hf-trainer/hf-fork-step-throughput-dicts"]
    assert all(judge(case, read_log(case.lines)[1]).values())


def test_a_tqdm_description_carries_the_loss() -> None:
    """tqdm std.py format_meter writes f'{desc}: ' before the bar; a loop's
    pbar.set_description(f"Loss: {running_loss}") puts the loss there (wav2lip_288x288)."""
    desc = f"Loss: {0.5230060680346056}"
    line = f"{desc}: : 11it [00:06,  1.58it/s]"
    fw, r = read_log([line])
    assert (r.loss, r.rate, r.unit) == (0.5230060680346056, 1.58, "it/s")
    both = f"Loss: {0.9}:  50%|█████     | 5/10 [00:01<00:01,  4.00it/s, loss=0.7]"
    assert read_log([both])[1].loss == 0.7  # the postfix's value wins
    assert read_log(["Epoch 3:  50%|█████     | 5/10 [00:01<00:01,  4.00it/s]"])[1].loss is None
