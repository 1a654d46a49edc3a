"""The detection and vision toolkits' progress readers (data only; see progress_schema).

detectron2, PaddleDetection/PaddleSeg/PaddleOCR/PaddleSpeech, maskrcnn-benchmark,
mmengine/mmcv, torchvision's MetricLogger, darknet, YOLOX, YOLOv5, Ultralytics and OpenPCDet; :mod:`~orchestrator.wire.progress_readers`
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
        "(whose loss meter is closs); references/classification/train.py train_one_epoch adds "
        "the meter img/s (SmoothedValue fmt '{value}': the batch's images / its seconds), read "
        "before time"
    ),
    hints=("Epoch: [",),
    detect=(r"\bEpoch: \[\d+\]\s+\[\s*\d+/\d+\]",),
    fields=(
        *loss_fields("loss", "closs"),
        Field("rate", "img/s", "samples/s"),
        Field("rate", "time", "s/step"),
    ),
    counter=r"\bEpoch: \[(?P<epoch>\d+)\]\s+\[\s*(?P<i>\d+)/(?P<n>\d+)\]",
)


TIMM = Reader(
    name="timm",
    source=(
        "huggingface/pytorch-image-models 004fb5f8 train.py train_one_epoch "
        "(_logger.info('Train: {} [{:>4d}/{} ({:>3.0f}%)]  Loss: {loss.val:#.4g} "
        "({loss.avg:#.3g})  Time: {batch_time.val:.3f}s, {rate:>7.2f}/s  ({batch_time.avg:.3f}s, "
        "{rate_avg:>7.2f}/s)  LR: {lr:.3e}  Data: {data_time.val:.3f} ({data_time.avg:.3f})' "
        "with epoch, batch_idx, len(loader); rate = input.size(0) * world_size / "
        "batch_time.val: the newest batch's samples per second over all ranks, the "
        "parenthesised pair the means so far; earlier releases print the loss as "
        "'{loss.val:>9.6f} ({loss.avg:>6.4f})', later ones build the same line with an "
        "f-string); epochs from 0; validate() prints 'Test: [{:>4d}/{}]' (also 'Test (EMA)'), "
        "an evaluation"
    ),
    hints=("Train: ",),
    detect=(r"\bTrain: \d+ \[\s*\d+/\d+ \(\s*\d+%\)\]",),
    fields=(
        *loss_fields("loss"),
        Field("rate", r"time: [\d.]+s,", "samples/s", hint="time: "),
    ),
    skip=(r"\bTest(?: \(EMA\))?: \[\s*\d+/\d+\]",),
    counter=r"\bTrain: (?P<epoch>\d+) \[\s*(?P<i>\d+)/(?P<n>\d+) \(",
)


DARKNET = Reader(
    name="darknet",
    source=(
        "AlexeyAB/darknet src/detector.c train_detector (read in stored copies of the file, "
        "2019-2021; no commit pinned) "
        "(printf('\\n %d: %f, %f avg loss, %f rate, %lf seconds, %d images, %f hours left\\n', "
        "iteration, loss, avg_loss, get_current_rate(net), what_time_is_it_now() - time, "
        "iteration*imgs, avg_time)): the first number is the step's loss, 'avg loss' the running "
        "mean, 'rate' the learning rate, 'seconds' the step's time; pjreddie's darknet and 2018 "
        "AlexeyAB print '%f avg, ' without 'loss'; 'Loaded: %lf seconds' is the data loading"
    ),
    hints=(" rate, ",),
    detect=(r"^\s*\d+: [^\s,]+, [^\s,]+ avg(?: loss)?, [^\s,]+ rate, [\d.]+ seconds, ",),
    fields=(),
    counter=(
        r"^\s*(?P<step>\d+): (?P<loss>[^\s,]+), [^\s,]+ avg(?: loss)?, [^\s,]+ rate, "
        r"(?P<sec>[\d.]+) seconds, "
    ),
)

YOLOX = Reader(
    name="yolox",
    source=(
        "Megvii-BaseDetection/YOLOX (02cc562a) yolox/core/trainer.py Trainer.after_iter "
        "('epoch: {}/{}, iter: {}/{}' with epoch + 1 and iter + 1, then ', mem: {:.0f}Mb' (later "
        "'gpu mem: {:.0f}Mb, mem: {:.1f}Gb'), '{}: {:.3f}s' per time meter (iter_time, "
        "data_time: means since the last print), '{}: {:.1f}' per loss meter (total_loss first; "
        "the latest values), 'lr: {:.3e}', ', size: {:d}, ETA: {}'); epochs from 1"
    ),
    hints=("iter: ",),
    detect=(r"\bepoch: \d+/\d+, iter: \d+/\d+, (?:gpu )?mem: ",),
    fields=(
        *loss_fields("total_loss"),
        Field("rate", "iter_time", "s/step"),
        Field("eta_s", "ETA"),
    ),
    counter=r"\bepoch: (?P<epoch>\d+)/(?P<epochs>\d+), iter: (?P<i>\d+)/(?P<n>\d+),",
)

_YOLO_BAR = (
    r"\s+[\d.]+[GM]\s+(?:[\d.]+\s+)+\d+:\s+\d+%"
    r"(?:\|[^|]*\|\s*(?P<i>\d+)/(?P<n>\d+)|\s[━─╸]+\s(?P<i2>\d+)/(?P<n2>\d+))"
)
"""After the epoch: memory, the loss columns, instances and image size, then the bar's ``n/total`` (tqdm's, or 8.3's own bar)."""

