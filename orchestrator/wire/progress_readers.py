"""Which line says what, per training framework: the progress readers' tables (data only).

Each :class:`Reader` was written from the format string that prints the line, named in its
``source`` (file and version). ``detect`` patterns name the framework from a line of its log;
``fields`` map a printed key to a metric (:mod:`~orchestrator.wire.progress_schema`). The
detection and vision toolkits' tables are in :mod:`~orchestrator.wire.progress_readers_vision`;
the readers of frameworks that print their values under their own names (BasicSR, ParlAI,
fastText, Detectron, OpenNMT-py) in :mod:`~orchestrator.wire.progress_readers_names`;
this module holds the rest and the detection order (``READERS``).

``skip`` lines are not the training loop (evaluation, validation, summaries): they give no
loss and no rate. ``bars`` says the framework prints tqdm bars (its training bar's ``n/total``
is the step). Stdlib only: this module ships to the agent inside ``wire/``.
"""

from __future__ import annotations

from orchestrator.wire.progress_generic import GENERIC
from orchestrator.wire.progress_readers_names import (
    BASICSR,
    DETECTRON,
    FASTTEXT,
    OPENNMT_PY,
    PARLAI,
)
from orchestrator.wire.progress_readers_vision import (
    DARKNET,
    DETECTRON2,
    MASKRCNN_BENCHMARK,
    METRIC_LOGGER,
    MMENGINE,
    OPENPCDET,
    PADDLE,
    TIMM,
    ULTRALYTICS,
    YOLOV5,
    YOLOX,
)
from orchestrator.wire.progress_schema import UNITS, Field, Reader, loss_fields

__all__ = ["BY_NAME", "GENERIC", "READERS", "UNITS", "Field", "Reader"]

HF_TRAINER = Reader(
    name="hf-trainer",
    source=(
        "transformers v4.46.0 src/transformers/trainer_callback.py ProgressCallback.on_log "
        "(training_bar.write(str(shallow_logs)): the logs dict, floats as Python prints them, "
        "epoch rounded to 2 places; 5.x (read at 5.25.0) writes floats as f'{v:.4g}' strings) "
        "and on_train_begin (tqdm(total=state.max_steps, dynamic_ncols=True)); also TRL, "
        "axolotl and LLaMA-Factory, which print through the same callback. The run's closing "
        "summary ('train_runtime', 'train_loss', no 'loss') is skipped; a step's dict with "
        "include_num_input_tokens_seen carries 'train_runtime' and 'train_tokens_per_second' too "
        "(transformers 000945a9 src/transformers/trainer.py Trainer.log: "
        "logs.update(speed_metrics('train', start_time, num_tokens=...))) and is read"
    ),
    hints=("'loss': ", "'learning_rate': ", "'train_runtime': ", "Running training"),
    detect=(
        r"\{'loss': ",
        r"'learning_rate': ",
        r"'train_runtime': ",
        r"\*\*\*\*\* Running training \*\*\*\*\*",
    ),
    fields=(*loss_fields("loss"), Field("rate", r"train_tokens_per_second", "tokens/s")),
    skip=(r"^(?!.*'loss': ).*'train_runtime'", r"'eval_", r"\{'eval"),
    bars=True,
    also=("deepspeed",),
)

LLAMA_FACTORY = Reader(
    name="llama-factory",
    source=(
        "LLaMA-Factory v0.9.0 src/llamafactory/train/callbacks.py LogCallback.on_log "
        "(trainer_log.jsonl: current_steps, total_steps, loss, remaining_time, throughput: "
        "input tokens seen / elapsed seconds)"
    ),
    hints=('"current_steps"', '"total_steps"'),
    detect=(r'"current_steps": \d+', r'"total_steps": \d+'),
    fields=(
        Field("step", "current_steps"),
        Field("total_steps", "total_steps"),
        *loss_fields("loss"),
        Field("rate", "throughput", "tokens/s"),
    ),
)

