"""The fix made after held-out set 10 was scored (docs/progress.md, "Held-out set 10"): a rate
printed with its thousands (``TPS: 16.88K``) is read in full, not a thousandfold low."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.wire.progress import read_log
from tests.progress.corpus import judge, load

DATA = Path(__file__).resolve().parent.parent / "data"


@pytest.mark.parametrize(
    ("shown", "want"),
    [(f"{16880.0 / 1e3:.2f}K", 16880.0), (f"{5800.0 / 1e3:.1f}k", 5800.0), ("1.2M", 1.2e6)],
)
def test_a_rate_with_its_thousands_suffix(shown: str, want: float) -> None:
    """A loop that prints ``f"TPS: {tps / 1000:.2f}K"`` (set 10's DiT trainer) or ``k``/``M``."""
    line = f"Step   1560 | Loss: 0.5275 | LR: 3.00e-04 | TPS: {shown} | Data: 0.007s"
    _, r = read_log([line])
    assert (r.step, r.loss, r.unit) == (1560, 0.5275, "tokens/s")
    assert r.rate == pytest.approx(want)


def test_a_suffix_that_starts_a_word_is_not_a_scale() -> None:
    """``512 MB`` after a rate key is not 512 million: the ``M`` begins a word."""
    _, r = read_log(["step 2 loss 1.5 tps: 512 MB"])
    assert r.rate == 512.0


def test_set10_excerpt_now_read() -> None:
    (case,) = [c for c in load(DATA / "progress_heldout10") if c.name.startswith("tqdm/minfm")]
    _, r = read_log(case.lines)
    assert all(judge(case, r).values()), (judge(case, r), r)