YOLOV5 = Reader(
    name="yolov5",
    source=(
        "ultralytics/yolov5 train.py (v3 to v6, read in stored copies): the training bar's "
        "description "
        "(('%10s' * 2 + '%10.4g' * 6) % (f'{epoch}/{epochs - 1}', mem, *mloss, "
        "targets.shape[0], imgs.shape[-1]) under the header 'Epoch gpu_mem box obj cls total "
        "labels img_size'; v7.0 prints 3 losses, no total, under 'Epoch GPU_mem box_loss obj_loss "
        "cls_loss Instances Size'; mloss is the epoch's running mean, the only loss printed), "
        "then tqdm's '{percentage}%|{bar}| {n}/{total} [...]' or bar_format "
        "'{l_bar}{bar:10}{r_bar}' ('| {n_fmt}/{total_fmt} {elapsed}'); epochs from 0"
    ),
    hints=("%|",),
    detect=(r"^\s*\d+/\d+\s+[\d.]+[GM]\s+(?:[\d.]+\s+){4,6}\d+:\s+\d+%\|",),
    fields=(),
    bars=True,
    counter=(
        r"^\s*(?P<epoch>\d+)/(?P<epochs>\d+)\s+[\d.]+[GM]\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+"
        r"(?:(?P<loss>[\d.]+)\s+)?\d+\s+\d+:\s+\d+%\|[^|]*\|\s*(?P<i>\d+)/(?P<n>\d+)"
    ),
)

ULTRALYTICS = Reader(
    name="ultralytics",
    source=(
        "ultralytics/ultralytics ultralytics/engine/trainer.py BaseTrainer._do_train (8.1, read "
        "in stored copies; 8.3's own bar without brackets: progress_bars._BAR_ULTRALYTICS) "
        "(pbar.set_description(('%11s' * 2 + '%11.4g' * (2 + loss_length)) % "
        "(f'{epoch + 1}/{self.epochs}', mem, *self.tloss, batch['cls'].shape[0], "
        "batch['img'].shape[-1])) under the header 'Epoch GPU_mem box_loss cls_loss dfl_loss "
        "Instances Size': epochs from 1 (YOLOv5 printed epoch/epochs-1), the losses parts "
        "with no total; told from YOLOv5 by that header (dfl_loss)"
    ),
    hints=("dfl_loss",),
    detect=(r"^\s*Epoch\s+GPU_mem\s+box_loss\s+.*\bdfl_loss\b",),
    fields=(),
    bars=True,
    counter=r"^\s*(?P<epoch>\d+)/(?P<epochs>\d+)" + _YOLO_BAR,
)

OPENPCDET = Reader(
    name="openpcdet",
    source=(
        "open-mmlab/OpenPCDet tools/train_utils/train_utils.py train_one_epoch: the timm-style "
        "logger of PR 1229 ('Train: {:>4d}/{} ({:>3.0f}%) [{:>4d}/{} ({:>3.0f}%)]  Loss: "
        "{loss.val:#.4g} ({loss.avg:#.3g})  LR: {lr:.3e}  Time cost: ...  Acc_iter "
        "{acc_iter:<10d}  Data time: {val:.2f}({avg:.2f})  Forward time: ...  Batch time: "
        "{val:.2f}({avg:.2f})'; the value before the mean) and 028ed72e's "
        "(f'epoch: {cur_epoch}/{total_epochs}, acc_iter={accumulated_iter}, cur_iter=...', then "
        "'loss=', 'b_time=val(avg)'); Acc_iter is the run's iteration, Batch time s/iter"
    ),
    hints=("Acc_iter ", "acc_iter="),
    detect=(r"\bAcc_iter \d+\s+Data time: ", r"\bacc_iter=\d+, cur_iter=\d+/\d+"),
    fields=(
        Field("step", "Acc_iter"),
        *loss_fields("loss"),
        Field("rate", "Batch time|b_time", "s/step"),
    ),
)