LIGHTNING = Reader(
    name="lightning",
    source=(
        "lightning 2.4.0 src/lightning/pytorch/callbacks/progress/tqdm_progress.py "
        "(train bar desc f'Epoch {trainer.current_epoch}', postfix from get_metrics: v_num, "
        "train_loss_step...) and rich_progress.py (f'Epoch {current_epoch}/{max_epochs - 1}' "
        "... f'{task_speed}it/s' {metrics}); NeMo 1 logs reduced_train_loss, the step's, beside "
        "Lightning 1.x's running-mean loss="
    ),
    hints=("v_num",),
    detect=(r"^\s*Epoch \d+(?:/\d+)?:?\s.*\bv_num[=:]", r"\bv_num[=:] ?\d"),
    fields=(
        *loss_fields(
            "reduced_train_loss",
            "train_loss_step",
            "loss_step",
            "train/loss_step",
            "train_loss",
            "loss",
            "train/loss",
        ),
        Field("rate", "it/s", "it/s", value_first=True),
    ),
    skip=(r"^\s*(?:Validation|Sanity Checking|Testing|Predicting)",),
    bars=True,
    counter=r"\bEpoch (?P<epoch>\d+)/(?P<epochs>\d+)\s+\S+\s+(?P<i>\d+)/(?P<n>\d+)\s",
)

DEEPSPEED = Reader(
    name="deepspeed",
    source=(
        "DeepSpeed v0.15 deepspeed/utils/timer.py ThroughputTimer.stop "
        "('epoch={}/micro_step={}/global_step={}, RunningAvgSamplesPerSec={}, "
        "CurrSamplesPerSec={}, ...') and deepspeed/runtime/engine.py _report_progress "
        "('step={}, skipped={}, lr={}, mom={}'); DeepSpeed <= 0.5 timer.py printed "
        "'{epoch}/{step}, SamplesPerSec={}' and 0.6 to 0.14 (v0.7.7 timer.py ThroughputTimer.stop) "
        "'{epoch}/{local_step}, RunningAvgSamplesPerSec={}, CurrSamplesPerSec={}'; "
        "GPT-NeoX v2.0 megatron/logging.py training_log "
        "(' samples/sec: {:.3f} |' then ' iteration {:8d}/{:8d} |', loss key 'lm_loss')"
    ),
    hints=("SamplesPerSec=", ", skipped="),
    detect=(r"RunningAvgSamplesPerSec=", r"\bstep=\d+, skipped=\d+, lr=", r"\bSamplesPerSec="),
    fields=(
        Field("step", "global_step"),
        Field("step", "step"),
        *loss_fields("lm loss", "lm_loss", "loss"),
        Field("rate", "CurrSamplesPerSec", "samples/s"),
        Field("rate", "RunningAvgSamplesPerSec", "samples/s"),
        Field("rate", "SamplesPerSec", "samples/s"),
        Field("rate", "samples/sec", "samples/s"),
    ),
    counter=(
        r"\biteration\s+(?P<step>\d+)/\s*(?P<total>\d+)"
        r"|(?<![\w/.])\d+/(?P<step2>\d+), (?:RunningAvg)?SamplesPerSec="
    ),
)

NEMO = Reader(
    name="nemo",
    source=(
        "NVIDIA/NeMo (01f7dbc5) nemo/lightning/pytorch/callbacks/progress_printer.py "
        "ProgressPrinter.on_train_batch_end (f'Training epoch {trainer.current_epoch}, iteration "
        "{n}/{self.total}' then f' | {metric}: {val:.4}' per logged metric, each averaged over the "
        "log interval but global_step: lr, consumed_samples, global_step, reduced_train_loss, "
        "'train_step_timing in s', val_loss); the total is max_steps when set, else the epoch's "
        "batches; not Megatron's ' iteration {:8d}/{:8d} |' (no 'Training epoch E,' before it)"
    ),
    hints=("Training epoch ",),
    detect=(r"^Training epoch \d+, iteration \d+/\d+ \|",),
    fields=(
        Field("step", "global_step"),
        *loss_fields("reduced_train_loss"),
        Field("rate", r"train_step_timing in s", "s/step"),
    ),
    skip=(r"^(?:Sanity checking )?Validation: iteration", r"^Testing: iteration"),
    counter=r"^Training epoch \d+, iteration \d+/(?P<total>\d+) \|",
)

