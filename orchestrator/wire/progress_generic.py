"""The generic progress reader: the common shapes of console logging (data only).

Read until a framework is detected (and for trainers no reader was written for): orch's
bundled trainer's ``step= loss= tok/s=``, ``key[=: ]value`` pairs whose key is loss-like,
step-like or a rate or a time, tqdm bars, and the position families in :data:`SHAPES`
(``Epoch[e] Batch [i]``, ``Ep. e : Up. u``, ``[N] key=``, ``Learning iteration i/n``). Each
family is cited by the framework whose format string prints it; the families themselves are
shared by many trainers. Stdlib only: this module ships to the agent inside ``wire/``.
"""

from __future__ import annotations

from orchestrator.wire.progress_schema import Field, Reader, loss_fields

_N = r"[-+]?(?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|nan|inf|1\.#(?:QNAN|SNAN|IND|INF)\d*)"
"""A number inside a shape (the field rows use ``progress.NUM``)."""

_COMMON_STEP = (Field("step", r"global_step|step|iter|iteration|num_updates"),)
_COMMON_RATE = (
    Field("rate", r"tok/s|tokens/s|tokens_per_s|tok_per_s|tokens_per_sec|tps", "tokens/s"),
    Field("rate", r"tok/s|tokens/s|tokens/sec|tok/sec", "tokens/s", value_first=True),
    Field("rate", r"CurSamplesPerSec|SamplesPerSecond", "samples/s"),
    Field("rate", r"samples/s|samples_per_second|samples/sec|samples_per_sec", "samples/s"),
    Field("rate", r"tokens/sec|tok/sec", "tokens/s"),
    Field(
        "rate",
        r"samples?/sec|samples?/s|examples/sec|sample_per_sec",
        "samples/s",
        value_first=True,
    ),
    Field("rate", r"img/s|images/s|images/sec", "samples/s"),
    Field("rate", r"words_per_sec/labels:0", "words/s"),
    Field("rate", r"words/s|words/sec", "words/s", value_first=True),
    Field("rate", r"sec/step|s/step|s/batch", "s/step", value_first=True),
)

_NOT_A_MEAN = "".join(
    f"(?<!{w} loss)" for w in ("avg", "ave", "average", "mean", "running", "smoothed")
)
"""After ``loss``: the key is not a running mean's (darkflow's ``moving ave loss`` after the
step's ``loss``, darknet's ``avg loss``); checked only where ``loss`` matched."""

_NOT_A_PART = r"(?:(?<![A-Za-z] )|(?<=\d(?-i:s) )(?<![A-Za-z]\ds )|(?<=\d(?-i:ms) ))"
"""Before a bare ``loss``: no word before it. ``Mel Loss``, ``Mean value loss``, ``RPN loss``
name one part of a loss (StyleTTS2-style loops, rsl_rl); the qualifiers of a training loss
(``train loss``, ``total loss``) are rows of their own. A number's unit (``s``, ``ms``, lower
case, after a number that is not part of a word such as ``S2S``) is not a word: the TF
Object Detection API's ``'Step {} per-step time {:.3f}s loss={:.3f}'`` (tensorflow/models
9400d73c research/object_detection/model_lib_v2.py train_loop)."""

_NOT_EVAL = r"(?!(?:val|valid|eval|test|dev|tot|avg|mean|running|smoothed)_)"

