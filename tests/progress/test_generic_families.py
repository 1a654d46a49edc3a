"""The generic reader's families (docs/progress.md, ``progress_generic``), each asserted on lines
built from the format string that prints them (cited per case), not on the held-out excerpts:
loss-like keys, positions within an epoch, rates and times under other names."""

from __future__ import annotations

import math

import pytest

from orchestrator.wire.progress import read_log

# (lines, step, loss, rate, unit): None where the lines do not say.
CASES = [
    pytest.param(
        # MXNet python/mxnet/callback.py Speedometer:
        # 'Epoch[%d] Batch [%d]\tSpeed: %.2f samples/sec' + '\t%s=%f' per metric; epochs from 0
        ["INFO:root:Epoch[0] Batch [300]\tSpeed: 812.55 samples/sec\taccuracy=0.510000"],
        300,
        None,
        812.55,
        "samples/s",
        id="mxnet-speedometer-first-epoch",
    ),
    pytest.param(
        # the same, the second epoch (MXNet counts from 0): the epoch's length is not printed
        [
            "INFO:root:Epoch[0] Batch [300]\tSpeed: 812.55 samples/sec\taccuracy=0.51",
            "INFO:root:Epoch[1] Batch [100]\tSpeed: 790.10 samples/sec\taccuracy=0.62",
        ],
        None,
        None,
        790.10,
        "samples/s",
        id="mxnet-speedometer-later-epoch-no-step",
    ),
    pytest.param(
        # Sockeye's Speedometer adds tokens/sec and updates/sec: tokens/s is the run's rate
        ["Epoch[0] Batch [50]  Speed: 410.20 samples/sec 12001.50 tokens/sec 2.10 updates/sec"],
        50,
        None,
        12001.5,
        "tokens/s",
        id="sockeye-tokens",
    ),
    pytest.param(
        # CNTK Source/SGDLib/SGD.cpp: ' Epoch[%2d of %d]-Minibatch[%4d-%4d]: ... TrainLossPerSample
        # = %.8g; ... TotalTime = %.4fs; SamplesPerSecond = %.1f'; MSVC prints NaN as 1.#QNAN
        [
            " Epoch[ 1 of 3]-Minibatch[   1- 100]: SamplesSeen = 6400; TrainLossPerSample = "
            " 1.#QNAN000; EvalErr[0]PerSample = 0.50000000; TotalTime = 3.2000s; "
            "SamplesPerSecond = 2000.0"
        ],
        100,
        math.nan,
        2000.0,
        "samples/s",
        id="cntk-minibatch-msvc-nan",
    ),
    pytest.param(
        # CNTK: 'Finished Epoch[%2d of %d]: [Training Set] TrainLossPerSample = %.8g; '
        [
            " Epoch[ 4 of 9]-Minibatch[ 201- 300]: TrainLossPerSample =  0.5; SamplesPerSecond = 9.5",
            "Finished Epoch[ 4 of 9]: [Training Set] TrainLossPerSample = 0.41; EpochTime=9.1",
        ],
        None,
        0.41,
        9.5,
        "samples/s",
        id="cntk-epoch-summary",
    ),
    pytest.param(
        # Marian: 'Ep. {} : Up. {} : Sen. {} : Cost {:.2f} : Time {} : {:.2f} words/s'
        [
            "[2020-01-01 00:00:00] Ep. 2 : Up. 3000 : Sen. 96,000 : Cost 4.25 : Time 60.10s : "
            "5100.30 words/s",
            "[2020-01-01 00:01:00] [valid] Ep. 2 : Up. 3000 : cross-entropy : 99.5 : new best",
        ],
        3000,
        4.25,
        5100.3,
        "words/s",
        id="marian-update",
    ),
    pytest.param(
        # PaddlePaddle v1 TrainerStats::showStats after ' Batch=': 'samples= AvgCost= CurrentCost='
        [
            "I0101 00:00:00.0 1 TrainerInternal.cpp:163]  Batch=100 samples=3200 AvgCost=2.5 "
            "CurrentCost=2.25 Eval: "
        ],
        None,
        2.25,
        None,
        None,
        id="paddle-v1-current-cost",
    ),
    pytest.param(
        # paddle.v2 event_handler: 'Pass %d, Batch %d, Cost %f'; passes from 0
        ["Pass 0, Batch 100, Cost 2.000000, {'error': 0.5}"],
        100,
        2.0,
        None,
        None,
        id="paddle-v2-first-pass",
    ),
    pytest.param(
        # icefall train.py: f'Epoch {cur_epoch}, batch {batch_idx}, loss[{loss_info}],
        # tot_loss[{tot_loss}], batch size: {n}': the batch's loss, not the running mean's
        [
            "Epoch 1, batch 20, loss[loss=0.5, simple_loss=1.0, over 100.00 frames.], "
            "tot_loss[loss=0.75, simple_loss=1.5, over 900.00 frames.], batch size: 8"
        ],
        20,
        0.5,
        None,
        None,
        id="icefall-batch-loss",
    ),
    pytest.param(
        # clu metric_writers LoggingWriter behind absl's prefix: '[%d] ' then 'k=v, ...'
        [
            "I0101 00:00:00.000000 1 logging_writer.py:35] [700] steps_per_second=2.5, "
            "train_loss=0.25"
        ],
        700,
        0.25,
        2.5,
        "it/s",
        id="clu-logging-writer",
    ),
    pytest.param(
        # rsl_rl on_policy_runner.py: ' Learning iteration {it}/{tot_iter} ', then
        # 'Steps per second:' (environment steps: samples/s), 'Mean value loss:' (a part)
        [
            "                Learning iteration 5/100                ",
            "                  Steps per second: 2048 ",
            "                   Mean value loss: 0.5000",
        ],
        5,
        None,
        2048.0,
        "samples/s",
        id="rsl-rl-iteration",
    ),
    pytest.param(
        # NVIDIA tacotron2 train.py: 'Train loss {} {:.6f} Grad Norm {:.6f} {:.2f}s/it'
        ["Train loss 12 0.500000 Grad Norm 2.000000 4.00s/it", "Validation loss 12: 0.900000"],
        12,
        0.5,
        0.25,
        "it/s",
        id="tacotron2-train-loss",
    ),
    pytest.param(
        # TensorFlow word2vec_basic.py: print('Average loss at step ', step, ': ', average_loss)
        ["Average loss at step  4000 :  12.5"],
        4000,
        12.5,
        None,
        None,
        id="word2vec-average-loss",
    ),
    pytest.param(
        # llama.cpp train_opt_callback: 'iter=%6d sample=%zu/%zu sched=%f loss=%f dt=%s eta=%s'
        [
            "train_opt_callback: iter=     9 sample=10/200 sched=0.090000 loss=3.500000 "
            "dt=00:01:05 eta=00:20:00 |----->"
        ],
        9,
        3.5,
        65.0,
        "s/step",
        id="llamacpp-dt",
    ),
    pytest.param(
        # MONAI tutorials: f'{step}/{epoch_len}, train_loss: {loss:.4f} step time: {t:.4f}'
        # after print(f'epoch {epoch + 1}/{max_epochs}'): epochs from 1
        ["epoch 3/10", "4/8, train_loss: 0.2500 step time: 0.5000"],
        20,
        0.25,
        0.5,
        "s/step",
        id="monai-tutorial-epoch-position",
    ),
    pytest.param(
        # a printed epoch length: 'Epoch [e/E], Step [i/n]' (1-based), the run's step e-1 x n + i
        ["Epoch [3/50], Step [10/100], Mel Loss: 0.5, Gen Loss: 2.0"],
        210,
        None,
        None,
        None,
        id="epoch-step-brackets-parts-only",
    ),
    pytest.param(
        # DeepSpeed-Chat step3 main.py: 'epoch: {}|step: {}|ppo_ep: {}|act_loss: {}|cri_loss:',
        # the timer's '|CurSamplesPerSec={} |AvgSamplesPerSec={}'
        [
            "|E2E latency=2.00s |CurSamplesPerSec=1.50 |AvgSamplesPerSec=1.90",
            "epoch: 0|step: 40|ppo_ep: 1|act_loss: inf|cri_loss: 1.0|unsuper_loss: 0.0",
        ],
        40,
        math.inf,
        1.5,
        "samples/s",
        id="dschat-actor-loss",
    ),
    pytest.param(
        # OpenNMT-tf 1.x: tf.estimator's 'loss = %s, step = %s' and its words_per_sec hooks
        [
            "INFO:tensorflow:loss = 3.5, step = 201 (40.1 sec)",
            "INFO:tensorflow:global_step/sec: 2.5",
            "INFO:tensorflow:words_per_sec/features:0: 1000.5",
            "INFO:tensorflow:words_per_sec/labels:0: 1100.5",
        ],
        201,
        3.5,
        1100.5,
        "words/s",
        id="onmt-tf-words-per-sec",
    ),
    pytest.param(
        # SpeechBrain epoch_loop 'Going into epoch %s' then the epoch's tqdm bar (1-based)
        [
            "speechbrain.utils.epoch_loop - Going into epoch 3",
            "100%|##########| 50/50 [00:50<00:00,  1.00it/s, train_loss=0.5]",
        ],
        150,
        0.5,
        1.0,
        "it/s",
        id="speechbrain-epoch-bar",
    ),
    pytest.param(
        # MindYOLO: 'Epoch {}/{}, Step {}/{}, step time: {:.2f} ms'
        ["Epoch 2/300, Step 10/100, step time: 50.00 ms"],
        110,
        None,
        0.05,
        "s/step",
        id="mindyolo-step-time-ms",
    ),
]


