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


@pytest.mark.parametrize(
    ("line", "want"),
    [
        # OpenNMT-py onmt/utils/statistics.py Statistics.output: "Step %2d/%5d; acc: %6.2f; ppl:
        # %5.2f; xent: %4.2f; lr: %7.5f; %3.0f/%3.0f tok/s; %6.0f sec" (xent is the loss)
        (
            "[2024-01-01 10:00:00,000 INFO] Step 300/1000; acc: 41.20; ppl: 30.12; xent: 3.41; "
            "lr: 0.00070; 9021/8770 tok/s;    612 sec",
            (300, 3.41, 8770.0, "tokens/s"),
        ),
        # TF examples/speech_commands/train.py: 'Step #%d: rate %f, accuracy %.1f%%, cross
        # entropy %f' ('rate' is the learning rate, not a throughput)
        (
            "INFO:tensorflow:Step #400: rate 0.001000, accuracy 71.0%, cross entropy 0.912345",
            (400, 0.912345, None, None),
        ),
        # darkflow net/flow.py: 'step {} - loss {} - moving ave loss {}': the mean is not the value
        (
            "step 12 - loss 101.5 - moving ave loss 103.25",
            (12, 101.5, None, None),
        ),
        # LitGPT finetune: f"iter {iter_num} step {step_count}: loss {loss:.4f}, iter time:
        # {(t1 - iter_t0) * 1000:.2f} ms" (ms per iteration)
        (
            "iter 80 | step 10: loss 1.6535, iter time: 97.41 ms",
            (10, 1.6535, 0.09741, "s/step"),
        ),
        # LitGPT (PR 1055): 'loss train (curr): {:.3f}, val (prev val iter): {} | iter time:'
        (
            "Ep 1 | iter 8 | step 2: loss train (curr): 1.761, val (prev val iter): None | "
            "iter time: 121.17 ms (opt.step)",
            (2, 1.761, 0.12117, "s/step"),
        ),
        # Caffe solver.cpp Solver::Step: "Iteration " << iter_ << " (" << per_s << " iter/s, "
        # << lapse << "s/" << display << " iters), loss = " << smoothed_loss_
        (
            "I1109 10:35:32.961859  9709 solver.cpp:219] Iteration 370 (0.25 iter/s, "
            "40s/10 iters), loss = 0.125",
            (370, 0.125, 0.25, "it/s"),
        ),
        # chainer ProgressBar: '{:10.5g} iters/sec. Estimated time to finish: {}.'
        ("    3.5125 iters/sec. Estimated time to finish: 0:10:00.", (None, None, 3.5125, "it/s")),
        # a trainer printing yolox-style 'iter_time: {:.3f}s' and 'total_loss: {:.1f}'
        ("iter: 7, iter_time: 0.250s, total_loss: 3.5", (7, 3.5, 0.25, "s/step")),
        # NeMo's 'train_step_timing in s' under another printer; reduced_train_loss
        (
            "step: 5 | reduced_train_loss: 2.25 | train_step_timing in s: 0.5",
            (5, 2.25, 0.5, "s/step"),
        ),
        # OpenPCDet timm style 'Batch time: {val:.2f}({avg:.2f})': the value, not the mean
        ("Loss: 28.79 (45.1)  Batch time: 0.15(0.25)", (None, 28.79, 0.15, "s/step")),
        # modded-nanogpt's train_time:Xms is the run's elapsed time: only train_time= is a time
        ("step 3 train_time:164680ms", (3, None, None, None)),
    ],
)
def test_generic_reader_reads_other_trainers_names(
    line: str, want: tuple[object, object, object, object]
) -> None:
    fw, r = read_log([line])
    assert (fw, r.step, r.loss, r.rate, r.unit) == (None, *want)


def test_a_step_printed_after_a_bar_is_newer_than_the_bars() -> None:
    """DeepLearningExamples' run_squad.py: dllogger's line lands after the tqdm bar on the same
    terminal line ('Training Iteration: 701  step_loss : 0.707'), one step past the bar's n."""
    line = (
        "Iteration:  25%|##5       | 700/2771 [01:30<04:19,  7.97it/s]DLL 2022-04-05 "
        "05:10:42.601126 - Training Epoch: 0 Training Iteration: 701  step_loss : 0.7071  "
        "learning_rate : 2.9e-05"
    )
    fw, r = read_log([line])
    assert (r.step, r.total_steps, r.loss, r.rate, r.unit) == (701, 2771, 0.7071, 7.97, "it/s")


def test_kohya_bar_postfix_avr_loss() -> None:
    """musubi-tuner / sd-scripts: the accelerate 'steps' bar, postfix avr_loss (its only loss)."""
    line = "steps:  41%|####      | 39/96 [13:54<20:19, 21.40s/it, avr_loss=0.0806]"
    fw, r = read_log([line])
    assert (r.step, r.total_steps, r.loss, r.unit) == (39, 96, 0.0806, "it/s")
    assert r.rate == pytest.approx(1 / 21.40)
