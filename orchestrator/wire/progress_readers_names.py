"""Readers for frameworks that print their values under their own names (data only).

BasicSR's MessageLogger (``l_*`` terms, ``time (data)``), ParlAI's train_model report
(``total_train_updates``, ``mean_loss``), fastText's progress line (``words/sec/thread``),
Detectron's ``json_stats`` (``time``) and OpenNMT-py's ``Statistics.output``
(``src tok/s; tgt tok/s``): each from the format string named in its ``source``;
:mod:`~orchestrator.wire.progress_readers` orders them with the rest for detection.
Stdlib only: ships to the agent inside ``wire/``.
"""

from __future__ import annotations

from orchestrator.wire.progress_schema import Field, Reader, loss_fields

BASICSR = Reader(
    name="basicsr",
    source=(
        "XPixelGroup/BasicSR 04d24493 basicsr/utils/logger.py MessageLogger.__call__ "
        "(f'[{exp_name[:5]}..][epoch:{epoch:3d}, iter:{current_iter:8,d}, lr:(' + "
        "f'{v:.3e},' per lr + ')] ', then f'[eta: {eta_str}, ' + "
        "f'time (data): {iter_time:.3f} ({data_time:.3f})] ' and f'{k}: {v:.4e} ' per log "
        "var: the l_* losses); mmsr 1ec5f453 codes/train.py ('[epoch:{:3d}, iter:{:8,d}, "
        "lr:(' ...); BasicSR 0.x codes/train.py ('<epoch:{:3d}, iter:{:8,d}, lr:{:.3e}> ' "
        "then '{:s}: {:.4e} ' per log). The loss is the one l_* term where one is printed "
        "(l_pix); several (l_g_pix, l_g_gan, l_d_real: the generator's and the "
        "discriminator's parts, two networks) are parts, and their sum is no one's loss"
    ),
    hints=(", iter:",),
    detect=(r"[<\[]epoch:\s*\d+, iter:\s*[\d,]+(?:, lr:|>)",),
    fields=(
        Field("loss", r"l_[a-z0-9_]+", hint="l_", sole=True),
        Field("rate", r"time \(data\)", "s/step", hint="time (data)"),
        Field("eta_s", "eta"),
    ),
    counter=r"[<\[]epoch:\s*\d+, iter:\s*(?P<step>\d{1,3}(?:,\d{3})+(?!\d)|\d+)",
)

PARLAI = Reader(
    name="parlai",
    source=(
        "facebookresearch/ParlAI 0089bed6 parlai/scripts/train_model.py TrainLoop.log "
        "(logs 'time:{}s', 'total_exs:{}', 'epochs:{}', 'time_left:{}s'; "
        "'[ {} ] {}'.format(' '.join(logs), nice_format(train_report)): the report dict, "
        "'num_updates' (2019) or 'total_train_updates' (2020, torch_agent.py report), "
        "'loss', 'mean_loss' or 'train_loss' per agent); parlai/core/metrics.py "
        "METRICS_DISPLAY_DATA ('tps' tokens, 'exps' examples, 'ups' updates per second); "
        "'valid:{...}' and 'test:{...}' are evaluation. total_exs counts examples, not steps"
    ),
    hints=("total_exs:",),
    detect=(r"^\[ time:[\d.]+s total_exs:\d+",),
    fields=(
        Field("step", "total_train_updates"),
        Field("step", "num_updates"),
        *loss_fields("loss", "mean_loss", "train_loss"),
        Field("rate", "tps", "tokens/s"),
        Field("rate", "exps", "samples/s"),
        Field("rate", "ups", "it/s"),
    ),
    skip=(r"^\s*(?:valid|test)\s*:\s*\{",),
)

FASTTEXT = Reader(
    name="fasttext",
    source=(
        "facebookresearch/fastText 8ca5bf09 src/fasttext.cc FastText::printInfo "
        "('Progress: ' << setprecision(1) << setw(5) << progress * 100 << '%' << "
        "' words/sec/thread: ' << setw(7) << int64_t(wst) << ' lr: ' ... << "
        "' avg.loss: ' << loss << ' ETA: ' << ClockPrint(eta); wst = tokenCount_ / t / "
        "thread; before 0.9 ' loss: ' and 'ETA: %3dh%2dm'): the rate is words per second per "
        "thread (its own unit, words/s/thread); the loss is the run's running average, the "
        "only one printed; Progress is a percentage, no step"
    ),
    hints=("words/sec/thread:",),
    detect=(r"\bwords/sec/thread:\s*\d+",),
    fields=(
        *loss_fields(r"avg\.loss", "loss"),
        Field("rate", "words/sec/thread", "words/s/thread"),
    ),
)

DETECTRON = Reader(
    name="detectron",
    source=(
        "facebookresearch/Detectron 016749d7 detectron/utils/training_stats.py "
        "TrainingStats.GetStats (dict(iter=cur_iter, lr=, time=iter_timer.average_time, "
        "loss=smoothed_total_loss.GetMedianValue(), eta=str(timedelta), mb_qsize=, mem=) and "
        "the median of each loss part), printed by detectron/utils/logging.py log_json_stats "
        "('json_stats: ' + json.dumps(stats, sort_keys=True)): time is the mean seconds per "
        "iteration, loss the total; mb_qsize (the minibatch queue) is Detectron's alone"
    ),
    hints=("json_stats: ", '"mb_qsize"'),
    detect=(r"\bjson_stats: \{", r'"mb_qsize": \d+'),
    fields=(
        Field("step", "iter"),
        *loss_fields("loss"),
        Field("rate", "time", "s/step"),
        Field("eta_s", "eta"),
    ),
)

OPENNMT_PY = Reader(
    name="opennmt-py",
    source=(
        "OpenNMT/OpenNMT-py onmt/utils/statistics.py Statistics.output (0.x: 'Epoch %2d, "
        "%5d/%5d; acc: %6.2f; ppl: %6.2f; xent: %6.2f; %3.0f src tok/s; %3.0f tgt tok/s; "
        "%6.0f s elapsed', epochs from 1, the epoch's batches printed; 2018 on: 'Step %2d/%5d; "
        "acc: %6.2f; ppl: %5.2f; xent: %4.2f; lr: %7.5f; %3.0f/%3.0f tok/s; %6.0f sec'): "
        "the tokens/s is the target side's (n_words, the tokens the loss is over), src's is "
        "the input read; xent is the loss (ppl = exp(xent); a line with ppl only has no loss)"
    ),
    hints=("; acc: ",),
    detect=(r"\b(?:Epoch\s+\d+,\s+\d+/\s*\d+|Step\s+\d+/\s*\d+); acc: ",),
    fields=(
        *loss_fields("xent"),
        Field("rate", "tgt tok/s", "tokens/s", value_first=True),
        Field("rate", "tok/s", "tokens/s", value_first=True),
    ),
    counter=(
        r"\bEpoch\s+(?P<epoch>\d+),\s+(?P<i>\d+)/\s*(?P<n>\d+);"
        r"|\bStep\s+(?P<step>\d+)/\s*(?P<total>\d+);"
    ),
)