MEGATRON = Reader(
    name="megatron",
    source=(
        "Megatron-LM core_r0.9.0 megatron/training/training.py training_log "
        "(' iteration {:8d}/{:8d} |', ' elapsed time per iteration (ms): {:.1f} |', "
        "' throughput per GPU (TFLOP/s/GPU): {:.1f} |', ' {key}: {:.6E} |' per loss); "
        "Megatron-DeepSpeed (microsoft, f4157bea) megatron/training.py training_log, the same line "
        "with ' samples per second: {:.3f} |', ' tokens per gpu per second (tgs): {:.3f} |', "
        "' TFLOPs: {:.2f} |' (per GPU)"
    ),
    hints=("iteration ",),
    detect=(r"(?<!, )\biteration\s+\d+/\s*\d+ \|", r"elapsed time per iteration \(ms\)"),
    fields=(
        *loss_fields("lm loss", "loss"),
        Field("rate", r"tokens per gpu per second \(tgs\)", "tokens/s/device"),
        Field("rate", r"samples per second", "samples/s"),
        Field("rate", r"throughput per GPU \(TFLOP/s/GPU\)", "TFLOP/s/device"),
        Field("rate", r"TFLOPs", "TFLOP/s/device"),
        Field("rate", r"elapsed time per iteration \(ms\)", "s/step", 1e-3),
    ),
    skip=(r"validation loss at", r"\bvalidation\b.*\blm loss value"),
    counter=r"\biteration\s+(?P<step>\d+)/\s*(?P<total>\d+)",
)

TORCHTITAN = Reader(
    name="torchtitan",
    source=(
        "torchtitan v0.1.0 torchtitan/components/metrics.py MetricsProcessor.log "
        "('step: {step:2}  loss: {loss:7.4f}  ... tps: {round(tps):,}  tflops: {:,.2f}  "
        "mfu: {:.2f}%'; tps is tokens per second per device; older train.py printed wps)"
    ),
    hints=("tps:", "wps:"),
    detect=(r"\bstep:\s*\d+\s+loss:\s*\S+\s+.*\b(?:tps|wps):\s*[\d,]+",),
    fields=(
        Field("step", "step"),
        *loss_fields("loss"),
        Field("rate", "tps", "tokens/s/device"),
        Field("rate", "wps", "tokens/s/device"),
        Field("rate", "tflops", "TFLOP/s/device"),
    ),
    skip=(r"\bvalidate step\b", r"\bValidation\b"),
)

TORCHTUNE = Reader(
    name="torchtune",
    source=(
        "torchtune v0.2.1 torchtune/utils/metric_logging.py StdoutLogger.log_dict "
        "(print(f'Step {step} | ') then f'{name}:{data} ' per key), with the recipes' log_dict "
        "(recipes/full_finetune_distributed.py: 'loss', 'lr', 'tokens_per_second_per_gpu' = "
        "tokens / (time_per_step * world_size); knowledge distillation adds class_loss, kd_loss)"
    ),
    hints=("Step ",),
    detect=(r"^Step \d+ \| [a-z_]+:",),
    fields=(
        Field("step", "Step"),
        *loss_fields("loss"),
        Field("rate", "tokens_per_second_per_gpu", "tokens/s/device"),
    ),
)

MODDED_NANOGPT = Reader(
    name="modded-nanogpt",
    source=(
        "modded-nanogpt (KellerJordan, 2024-11 records) train_gpt.py print0 "
        "(f'step:{step}/{train_steps} val_loss:{val_loss:.4f} train_time:{training_time_ms:.0f}ms "
        "step_avg:{training_time_ms/max(step, 1):.2f}ms' and the training line's "
        "'train_loss:{:.4f}': step_avg, training ms per step, is the only time printed; "
        "val_loss is not the training loss)"
    ),
    hints=("step_avg:",),
    detect=(r"^step:\d+/\d+ .*\bstep_avg:",),
    fields=(*loss_fields("train_loss"), Field("rate", "step_avg", "s/step", 1e-3)),
    counter=r"^step:(?P<step>\d+)/(?P<total>\d+)\b",
)

NANOGPT = Reader(
    name="nanogpt",
    source=(
        "nanoGPT (karpathy, 3adf61e1) train.py "
        "(f'iter {iter_num}: loss {lossf:.4f}, time {dt*1000:.2f}ms, mfu {running_mfu*100:.2f}%'; "
        "eval: f'step {iter_num}: train loss {:.4f}, val loss {:.4f}')"
    ),
    hints=("iter ",),
    detect=(r"(?:^|\s)iter \d+: loss [-\d.naif]+, time [\d.]+ms",),
    fields=(
        Field("step", "iter"),
        Field("step", "step"),
        *loss_fields("loss"),
        Field("rate", "time", "s/step", 1e-3),
    ),
    skip=(r"\bval loss\b",),
)