_EPOCH_POSITION = (
    r"(?i:\b(?:epoch|pass)\b)\s*[:=]?\s*[\[(]?\s*(?P<epoch>\d+)"
    r"(?:\s*(?:/|of)\s*(?P<epochs>\d+))?\s*[\])]?\s*[,:]?\s*-?\s*"
    r"(?:(?i:step|batch|iter|iteration|minibatch)\b\s*[:=]?\s*[\[(]?\s*(?:\d+\s*-\s*)?|\()"
    r"(?P<i>\d+)(?:\s*/\s*(?P<n>\d+))?"
)
"""An epoch (or PaddlePaddle's pass) and a position within it: ``Epoch[0] Batch [6700]``
(MXNet's Speedometer, Sockeye), ``Epoch[ 1 of 1]-Minibatch[ 501-1000]`` (CNTK),
``Epoch 0, batch 700`` (icefall), ``Epoch [7/50], Step [30/724]``, ``Epoch: 2/50, Iter: 4/4``
(MONAI's ignite StatsHandler), ``Epoch:[0/19](1800/24681)``, ``Pass 1, Batch 200`` (paddle.v2).
The position is counted within the epoch: a run-wide step where the epoch's length ``n`` is
printed, or in the first epoch; no step otherwise."""

# MXNet counts epochs from 0 (``epoch0``): its Speedometer's epoch 1 is the second.
SHAPES: tuple[tuple[str, str], ...] = (
    ("] Batch [", r"\bEpoch\[(?P<epoch0>\d+)\] Batch \[(?P<i>\d+)\]"),
    ("poch", _EPOCH_POSITION),
    ("Pass", _EPOCH_POSITION),
    ("Up. ", r"\bEp\. \d+ : Up\. (?P<step>\d+) :"),
    ("] ", r"^(?:\S.*?\] )?\[(?P<step>\d+)\] [A-Za-z_][\w/]*[=:] ?[-+.\d]"),
    ("Learning iteration ", r"\bLearning iteration (?P<step>\d+)/(?P<total>\d+)"),
    ("Average loss at step", r"^Average loss at step\s+(?P<step>\d+)\s*:\s*(?P<loss>" + _N + ")"),
    ("Train loss ", r"^Train loss (?P<step>\d+) (?P<loss>" + _N + r") Grad Norm "),
    (" dt=", r"\biter=\s*\d+ .*\bdt=(?P<sec>\d+:\d\d:\d\d)\b"),
    (", train_loss: ", r"^\s*(?P<i>\d+)/(?P<n>\d+), train_loss: "),
)
"""The generic reader's position families, each ``(literal, regex)``
(:attr:`~orchestrator.wire.progress_schema.Reader.shapes`)."""

