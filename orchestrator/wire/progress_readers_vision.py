"""The detection and vision toolkits' progress readers (data only; see progress_schema).

detectron2, PaddleDetection/PaddleSeg/PaddleOCR/PaddleSpeech, maskrcnn-benchmark,
mmengine/mmcv and torchvision's MetricLogger; :mod:`~orchestrator.wire.progress_readers`
orders them with the rest for detection. Stdlib only: ships to the agent inside ``wire/``.
"""

from __future__ import annotations

from orchestrator.wire.progress_schema import Field, Reader, loss_fields

DETECTRON2 = Reader(
    name="detectron2",
    source=(
        "detectron2 v0.6 detectron2/utils/events.py CommonMetricPrinter.write "
        "(' {eta}iter: {iter}  {losses}  {time}{data_time}lr: {lr}  {memory}': losses as "
        "'{k}: {median:.4g}' with total_loss first, time as 'time: {:.4f}', the global average of "
        "seconds per iteration: the only time v0.6 prints)"
    ),
    hints=("iter: ",),
    detect=(r"\biter: \d+\s+total_loss: ",),
    fields=(
        Field("step", "iter"),
        *loss_fields("total_loss"),
        Field("rate", "time", "s/step"),
        Field("eta_s", "eta"),
    ),
)


PADDLE = Reader(
    name="paddle",
    source=(
        "PaddleDetection release/2.6 ppdet/engine/callbacks.py LogPrinter ('Epoch: [{}]', "
        "'[{i}/{n}]', 'learning_rate: {lr:.6f}', '{meters}', 'eta: {eta}', 'batch_cost: {btime}', "
        "'data_cost: {dtime}', 'ips: {ips:.4f} images/s'; ips = batch_size / batch_time.avg); "
        "PaddleSeg release/2.8 paddleseg/core/train.py ('[TRAIN] epoch: {}, iter: {}/{}, loss: "
        "{:.4f}, lr: {:.6f}, batch_cost: {:.4f}, reader_cost: {:.5f}, ips: {:.4f} samples/sec "
        "| ETA {}'); PaddleOCR tools/program.py ('ips: {:.5f} samples/s'); PaddleSpeech "
        "paddlespeech/s2t/exps/deepspeech2/model.py ('step: {}, ', 'train time: {:>.3f}s, ', "
        "'batch size: {}, ', then '{}: {:>.6f}' per loss: train_loss); an image is a sample"
    ),
    hints=("ips: ", "train time: "),
    detect=(
        r"\bips: [\d.]+ (?:images|samples)/s(?:ec)?\b",
        r"\btrain time: [\d.]+s, batch size: ",
    ),
    fields=(
        Field("step", "global_step"),
        Field("step", "iter"),
        Field("step", "step"),
        *loss_fields("loss", "train_loss", "total_loss"),
        Field("rate", "ips", "samples/s"),
        Field("rate", "train time", "s/step"),
    ),
    skip=(r"\[EVAL\]", r"\bEval iter\b"),
    counter=(
        r"\biter: (?P<step>\d+)/(?P<total>\d+)"
        r"|\bEpoch: \[(?P<epoch>\d+)\]\s+\[\s*(?P<i>\d+)/(?P<n>\d+)\]"
    ),
)


MASKRCNN_BENCHMARK = Reader(
    name="maskrcnn-benchmark",
    source=(
        "maskrcnn-benchmark (facebookresearch, 2019) maskrcnn_benchmark/engine/trainer.py "
        "do_train (meters.delimiter.join(['eta: {eta}', 'iter: {iter}', '{meters}', "
        "'lr: {lr:.6f}', 'max mem: {memory:.0f}'])) with utils/metric_logger.py "
        "MetricLogger.__str__ ('{}: {:.4f} ({:.4f})'.format(name, meter.median, "
        "meter.global_avg)): the window median is the step's figure, time in s/iter"
    ),
    hints=("iter: ",),
    detect=(r"\biter: \d+\s+loss: [-\d.naif]+ \([-\d.naif]+\)",),
    fields=(
        Field("step", "iter"),
        *loss_fields("loss"),
        Field("rate", "time", "s/step"),
        Field("eta_s", "eta"),
    ),
)


MMENGINE = Reader(
    name="mmengine",
    source=(
        "mmengine v0.10.4 mmengine/runner/log_processor.py LogProcessor.get_log_after_iter "
        "('Epoch(train) [{epoch}][{iter}/{n}]' or 'Iter(train) [{iter}/{max_iters}]', "
        "then '  eta: {}  time: {:.4f}  ...  loss: {:.4f}'); mmcv v1.7 "
        "mmcv/runner/hooks/logger/text.py TextLoggerHook ('Epoch [{}][{}/{}]\\tlr: ..., eta: ...', "
        "by iteration (IterBasedRunner) 'Iter [{iter}/{max_iters}]\\t{lr}, eta: {}, time: {:.3f}, ')"
    ),
    hints=("(train)", "Epoch [", "Iter ["),
    detect=(
        r"\b(?:Epoch|Iter)\(train\)\s*\[",
        r"\bEpoch \[\d+\]\[\d+/\d+\]\s+lr: ",
        r"\bIter \[\d+/\d+\]\s+lr: ",
    ),
    fields=(
        *loss_fields("loss"),
        Field("rate", "time", "s/step"),
        Field("eta_s", "eta"),
    ),
    skip=(r"\b(?:Epoch|Iter)\((?:val|test)\)",),
    counter=(
        r"\bEpoch\(train\)\s*\[(?P<epoch>\d+)\]\s*\[\s*(?P<i>\d+)/(?P<n>\d+)\]"
        r"|\bIter\(train\)\s*\[\s*(?P<step>\d+)/(?P<total>\d+)\]"
        r"|\bEpoch \[(?P<epoch2>\d+)\]\[(?P<i2>\d+)/(?P<n2>\d+)\]"
        r"|\bIter \[(?P<step2>\d+)/(?P<total2>\d+)\]"
    ),
)


METRIC_LOGGER = Reader(
    name="metric-logger",
    source=(
        "torchvision (721a6ae1) references/classification/utils.py MetricLogger.log_every "
        "(header 'Epoch: [{epoch}]', then '[{i}/{n}]  eta: {}  {name}: {median:.4f} "
        "({global_avg:.4f})  time: {}  data: {}  max mem: {}'; the first number is the median "
        "of the last 20, the parenthesised one the mean so far), copied by DeiT, MAE and "
        "LLaMA2-Accessory "
        "(whose loss meter is closs)"
    ),
    hints=("Epoch: [",),
    detect=(r"\bEpoch: \[\d+\]\s+\[\s*\d+/\d+\]",),
    fields=(*loss_fields("loss", "closs"), Field("rate", "time", "s/step")),
    counter=r"\bEpoch: \[(?P<epoch>\d+)\]\s+\[\s*(?P<i>\d+)/(?P<n>\d+)\]",
)