@pytest.mark.parametrize(("lines", "step", "loss", "rate", "unit"), CASES)
def test_generic_family(
    lines: list[str], step: int | None, loss: float | None, rate: float | None, unit: str | None
) -> None:
    fw, r = read_log(lines)
    assert fw is None  # the generic reader read them
    assert r.step == step
    if loss is None or r.loss is None:
        assert r.loss == loss
    elif math.isnan(loss):
        assert math.isnan(r.loss)
    else:
        assert r.loss == pytest.approx(loss)
    assert (r.rate, r.unit) == ((pytest.approx(rate), unit) if rate is not None else (None, None))


@pytest.mark.parametrize(
    "line",
    [
        "Epoch [7/50], Step [30/724], Mel Loss: 0.7, Gen Loss: 28.5, SLM Loss: 2.5",  # parts
        "RPNLogLoss=0.08,\tRCNNLogLoss=0.7,",  # parts with no total
        "ctc_loss=0.7, att_loss=0.6",  # two *_loss keys: parts
        "epoch 14 average loss: 0.2148",  # the epoch's mean
        "INFO:root:Epoch[1] Time cost=4.611",  # a time, not a cost
        "valid_loss=0.5 eval_loss=0.4",
    ],
)
def test_not_a_training_loss(line: str) -> None:
    assert read_log([line])[1].loss is None


