"""The adjustment for held-out set 8 (docs/progress.md, "Held-out set 8"): timm's train.py line,
vLLM's generation bar among an RLHF loop's training bars, and a loss after a number's unit (the
TF Object Detection API). Each asserted on lines built by formatting the source's own format
string with values, then on the set-8 excerpts it was written for.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.wire.progress import detect, read_log
from tests.progress.corpus import judge, load

DATA = Path(__file__).resolve().parent.parent / "data"


def _timm(epoch: int, batch_idx: int, n: int, loss: float, avg: float, t: float, bs: int) -> str:
    """huggingface/pytorch-image-models 004fb5f8 train.py train_one_epoch, verbatim format
    (a world of 2 ranks: rate = input.size(0) * world_size / batch_time.val)."""
    last_idx = n - 1
    rate, t_avg = bs * 2 / t, t * 1.1
    return (  # noqa: UP032 (the source's str.format, verbatim)
        "Train: {} [{:>4d}/{} ({:>3.0f}%)]  "
        "Loss: {loss_val:#.4g} ({loss_avg:#.3g})  "
        "Time: {bt_val:.3f}s, {rate:>7.2f}/s  "
        "({bt_avg:.3f}s, {rate_avg:>7.2f}/s)  "
        "LR: {lr:.3e}  "
        "Data: {dt_val:.3f} ({dt_avg:.3f})"
    ).format(
        epoch,
        batch_idx,
        n,
        100.0 * batch_idx / last_idx,
        loss_val=loss,
        loss_avg=avg,
        bt_val=t,
        rate=rate,
        bt_avg=t_avg,
        rate_avg=bs * 2 / t_avg,
        lr=1e-3,
        dt_val=0.01,
        dt_avg=0.02,
    )


def test_timm_train_line_is_epoch_times_length_plus_batch_with_the_newest_rate() -> None:
    lines = [_timm(0, 0, 1251, 6.93, 6.93, 0.5, 128), _timm(3, 400, 1251, 5.125, 5.4, 0.25, 128)]
    assert detect(lines[-1]) == "timm"
    fw, r = read_log(lines)
    assert fw == "timm"
    # epochs from 0: 3 x 1251 + 400; the newest batch's 128 x 2 / 0.25 s, not the mean's
    assert (r.step, r.loss, r.rate, r.unit) == (3 * 1251 + 400, 5.125, 1024.0, "samples/s")


def test_timm_validation_lines_are_not_the_training_loss() -> None:
    """validate() prints '{0}: [{1:>4d}/{2}]  Time: ...  Loss: {loss.val:>7.4f} ...' as 'Test'
    or 'Test (EMA)': an evaluation, whose loss is not the run's."""
    train = _timm(1, 1250, 1251, 4.5, 4.6, 0.3, 64)
    test = (
        "{0}: [{1:>4d}/{2}]  Time: {3:.3f} ({4:.3f})  Loss: {5:>7.4f} ({6:>6.4f})  "
        "Acc@1: {7:>7.4f} ({8:>7.4f})  Acc@5: {9:>7.4f} ({10:>7.4f})"
    )
    lines = [train]
    for name in ("Test", "Test (EMA)"):
        lines.append(test.format(name, 48, 48, 0.1, 0.2, 9.99, 8.88, 10.0, 11.0, 30.0, 31.0))
    _, r = read_log(lines)
    assert (r.step, r.loss) == (1 * 1251 + 1250, 4.5)


def _tqdm(desc: str, n: int, total: int, elapsed: str, rate: str) -> str:
    """tqdm v4.66 format_meter with a description and a bar (the form both loops print)."""
    pct = 100 * n // total
    return f"{desc}: {pct:3d}%|{'#' * (pct // 10):10s}| {n}/{total} [{elapsed}<00:00, {rate}]"


def test_vllm_generation_bars_are_not_the_training_loop() -> None:
    """vllm-project/vllm 10fdb8f0 vllm/entrypoints/llm.py LLM._run_engine:
    tqdm(total=num_requests, desc="Processed prompts", ...), printed by OpenRLHF's and verl's
    rollouts between their own training bars, after them too."""
    lines = [
        _tqdm("Episode [1/1]", 5, 12, "01:36", "19.20s/it"),
        _tqdm("Processed prompts", 16, 16, "00:12", " 1.27it/s"),
        _tqdm("Processed prompts", 0, 16, "00:00", "?it/s").replace("<00:00", "<?"),
    ]
    _, r = read_log(lines)
    assert (r.step, r.total_steps, r.unit) == (5, 12, "it/s")
    assert r.rate == pytest.approx(1 / 19.2)


def test_a_loss_after_a_time_with_its_unit_is_read() -> None:
    """tensorflow/models 9400d73c research/object_detection/model_lib_v2.py train_loop:
    'Step {} per-step time {:.3f}s loss={:.3f}' (and 'ms' the same); a word before ``loss``
    still names a part (StyleTTS2's 'S2S Loss', 'Mel Loss')."""
    fmt = "Step {} per-step time {:.3f}s loss={:.3f}"  # the source's, verbatim
    line = fmt.format(900, 0.8133, 2.3741)
    _, r = read_log(["INFO:tensorflow:" + line])
    assert (r.step, r.loss, r.rate, r.unit) == (900, 2.374, 0.813, "s/step")
    _, r = read_log(["step 7 time 12ms loss 3.1"])
    assert r.loss == 3.1
    for part in ("Step 5 S2S Loss: 1.07", "Step 5 Mel Loss: 0.7", "Step 5 RPN loss 0.5"):
        assert read_log([part])[1].loss is None, part


@pytest.mark.parametrize(
    "name",
    [
        "timm/mobilenetv3-train-epoch2",
        "timm/t2t-vit-train-epoch0",
        "openrlhf/ppo-ray-episode-bar-vllm-prompts",
        "tf-object-detection/model-lib-v2-per-step-time",
    ],
)
def test_set8_excerpts_now_read(name: str) -> None:
    """The set-8 excerpts these were written for (seen, so no longer held out)."""
    (case,) = [c for c in load(DATA / "progress_heldout8") if c.name == name]
    _, r = read_log(case.lines)
    assert all(judge(case, r).values()), (judge(case, r), r)