FAIRSEQ = Reader(
    name="fairseq",
    source=(
        "fairseq v0.12.2 fairseq/logging/progress_bar.py SimpleProgressBar.log "
        "('{prefix}:  {i:5d} / {n:d} {k=v, ...}'), JsonProgressBar.log "
        "(json.dumps of the stats, values as formatted strings; JsonProgressBar.print, the "
        "end-of-epoch stats, prefixes every key with its tag: 'train_num_updates', 'train_wps'), and "
        "the stats logged by fairseq/trainer.py (num_updates, ups) and "
        "fairseq/tasks/fairseq_task.py (wps); the first fairseq-py "
        "(e734b0fa, 2017-09) fairseq/progress_bar.py ('{desc} {i:5d} / {n:d} {postfix}', desc "
        "'| epoch {:03d}') with train.py's postfix ('loss', '{:.2f} ({:.2f})' value then mean; "
        "'wps'), no num_updates; fairseq-lua (7a6fff0) train.lua "
        "('| epoch %03d | %07d updates | words/s %7d| trainloss %8.2f | train ppl %8.2f'); "
        "fairseq v0.8.0 fairseq/progress_bar.py SimpleProgressBar.print, the end-of-epoch "
        "stats through _str_pipes (' | '.join(key + ' ' + value), after '| epoch 033')"
    ),
    hints=("num_updates", "wps", "| epoch ", " updates | "),
    detect=(
        r"\bnum_updates[=\"':]",
        r"\"train_num_updates\": ",
        r"\bwps[=\"':]\s*\"?[\d.]+.*\bups[=\"':]",
        r"^\| epoch \d{3}:?\s+\d+ / \d+ loss=",
        r"^\| epoch \d{3} \| \d+ updates \| words/s ",
        r"^\| epoch \d{3} \| (?:.* \| )?num_updates \d+",
    ),
    fields=(
        Field("step", "num_updates"),
        Field("step", "train_num_updates"),
        Field("step", "updates", value_first=True),
        *loss_fields("loss", "trainloss", "train_loss"),
        Field("rate", "wps", "words/s"),
        Field("rate", "train_wps", "words/s"),
        Field("rate", "words/s", "words/s"),
    ),
    skip=(r"\bvalid on\b", r'"valid_', r"\| valid \|", r"\bvalid_loss\b", r"\| checkpoint \d+ \|"),
    counter=r"^\| epoch (?P<epoch>\d+):?\s+(?P<i>\d+) / (?P<n>\d+)\b",
)

KERAS = Reader(
    name="keras",
    source=(
        "keras v3.5 keras/src/utils/progbar.py Progbar.update (' {n}/{target} ━━━ "
        "{eta or elapsed} {time}ms/step - {name}: {value:.4f}'); keras 2.15 "
        "keras/utils/generic_utils.py Progbar ('[====>...] - ETA: {} - loss: {:.4f}'; "
        "verbose=2: '{n}/{target} - {s}s - loss: {} - {s}s/epoch - {t}ms/step')"
    ),
    hints=("[=", "[>", "[.", "━", "s - "),
    detect=(r"^\s*\d+/\d+ (?:\[[=>.]*\]|━+)", r"^\s*\d+/\d+ - \d+s - "),
    fields=(
        *loss_fields("loss"),
        Field("rate", "ms/step", "s/step", 1e-3, value_first=True),
        Field("rate", "(?:us|μs)/step", "s/step", 1e-6, value_first=True),
        Field("rate", "s/step", "s/step", value_first=True),
        Field("eta_s", "ETA"),
    ),
    counter=r"^\s*(?P<i>\d+)/(?P<n>\d+)(?: \[[=>.]*\]| ━+| - \d+s - )",
)

