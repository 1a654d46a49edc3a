"""The readers added for held-out set 4's misses (docs/progress.md), each asserted on lines built
from the format string that prints them (the reader's ``source``), units kept apart."""

from __future__ import annotations

import pytest

from orchestrator.wire.progress import detect, read_log

# NVIDIA/NeMo nemo/lightning/pytorch/callbacks/progress_printer.py: prefix
# f"Training epoch {epoch}, iteration {n}/{total}", then f" | {metric}: {val:.4}" per metric.
NEMO2 = (
    "Training epoch 0, iteration 41/500 | lr: 0.0003 | consumed_samples: 1344 | "
    "global_batch_size: 32 | global_step: 41 | reduced_train_loss: 6.812 | "
    "train_step_timing in s: 1.204 | val_loss: 7.25"
)
# Megatron-LM core_r0.9.0 training_log: ' iteration {:8d}/{:8d} |' then ' {key}: {:.6E} |'.
MEGATRON = (
    " [2024-07-01 10:00:00] iteration       41/     500 | consumed samples:         1344 | "
    "elapsed time per iteration (ms): 1204.0 | lm loss: 6.812000E+00 | loss scale: 1.0 |"
)


def test_nemo2_line_is_nemo_not_megatron() -> None:
    """NeMo 2's ProgressPrinter line shares Megatron's 'iteration N/M |' but is not Megatron's:
    its loss is reduced_train_loss, its time train_step_timing in s."""
    assert detect(NEMO2) == "nemo"
    assert detect(MEGATRON) == "megatron"
    fw, r = read_log([NEMO2])
    assert (fw, r.step, r.total_steps, r.loss, r.rate, r.unit) == (
        "nemo",
        41,
        500,
        6.812,
        1.204,
        "s/step",
    )
    fw, r = read_log([MEGATRON])
    assert (fw, r.step, r.loss, r.rate, r.unit) == ("megatron", 41, 6.812, 1.204, "s/step")


def test_nemo2_without_timing_and_validation_lines() -> None:
    """No time printed: no rate; the validation progress line gives no loss."""
    lines = [
        "Training epoch 0, iteration 8/9 | lr: 0.0006 | global_step: 8 | reduced_train_loss: 7.113",
        "Validation: iteration 1/2",
    ]
    fw, r = read_log(lines)
    assert (fw, r.step, r.total_steps, r.loss, r.rate) == ("nemo", 8, 9, 7.113, None)


@pytest.mark.parametrize(
    ("line", "loss"),
    [
        # NeMo 1 on Lightning 1.x's bar: loss= is Lightning's running mean, reduced_train_loss
        # the step's (logged by NeMo's MegatronGPTModel.training_step)
        (
            "Epoch 0:   1%|          | 795/77225 [9:07:58<878:01:48, 41.36s/it, loss=3.1, v_num=, "
            "reduced_train_loss=3.090, global_step=794.0, consumed_samples=1.63e+6]",
            3.09,
        ),
    ],
)
def test_nemo1_lightning_bar_reads_the_steps_loss(line: str, loss: float) -> None:
    fw, r = read_log([line])
    assert (fw, r.loss, r.step) == ("lightning", loss, 795)
