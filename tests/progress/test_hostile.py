"""Bad input gets parsed or ignored: no reader raises on any line, memory stays bounded, and
what comes out is representable (a step an int below 2**53, a rate finite and >= 0)."""

from __future__ import annotations

import json
import math
import tracemalloc

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.agent.metrics import MetricParser
from orchestrator.wire.progress import ProgressParser, Reading, detect, read_line
from orchestrator.wire.progress_bars import read_bar
from orchestrator.wire.progress_readers import BY_NAME
from orchestrator.wire.progress_summary import summary

READERS = tuple(BY_NAME.values())
FRAGMENTS = st.sampled_from(
    [
        "step",
        "step=",
        "loss",
        "loss: ",
        "'loss': '",
        "tps: ",
        "it/s",
        "s/it",
        "%|",
        "|",
        "/",
        " [",
        "<",
        ", ",
        "]",
        "Epoch ",
        "Epoch(train) [",
        "][",
        "iteration ",
        "ms",
        "num_updates=",
        " avg loss, ",
        " rate, ",
        " seconds, ",
        "epoch:train:",
        "batch: ",
        " iter, ",
        " epoch / ",
        "iters/sec",
        "Batch time: ",
        "Acc_iter ",
        "iter_time: ",
        "G ",
        "Training epoch ",
        " - iter ",
        "nan",
        "inf",
        "-0",
        "1e309",
        "9" * 400,
        "1,234",
        ",",
        ":",
        "=",
        " ",
        "\r",
        "\x1b[31m",
    ]
)
LINES = st.one_of(
    st.text(max_size=300),
    st.lists(st.one_of(FRAGMENTS, st.integers(-(10**30), 10**30).map(str)), max_size=40).map(
        "".join
    ),
    st.binary(max_size=300).map(lambda b: b.decode("utf-8", "replace")),
)


def _sane(r: Reading | None) -> None:
    if r is None:
        return
    for n in (r.step, r.total_steps):
        assert n is None or (isinstance(n, int) and 0 <= n < 2**53)
    assert r.rate is None or (math.isfinite(r.rate) and r.rate >= 0 and r.unit is not None)
    assert r.eta_s is None or r.eta_s >= 0
    json.dumps(summary("x", r))


@settings(max_examples=300, deadline=None)
@given(LINES)
def test_no_reader_raises_on_any_line(line: str) -> None:
    for reader in READERS:
        _sane(read_line(line, reader))
    detect(line)
    read_bar(line)


@settings(max_examples=100, deadline=None)
@given(st.lists(LINES, max_size=20), st.sampled_from([None, *BY_NAME]))
def test_a_parser_follows_any_log(lines: list[str], framework: str | None) -> None:
    p = ProgressParser(framework)
    _sane(p.read(lines))
    m = MetricParser({"log_format": framework} if framework else None).parse(lines, now=1.0)
    if m is not None:
        json.dumps(m.to_dict())


def test_numbers_at_the_edges() -> None:
    big = read_line("step=" + "7" * 400 + " loss=1e309 tok/s=5")
    assert big is not None and big.step is None and big.loss == math.inf and big.rate == 5.0
    r = read_line("step=3 loss=nan tok/s=-0")
    assert r is not None and r.step == 3 and r.loss is not None and math.isnan(r.loss)
    assert r.rate == 0.0
    assert read_line("step=4 loss=-0").loss == 0.0  # type: ignore[union-attr]
    r = read_line("step=5 loss=inf tok/s=inf")
    assert r is not None and r.loss == math.inf and r.rate is None  # a rate must be finite
    assert json.dumps(summary(None, read_line("step=1 loss=nan") or Reading())) == (
        '{"framework": null, "step": 1, "total_steps": null, "loss": NaN, '
        '"loss_nonfinite": "nan", "throughput": null, "eta_s": null}'
    )


def test_a_ten_megabyte_line_costs_no_more_than_its_tail() -> None:
    line = "x" * 10_000_000 + " step: 7  loss:  2.5  tps: 1,000"
    tracemalloc.start()
    try:
        r = read_line(line, BY_NAME["torchtitan"])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert r is not None and (r.step, r.loss, r.rate) == (7, 2.5, 1000.0)
    assert peak < 1_000_000, peak


def test_a_carriage_return_only_tqdm_stream_reads_its_newest_bar() -> None:
    bars = "".join(
        f"\r {i // 10}%|#| {i}/1000 [00:{i % 60:02d}<00:10, 3.{i % 10}0it/s]"
        for i in range(1, 1000)
    )
    p = ProgressParser()
    p.feed(bars)
    assert (p.reading.step, p.reading.total_steps, p.reading.rate) == (999, 1000, 3.9)


def test_binary_noise_says_nothing() -> None:
    noise = bytes(range(256)).decode("latin-1") * 100
    assert ProgressParser().read([noise, noise[::-1]]) == Reading()