MAXTEXT = Reader(
    name="maxtext",
    source=(
        "MaxText (AI-Hypercomputer/maxtext 79e717f89, 2025-06) MaxText/metric_logger.py "
        "MetricLogger.log_metrics ('completed step: {}, seconds: {:.3f}, "
        "TFLOP/s/device: {:.3f}, Tokens/s/device: {:.3f}, total_weights: {}, loss: {:.3f}'); "
        "before c85d11c39 (2023-11) MaxText/train.py printed 'TFLOP/s: {:.3f}' "
        "(perf/per_device_tflops_per_sec)"
    ),
    hints=("completed step: ",),
    detect=(r"\bcompleted step: \d+, seconds: ",),
    fields=(
        Field("step", "completed step"),
        *loss_fields("loss"),
        Field("rate", "Tokens/s/device", "tokens/s/device"),
        Field("rate", "TFLOP/s/device", "TFLOP/s/device"),
        Field("rate", "TFLOP/s", "TFLOP/s/device"),
        Field("rate", "seconds", "s/step"),
    ),
)

TINYGRAD = Reader(
    name="tinygrad",
    source=(
        "tinygrad examples/mlperf/model_train.py (153250ca) train_resnet's tqdm.write "
        "('{i:5} {t*1000:7.2f} ms run, ... {loss:5.2f} loss, ... {GFLOPS:9.2f} GFLOPS'); the "
        "llama3 trainer of tinygrad PR 13803 prints the step time in seconds ('{t:.2f} s run')"
    ),
    hints=(" s run, ",),
    detect=(r"^\s*\d+ +[\d.]+ m?s run, ",),
    fields=(
        Field("loss", "loss", value_first=True),
        Field("rate", "ms run", "s/step", 1e-3, value_first=True),
        Field("rate", "s run", "s/step", value_first=True),
    ),
    counter=r"^\s*(?P<step>\d+) +[\d.]+ m?s run, ",
)

TORCH_XLA = Reader(
    name="torch-xla",
    source=(
        "pytorch/xla (c5cf3297) torch_xla/test/test_utils.py print_training_update "
        "('| Training Device={} Epoch={} Step={} Loss={:.5f} Rate={:.2f} GlobalRate={:.2f} "
        "Time={}', rate in examples/s), used by test/test_train_mp_imagenet.py; 2020's test "
        "printed 'Step={}/{}' (pytorch/xla PR 1825)"
    ),
    hints=("| Training Device=",),
    detect=(r"^\| Training Device=\S+ .*\bLoss=",),
    fields=(*loss_fields("Loss"), Field("rate", "Rate", "samples/s")),
    counter=(
        r"\bEpoch=(?P<epoch>\d+) Step=(?P<i>\d+)/(?P<n>\d+)"
        r"|\bStep=(?P<step>\d+)\b(?!/)"
    ),
)

ESPNET2 = Reader(
    name="espnet2",
    source=(
        "espnet/espnet (01d307c4) espnet2/train/reporter.py SubReporter.log_message "
        "(f'{self.epoch}epoch:{self.key}:{self.prev_count + 1}-{self.count}batch: ' then "
        "f'{key2}={v:.3f}' per stat, each the mean of the batches since the last message; count "
        "is within the epoch, whose length is not printed) with espnet2/train/trainer.py's stats "
        "(loss, loss_att, loss_ctc parts; iter_time is the data iterator's, train_time the "
        "step's seconds)"
    ),
    hints=("epoch:train:",),
    detect=(r"\b\d+epoch:train:\d+-\d+batch: ",),
    fields=(*loss_fields("loss"), Field("rate", "train_time", "s/step")),
    skip=(r"\d+epoch:valid:", r"\d+epoch results: "),
    counter=r"\b\d+epoch:train:\d+-(?P<step>\d+)batch: ",
)

CHAINER = Reader(
    name="chainer",
    source=(
        "chainer/chainer (228a86e4) chainer/training/extensions/progress_bar.py ProgressBar "
        "('{0.iteration:10} iter, {0.epoch} epoch / %s %ss' % training_length: '/ 20 epochs' or "
        "'/ 1000 iterations'), then '{:10.5g} iters/sec. Estimated time to finish: {}.'; "
        "ESPnet1's and ChainerMN's bar; iteration is the run's"
    ),
    hints=(" iter, ", "iters/sec. "),
    detect=(
        r"^\s*\d+ iter, \d+ epoch / \d+ (?:epochs|iterations)\s*$",
        r"^\s*\S+ iters/sec\. Estimated time to finish: ",
    ),
    fields=(Field("rate", "iters/sec", "it/s", value_first=True),),
    counter=r"^\s*(?P<step>\d+) iter, \d+ epoch / (?:\d+ epochs|(?P<total>\d+) iterations)",
)

