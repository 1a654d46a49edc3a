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
        # (OpenNMT-py's "Step %2d/%5d; acc: ..." line has its own reader since sets 6 and 7:
        # tests/progress/test_names_readers.py)
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
        # a rate in chainer's words outside its ProgressBar
        ("step 40 | 3.5125 iters/sec", (40, None, 3.5125, "it/s")),
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


@pytest.mark.parametrize(
    ("lines", "want"),
    [
        # AlexeyAB/darknet src/detector.c: "\n %d: %f, %f avg loss, %f rate, %lf seconds, %d
        # images, %f hours left\n"; the loss is the first number, 'rate' the learning rate
        (
            [
                " 1200: 2.500000, 2.750000 avg loss, 0.001000 rate, 1.250000 seconds, 76800 "
                "images, 9.500000 hours left",
                "Loaded: 0.000050 seconds",
            ],
            ("darknet", 1200, None, 2.5, 1.25, "s/step"),
        ),
        # pjreddie/AlexeyAB 2018: '%d: %f, %f avg, %f rate, %lf seconds, %d images'
        (
            ["12: 0.500000, 0.400000 avg, 0.001000 rate, 3.000000 seconds, 768 images"],
            ("darknet", 12, None, 0.5, 3.0, "s/step"),
        ),
        # espnet2/train/reporter.py: f'{epoch}epoch:{key}:{prev_count + 1}-{count}batch: '
        # then f'{key2}={v:.3f}'; iter_time is the data iterator's, train_time the step's
        (
            [
                "(trainer:464) INFO: 2epoch:train:101-200batch: iter_time=1.000e-04, "
                "loss=40.500, loss_att=38.000, loss_ctc=45.000, acc=0.300, train_time=0.850",
                "(trainer:300) INFO: 2epoch:valid:1-10batch: loss=50.000",
            ],
            ("espnet2", 200, None, 40.5, 0.85, "s/step"),
        ),
        # chainer progress_bar.py: '{0.iteration:10} iter, {0.epoch} epoch / %s %ss' and
        # '{:10.5g} iters/sec. Estimated time to finish: {}.'
        (
            [
                "      2500 iter, 3 epoch / 20 epochs",
                "    12.345 iters/sec. Estimated time to finish: 0:20:00.",
            ],
            ("chainer", 2500, None, None, 12.345, "it/s"),
        ),
        # chainer with an iteration trigger: training_length (1000, 'iteration')
        (["       300 iter, 0 epoch / 1000 iterations"], ("chainer", 300, 1000, None, None, None)),
        # allennlp trainer.py (2017): 'Epoch %d/%d' (epochs from 0, of num_epochs - 1), then
        # 'Batch %d/%d: %s' with the metrics '%s: %.2f' joined by ', ' plus ' ||'
        (
            [
                "2017-10-14 16:48:27,962 - INFO - allennlp.training.trainer - Epoch 1/9",
                "2017-10-14 16:49:18,982 - INFO - allennlp.training.trainer - Batch 30/100: "
                "accuracy: 0.49, loss: 1.25 ||",
            ],
            ("allennlp", 130, 1000, 1.25, None, None),
        ),
        # flair trainer.py: f'epoch {epoch} - iter {seen}/{total} - loss {:.8f} - samples/sec:
        # {:.2f} - lr: {}' (epochs from 1); 'DEV : loss' is the evaluation's
        (
            [
                "2022-12-13 02:43:23,390 epoch 3 - iter 50/200 - loss 0.50000000 - "
                "samples/sec: 64.00 - lr: 0.000100",
                "2022-12-13 02:44:52,654 DEV : loss 0.9 - f1-score (micro avg)  0.8",
            ],
            ("flair", 450, None, 0.5, 64.0, "samples/s"),
        ),
        # YOLOX trainer.py: 'epoch: {}/{}, iter: {}/{}' (both from 1), time meters '{:.3f}s',
        # loss meters '{:.1f}', ', size: {:d}, ETA: {}'
        (
            [
                "yolox.core.trainer:246 - epoch: 2/10, iter: 30/100, mem: 7420Mb, "
                "iter_time: 0.500s, data_time: 0.100s, total_loss: 6.6, iou_loss: 2.4, "
                "l1_loss: 0.0, lr: 9.723e-03, size: 640, ETA: 1:00:00"
            ],
            ("yolox", 130, 1000, 6.6, 0.5, "s/step"),
        ),
        # YOLOv5 train.py: ('%10s' * 2 + '%10.4g' * 6) % (f'{epoch}/{epochs - 1}', mem,
        # *mloss, targets, img_size) as the bar's description; total (mloss[3]) is the loss
        (
            [
                "     Epoch   gpu_mem       box       obj       cls     total    labels  img_size",
                "     2/299      5.2G     0.05      0.02      0.01      0.08        28       640:"
                "  10%|#         | 8/78 [00:04<00:35,  2.00it/s]",
            ],
            ("yolov5", 164, 23400, 0.08, 2.0, "it/s"),
        ),
        # YOLOv5 v7.0: three losses, no total; bar_format '{l_bar}{bar:10}{r_bar}' without rate
        (
            [
                "        1/2      22.4G    0.07281    0.08384    0.06359        199        640: "
                "100%|##########| 100/100 13:15"
            ],
            ("yolov5", 200, 300, None, None, None),
        ),
        # ultralytics/engine/trainer.py: ('%11s' * 2 + '%11.4g' * (2 + n)) % (f'{epoch + 1}/
        # {self.epochs}', mem, *tloss, ...) under its header (dfl_loss): epochs from 1, no total
        (
            [
                "      Epoch    GPU_mem   box_loss   cls_loss   dfl_loss  Instances       Size",
                "       3/10      6.73G      1.081     0.4706      1.084         10        640: "
                "50%|#####     | 8/16 [00:05<00:05,  1.60it/s]",
            ],
            ("ultralytics", 40, 160, None, 1.6, "it/s"),
        ),
        # OpenPCDet timm style: 'Loss: {val:#.4g} ({avg:#.3g})', 'Acc_iter {:<10d}',
        # 'Batch time: {val:.2f}({avg:.2f})': the value before the mean
        (
            [
                "INFO  Train:    2/3 ( 67%) [  99/323 ( 31%)]  Loss: 23.51 (54.8)  LR: 2.377e-04  "
                "Time cost: 00:27/01:00 [00:27/03:55]  Acc_iter 422         Data time: "
                "0.00(0.01)  Forward time: 0.19(0.26)  Batch time: 0.20(0.27)"
            ],
            ("openpcdet", 422, None, 23.51, 0.2, "s/step"),
        ),
        # OpenPCDet 028ed72e: f'epoch: {e}/{E}, acc_iter={n}, cur_iter={i}/{n_e}, ...', then
        # disp_dict as 'key=val' (loss, b_time 'val(avg)')
        (
            [
                "INFO  epoch: 0/80, acc_iter=50, cur_iter=49/3712, batch_size=4, "
                "time_cost(epoch): 00:40/49:30, time_cost(all): 00:40/66:00:00, loss=3.25, "
                "d_time=0.01(0.02), f_time=0.75(0.80), b_time=0.76(0.82), lr=0.003"
            ],
            ("openpcdet", 50, None, 3.25, 0.76, "s/step"),
        ),
    ],
)
def test_set4_readers_read_their_format_strings(lines: list[str], want: tuple[object, ...]) -> None:
    """One reader per format, lines built from the format string its ``source`` cites."""
    fw, r = read_log(lines)
    assert (fw, r.step, r.total_steps, r.loss, r.rate, r.unit) == want