def test_sole_star_loss_is_the_loss() -> None:
    """A single ``*_loss`` key (ClearerVoice's ``|| Mask_Loss 1.6``) is the loss."""
    assert (
        read_log(["Step: 40/965 | 1.082s/batch | lr 5.0e-04 || Mask_Loss 1.6433"])[1].loss == 1.6433
    )


@pytest.mark.parametrize(
    ("line", "loss"),
    [
        ("Iteration 10 | Batch loss: 0.75 | lr 1e-3", 0.75),
        ("step 10 Train Loss: 1.25", 1.25),
        ("Epoch 3 Loss 0.5", 0.5),
        ("[1,0]<stdout>:Total loss is  2.5 ETA is  1:00:00", 2.5),
    ],
)
def test_qualified_training_loss(line: str, loss: float) -> None:
    """A training loss's qualifiers (train, batch, current, total) are the loss, not a part."""
    assert read_log([line])[1].loss == loss


def test_first_epoch_position_then_unknown() -> None:
    """A position whose epoch's length is not printed is the step in the first epoch only; in a
    later epoch the step is unknown (not the first epoch's last)."""
    lines = ["Pass 0, Batch 300, Cost 1.9", "Pass 1, Batch 100, Cost 1.7"]
    r = read_log(lines)[1]
    assert (r.step, r.loss) == (None, 1.7)