ALLENNLP = Reader(
    name="allennlp",
    source=(
        "allenai/allennlp allennlp/training/trainer.py Trainer._train_epoch as of 2017 (no_tqdm; "
        "read in a stored copy: the stored allennlp is later and prints tqdm) "
        "(logger.info('Batch %d/%d: %s', batch_num, num_training_batches, description), the "
        "description '%s: %.2f' per metric joined by ', ' plus ' ||'; the loss is the epoch's "
        "running mean, the only one printed) after logger.info('Epoch %d/%d', epoch, "
        "self._num_epochs - 1) (epochs from 0)"
    ),
    hints=("Batch ",),
    detect=(r"\bBatch \d+/\d+: .*\|\|\s*$",),
    fields=loss_fields("loss"),
    counter=r"\bBatch (?P<i>\d+)/(?P<n>\d+): ",
)

FLAIR = Reader(
    name="flair",
    source=(
        "flairNLP/flair (003ffa33) flair/trainers/trainer.py ModelTrainer.train_custom "
        "(f'epoch {epoch} - iter {seen_batches}/{total_number_of_batches} - loss "
        "{intermittent_loss:.8f} - time (sec): {:.2f} - samples/sec: {:.2f} - lr: ...', the loss "
        "the epoch's running mean, time the epoch's elapsed seconds; 0.4 printed no time), "
        "f'EPOCH {epoch} done: loss {train_loss:.4f}{lr_info}', and the evaluation lines "
        "f'{split.upper()} : loss {eval_result.loss} - ...' (DEV, TEST; epochs from 1)"
    ),
    hints=(" - iter ",),
    detect=(r"\bepoch \d+ - iter \d+/\d+ - loss ",),
    fields=(*loss_fields("loss"), Field("rate", "samples/sec", "samples/s")),
    skip=(r"\b(?:DEV|TEST)\s*: loss\b",),
    counter=r"\bepoch (?P<epoch>\d+) - iter (?P<i>\d+)/(?P<n>\d+)",
)

READERS: tuple[Reader, ...] = (
    MAXTEXT,
    NEMO,
    MEGATRON,
    TORCHTITAN,
    DEEPSPEED,
    MMENGINE,
    PARLAI,
    FAIRSEQ,
    LLAMA_FACTORY,
    LIGHTNING,
    HF_TRAINER,
    TORCHTUNE,
    DETECTRON2,
    MODDED_NANOGPT,
    PADDLE,
    MASKRCNN_BENCHMARK,
    NANOGPT,
    METRIC_LOGGER,
    TIMM,
    KERAS,
    TINYGRAD,
    TORCH_XLA,
    ESPNET2,
    CHAINER,
    ALLENNLP,
    FLAIR,
    DARKNET,
    YOLOX,
    ULTRALYTICS,
    YOLOV5,
    OPENPCDET,
    DETECTRON,
    BASICSR,
    FASTTEXT,
    OPENNMT_PY,
)
"""Detection order: the most specific signature first (a MaxText or Megatron line is never
taken for a generic ``step``/``loss`` line)."""

BY_NAME: dict[str, Reader] = {r.name: r for r in (*READERS, GENERIC)}

NOT_TRAINING_BARS = (
    r"map|filter|tokeniz|download|loading|load|checkpoint|shards|preprocess|generating"
    r"|saving|evaluat|eval|valid|test|predict|sanity|processing|fetching|extract|running"
    r"|packing|resolving|uploading|merging|processed prompts"
)
"""A tqdm bar whose description names one of these is not the training loop (datasets'
``Map``, transformers' ``Loading checkpoint shards``, an evaluation loop, vLLM's generation:
vllm-project/vllm 10fdb8f0 vllm/entrypoints/llm.py ``LLM._run_engine``'s
``tqdm(total=num_requests, desc="Processed prompts", ...)``, which RLHF loops (OpenRLHF,
verl) print between their own training bars)."""

NOT_TRAINING_UNITS = ("examples", "ba", "B", "kB", "MB", "GB", "shards", "files")
"""tqdm ``unit`` names that count data, not steps (datasets' ``examples/s``, ``ba/s``,
huggingface_hub's byte counters)."""