GENERIC = Reader(
    name="generic",
    source=(
        "orch's bundled trainer (trainer/loop.py) and common key=value shapes; loss under other "
        "trainers' names: NeMo's reduced_train_loss, YOLOX's total_loss, OpenNMT-py "
        "onmt/utils/statistics.py ('xent: %4.2f'), TF examples/speech_commands/train.py "
        "('Step #%d: rate %f, accuracy %.1f%%, cross entropy %f'), DeepLearningExamples' "
        "dllogger step_loss, kohya's avr_loss (its only loss), LitGPT finetune "
        "('loss train (curr):', 'iter time: {:.2f} ms'); times per step: YOLOX iter_time, NeMo "
        "'train_step_timing in s', ESPnet2 train_time=, OpenPCDet 'Batch time: a(b)'; rates: "
        "Caffe solver.cpp ('Iteration N (x iter/s, ys/K iters), loss = '), chainer's "
        "'iters/sec'. Set 5's families: MXNet python/mxnet/callback.py Speedometer "
        "('Epoch[%d] Batch [%d]\\tSpeed: %.2f samples/sec\\t%s=%f'; R's "
        "mx.callback.log.speedometer 'Batch [%d] Speed: %f samples/sec'), Sockeye's "
        "'tokens/sec', CNTK Source/SGDLib/SGD.cpp ('Epoch[%2d of %d]-Minibatch[%4d-%4d]: ... "
        "TrainLossPerSample = %.8g; ... SamplesPerSecond = %.1f'), Marian "
        "src/training/scheduler.h ('Ep. {} : Up. {} : Sen. {} : Cost {} : Time {} : {} words/s'), "
        "PaddlePaddle v1 paddle/trainer TrainerStats::showStats ('samples=' << n << ' AvgCost=' "
        "<< avg << ' CurrentCost=' << cur, after TrainerInternal.cpp's ' Batch=' << n) and v2 "
        "('Pass %d, Batch %d, Cost %f'), icefall egs/*/train.py ('Epoch {params.cur_epoch}, "
        "batch {batch_idx}, loss[{loss_info}], tot_loss[{tot_loss}]'), "
        "clu metric_writers LoggingWriter "
        "('[%d] %s' of k=v), OpenNMT-tf 1.x hooks ('words_per_sec/labels:0', "
        "not 'global_step/sec': TF's mean rate, the same as tf-slim's 'sec/step'), DeepSpeed-Chat step3 main.py ('act_loss', 'CurSamplesPerSec'), "
        "rsl_rl runners/on_policy_runner.py ('Learning iteration {}/{}', 'Steps per second:'), "
        "NVIDIA tacotron2 train.py ('Train loss {} {:.6f} Grad Norm {:.6f} {:.2f}s/it'), "
        "TensorFlow word2vec_basic.py ('Average loss at step ', step, ': ', average_loss), "
        "llama.cpp common/train.cpp train_opt_callback ('iter=%6d ... loss=%f dt=%s'), "
        "MindYOLO ('step time: %.2f ms'), transformers trainer_utils.py speed_metrics "
        "(f'{split}_samples_per_second': 'train' at the run's end, a fork's per-step "
        "'train_step'; under the hf-trainer reader the final dict stays skipped), MONAI tutorials ('{step}/{epoch_len}, train_loss: "
        "{:.4f} step time: {:.4f}'), horovod's TF examples ('Total loss is'), TensorFlow's cifar10 tutorial (tensorflow/models "
        "b76bc7cc tutorials/image/cifar10/cifar10_train.py: '%s: step %d, loss = %.2f (%.1f "
        "examples/sec; %.3f sec/batch)'), ColossalAI's legacy trainer (hpcaitech/ColossalAI "
        "c8fbe0cb colossalai/trainer/hooks/_metric_hook.py ThroughputMetric: "
        "f'{sample_per_sec} sample_per_sec', in its bar's postfix as 'throughput='), the TF Object Detection API (tensorflow/models 9400d73c "
        "research/object_detection/model_lib_v2.py train_loop: 'Step {} per-step time {:.3f}s "
        "loss={:.3f}')"
    ),
    detect=(),
    fields=(
        *_COMMON_STEP,
        Field("loss", r"loss\[(?:[^\]]*?[\s,])?loss", hint="loss["),
        *loss_fields(
            r"loss train \(curr\)|loss train",
            _NOT_A_PART + "loss" + _NOT_A_MEAN,
            "train loss|training loss|current loss|batch loss|step loss|total loss is|total loss",
            "train_loss",
            "training_loss",
            "step_loss",
            "reduced_train_loss",
            "total_loss",
            "lm loss",
            "xent",
            "cross entropy",
            "avr_loss",
            "act_loss",
            "TrainLossPerSample",
            "CurrentCost",
            _NOT_A_PART + "cost",
        ),
        Field("loss", _NOT_EVAL + r"[a-z][a-z0-9]*_loss", hint="_loss", sole=True),
        *_COMMON_RATE,
        Field("rate", r"train(?:_step)?_samples_per_second", "samples/s", hint="_samples_per_sec"),
        Field("rate", r"iter/s|iters/s|iters/sec", "it/s", value_first=True),
        Field("rate", r"s/it", "it/s", value_first=True, invert=True),
        Field("rate", r"steps_per_second", "it/s"),
        Field("rate", r"steps per second", "samples/s"),
        Field(
            "rate",
            r"iter time|iter_time|train_step_timing in s|batch time|train_time(?==)|step time",
            "s/step",
        ),
    ),
    skip=(
        r"\b(?:eval|val|valid|validation|test)[ _](?:loss|on)\b",
        r"\[valid\]",
        r"\bTest samples=",
    ),
    bars=True,
    counter=r"Step #(?P<step>\d+):",
    shapes=SHAPES,
)
