"""Tables and columns (orchestrator/wire/progress_tables.py): lines built from each family's
format string, the real excerpts of held-out sets 6 and 7 these families cover, a row not read
without its header, a table's columns not leaking into later lines, hostile input."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from orchestrator.wire.progress import ProgressParser, read_log
from orchestrator.wire.progress_tables import (
    Cells,
    Tables,
    kv_cells,
    read_catboost,
    read_header,
    read_kv,
    read_row,
    span_s,
)
from tests.progress.corpus import judge, load

DATA = Path(__file__).resolve().parents[1] / "data"


def _sb3(kv: dict[str, object]) -> list[str]:
    """stable_baselines3/common/logger.py HumanOutputFormat.write, re-typed (00dc23b0)."""
    key2str: dict[str, str] = {}
    tag = None
    for key, value in sorted(kv.items()):
        value_str = f"{value:<8.3g}" if isinstance(value, float) else str(value)
        if key.find("/") > 0:
            tag = key[: key.find("/") + 1]
            key2str[tag] = ""
        if tag is not None and tag in key:
            key = "   " + key[len(tag) :]
        key2str[key] = value_str
    kw, vw = max(map(len, key2str)), max(map(len, key2str.values()))
    dashes = "-" * (kw + vw + 7)
    rows = [f"| {k}{' ' * (kw - len(k))} | {v}{' ' * (vw - len(v))} |" for k, v in key2str.items()]
    return [dashes, *rows, dashes]


def _sb2(kv: dict[str, object]) -> list[str]:
    """stable_baselines/logger.py HumanOutputFormat.writekvs, re-typed (b06ab286)."""
    key2str = {
        k: ("%-8.3g" % (v,) if isinstance(v, float) else str(v))  # noqa: UP031 (SB2's own)
        for k, v in sorted(kv.items())
    }
    kw, vw = max(map(len, key2str)), max(map(len, key2str.values()))
    dashes = "-" * (kw + vw + 7)
    rows = [
        "| %s%s | %s%s |" % (k, " " * (kw - len(k)), v, " " * (vw - len(v)))  # noqa: UP031
        for k, v in sorted(key2str.items())
    ]
    return [dashes, *rows, dashes]


def _read(lines: list[str]):
    p = ProgressParser()
    return p.read(lines)


def test_sb3_table_from_its_format_string() -> None:
    kv = {
        "rollout/ep_len_mean": 22.5,
        "time/fps": 1043,
        "time/iterations": 12,
        "time/time_elapsed": 3,
        "time/total_timesteps": 24576,
        "train/loss": 6.04,
        "train/value_loss": 40.1,
        "train/n_updates": 110,
    }
    lines = _sb3(kv)
    r = _read(lines)
    assert (r.step, r.loss, r.rate, r.unit) == (12, 6.04, 1043.0, "samples/s")
    # a second table: its values win
    kv.update({"time/iterations": 13, "train/loss": 5.5, "time/fps": 1040})
    r = _read(lines + _sb3(kv))
    assert (r.step, r.loss, r.rate) == (13, 5.5, 1040.0)


def test_sb3_off_policy_table_has_no_step() -> None:
    lines = _sb3({"time/episodes": 4, "time/fps": 286, "time/total_timesteps": 8613})
    r = _read(lines)
    assert (r.step, r.loss, r.rate) == (None, None, 286.0)


def test_sb2_table_from_its_format_string() -> None:
    kv = {
        "fps": 142,
        "nupdates": 782,
        "policy_loss": -0.011813248,
        "value_loss": 0.4478733,
        "total_timesteps": 100096,
    }
    r = _read(_sb2(kv))
    assert (r.step, r.loss, r.rate, r.unit) == (782, None, 142.0, "samples/s")


def test_kv_rows_without_their_rule_are_not_read() -> None:
    r = _read(["|    iterations           | 7           |", "| fps | 26 |"])
    assert (r.step, r.rate) == (None, None)


def _fastai07(values: list[list[float]]) -> list[str]:
    """old/fastai/model.py fit: names, then print_stats rows, re-typed (004f6761)."""
    names = ["epoch", "trn_loss", "val_loss", "accuracy"]
    out = [("{!s:10} " * len(names)).format(*names)]
    for epoch, vals in enumerate(values):
        layout = "{!s:^10}" + " {!s:10}" * len(vals)
        out.append(layout.format(epoch, *[round(v, 6) for v in vals]))
    return out


def _fastprogress(names: list[str], rows: list[list[str]]) -> list[str]:
    """fastprogress ConsoleMasterBar.write(table=True), re-typed."""
    padded = [n + " " * (8 - len(n)) if len(n) < 8 else n for n in names]
    out = ["  ".join(padded)]
    for line in rows:
        out.append(
            "".join(t + " " * (2 + len(n) - len(t)) for t, n in zip(line, padded, strict=False))
        )
    return out


def test_fastai_tables_from_their_format_strings() -> None:
    r = _read(_fastai07([[3.925804, 3.971093, 0.5], [3.857519, 3.951696, 0.51]]))
    assert (r.step, r.loss) == (None, 3.857519)
    names = ["epoch", "train_loss", "valid_loss", "accuracy", "time"]
    rows = [["0", "0.912345", "0.701234", "0.810000", "00:12"]]
    rows.append(["1", "0.612345", "0.601234", "0.850000", "00:11"])
    r = _read(_fastprogress(names, rows))
    assert (r.step, r.loss, r.rate) == (None, 0.612345, None)


def test_tf_cnn_benchmarks_from_its_format_string() -> None:
    header = "Step\tImg/sec\t" + "total_loss"
    timing = "images/sec: %.1f +/- %.1f (jitter = %.1f)"  # benchmark_cnn.get_perf_timing_str
    rows = [
        "%i\t%s\t%.*f" % (s, timing % (m, 0.1, 0.3), 3, lv)  # noqa: UP031 (its own format)
        for s, m, lv in ((1, 205.3, 9.111), (10, 204.8, 9.228), (20, 204.7, 9.2))
    ]
    r = _read([header, *rows])
    assert (r.step, r.loss, r.rate, r.unit) == (20, 9.2, 204.7, "samples/s")
    tagged = ["[1,0]<stdout>:" + x for x in [header, *rows]]
    assert _read(tagged).step == 20


def test_nerfstudio_table_from_its_format_string() -> None:
    names = ["Train Iter (time)", "ETA (time)", "Train Rays / Sec"]
    header = f"{'Step (% Done)':<20}" + "".join(f"{n:<20} " for n in names)
    step, frac = 7710, 7710 / 30000
    row = f"{f'{step} ({frac * 100:.02f}%)':<20}" + "".join(
        f"{v:<20} " for v in ("107.563 ms", "39 m, 57 s", "38.30 K")
    )
    r = _read([header, "-" * len(header), row])
    assert (r.step, r.rate, r.unit, r.eta_s) == (7710, 38300.0, "samples/s", 2397.0)


def test_yolov5_rows_from_their_format_string() -> None:
    header = ("%10s" * 8) % ("Epoch", "gpu_mem", "box", "obj", "cls", "total", "labels", "img_size")
    row = ("%10s" * 2 + "%10.4g" * 6) % ("3/299", "3.2G", 0.05, 0.02, 0.01, 0.08, 7, 640)
    r = _read([header, row])
    assert (r.step, r.loss) == (None, 0.08)


def test_catboost_lines_from_their_format_string() -> None:
    line = "%d:\tlearn: %s\ttest: %s\tbest: %s (%d)\ttotal: %s\tremaining: %s" % (  # noqa: UP031
        100,
        "0.1697219",
        "0.1530068",
        "0.1530068",
        100,
        "3.7s",
        "33s",
    )
    assert read_catboost(line) == Cells(step=100, loss=0.1697219, eta_s=33.0)
    assert _read(["0:\tlearn: 0.6569860\ttotal: 70.1ms\tremaining: 1m 10s", line]).step == 100


@pytest.mark.parametrize(
    "path",
    [
        "progress_heldout6/stable-baselines/sb2-ppo2-table.log",
        "progress_heldout6/stable-baselines/sb3-ppo-cartpole-second-table.log",
        "progress_heldout6/stable-baselines/sb3-ppo-time-train-table.log",
        "progress_heldout6/horovod/tf-cnn-benchmarks-horovod-1gpu.log",
        "progress_heldout7/catboost/catboost-2018-learn-passed-glued.log",
        "progress_heldout7/catboost/catboost-verbose100-tabs.log",
        "progress_heldout7/fastai/fastai07-fit-epoch-table-hbox.log",
    ],
)
def test_real_excerpts_the_families_cover(path: str) -> None:
    root = DATA / path.split("/")[0]
    (case,) = [c for c in load(root) if str(c.path).endswith(path)]
    _, r = read_log(case.lines)
    assert judge(case, r) == {"step": True, "loss": True, "throughput": True}, r


@pytest.mark.parametrize(
    ("path", "header"),
    [
        (
            "progress_heldout7/nerfstudio/nerfstudio-splat-table-rows.log",
            "Step (% Done)       Train Iter (time)    ETA (time)           Train Rays / Sec",
        ),
        (
            "progress_heldout7/yolov5/yolov5-2021-results-rows-epoch8.log",
            "     Epoch   gpu_mem       box       obj       cls     total    labels  img_size",
        ),
    ],
)
def test_rows_without_their_header_stay_unguessed(path: str, header: str) -> None:
    root = DATA / path.split("/")[0]
    (case,) = [c for c in load(root) if str(c.path).endswith(path)]
    _, r = read_log(case.lines)
    assert (r.step, r.loss, r.rate) == (None, None, None)
    _, r = read_log([header, *case.lines])  # the same rows under their header are read
    assert judge(case, r) == {"step": True, "loss": True, "throughput": True}, r


def test_columns_do_not_leak_into_later_lines() -> None:
    t = Tables()
    assert t.feed("epoch      trn_loss   val_loss") is None
    assert t.feed("    0      3.925804   3.971093") == Cells(loss=3.925804)
    assert t.feed("Saving model to /tmp/x") is None
    assert t.feed("    1      9.0   9.0") is None  # the table ended
    tf = Tables()
    tf.feed("Step\tImg/sec\ttotal_loss")
    tf.feed("-" * 64)
    assert tf.feed("10\timages/sec: 204.8 +/- 0.1 (jitter = 0.6)\t9.228") is None
    r = _read(["Step\tImg/sec\ttotal_loss", "model saved", "1 2 3", "step=5 loss=1.5"])
    assert (r.step, r.loss) == (5, 1.5)


def test_a_tqdm_bar_between_rows_keeps_the_table() -> None:
    lines = [
        "epoch      trn_loss   val_loss",
        "    0      3.925804   3.971093",
        "Epoch  50%|#####     | 1/2 [00:10<00:10,  0.10it/s]",
        "    1      3.857519   3.951696",
    ]
    assert _read(lines).loss == 3.857519


HOSTILE = [
    "x" * 10_000_000,
    "| " + "k" * 5_000_000 + " | " + "1" * 5_000_000 + " |",
    "\x00\xff\ufffd|\x00|",
    "1e309",
    "nan",
    "-" * 10_000_000,
    "0:\tlearn: 1e309\ttotal: 1s\tremaining: 1e309s",
    "0:\tlearn: nan",
    "1\timages/sec: 1e309 +/- nan (jitter = inf)\tnan",
    "| fps | 1e309 |",
    "| iterations | 99999999999999999999999 |",
    "190 (0.63%)         17.369 ms            8 m, 37 s            1e309 M",
    "    0      nan   inf",
    "      8/89     5.61G   nan   1e309  0.001882    nan         4       640",
    bytes(range(256)).decode("latin-1"),
]
HEADERS = [
    "epoch      trn_loss   val_loss",
    "Step\tImg/sec\ttotal_loss",
    "Step (% Done)       Train Iter (time)    ETA (time)           Train Rays / Sec",
    "     Epoch   gpu_mem       box       obj       cls     total    labels  img_size",
]


def _sane(c: Cells | None) -> None:
    if c is None:
        return
    assert c.step is None or (isinstance(c.step, int) and 0 <= c.step < 2**53)
    assert c.rate is None or (math.isfinite(c.rate) and c.rate >= 0)


@pytest.mark.parametrize("line", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_lines_never_raise(line: str) -> None:
    span_s(line)
    read_kv(line)
    kv_cells("", "fps", line)
    kv_cells("time/", "iterations", line)
    kv_cells("train/", "loss", line)
    read_header(line)
    _sane(read_catboost(line))
    for h in HEADERS:
        header = read_header(h)
        assert header is not None
        _sane(read_row(header, line))
        t = Tables()
        t.feed(h)
        _sane(t.feed(line))
    t = Tables()
    t.feed("-" * 40)
    _sane(t.feed(line))
    p = ProgressParser()
    for h in [*HEADERS, "-" * 40]:
        p.feed(h)
        p.feed(line)
    assert p.reading.rate is None or math.isfinite(p.reading.rate)


def test_nan_and_huge_values_are_kept_or_dropped_as_numbers() -> None:
    assert kv_cells("", "fps", "1e309").rate is None
    assert kv_cells("", "fps", "nan").rate is None
    assert math.isnan(kv_cells("train/", "loss", "nan").loss or 0.0)
    assert kv_cells("train/", "loss", "1e309").loss == math.inf
    assert kv_cells("time/", "iterations", "9" * 30).step is None


def test_a_header_skimmed_still_names_the_rows_fed_after_it() -> None:
    """The agent skims a long read's older lines and feeds its newest: a header among the
    skimmed lines still names the columns of the rows fed."""
    p = ProgressParser()
    p.skim("epoch      trn_loss   val_loss")
    p.skim("    0      3.925804   3.971093")
    assert p.reading.loss is None  # a skimmed row gives no value
    p.feed("    1      3.857519   3.951696")
    assert (p.reading.loss, p.readings) == (3.857519, 1)
