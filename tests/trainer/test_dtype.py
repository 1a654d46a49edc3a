"""A bf16 target: the drafter keeps float32 weights and runs under autocast to the target's dtype.

``transformers`` is not a dependency (nor installed here), so the Hugging Face path is tested with
a tiny bf16 causal LM built in the test with the surface ``trainer/hf.py`` uses of a transformers
model (``config``, input/output embeddings, ``forward(..., output_hidden_states, use_cache,
past_key_values)`` returning logits, hidden states and the cache). Where transformers is
installed, a real ``LlamaForCausalLM`` saved in bf16 runs through the CLI as well.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from tests.trainer.procs import TINY, read_metrics, run_trainer
from trainer.config import load_config
from trainer.hf import HFTarget
from trainer.model import Drafter, TargetLM
from trainer.objective import drafter_loss, run_target
from trainer.pipeline import RunOptions, Trainer


class TinyBf16CausalLM(nn.Module):
    """A causal LM in bfloat16 shaped like a transformers ``*ForCausalLM`` for ``HFTarget``."""

    def __init__(self) -> None:
        super().__init__()
        cfg = load_config(TINY).target
        self.lm = TargetLM(cfg).to(torch.bfloat16)
        self.config = SimpleNamespace(
            vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers
        )

    def get_input_embeddings(self) -> nn.Module:
        return self.lm.embed

    def get_output_embeddings(self) -> nn.Module:
        return self.lm.head

    def forward(
        self,
        input_ids: torch.Tensor,
        output_hidden_states: bool = False,
        use_cache: bool = False,
        past_key_values: Any = None,
    ) -> SimpleNamespace:
        if use_cache:
            logits, cache = self.lm.decode(input_ids, past_key_values)
            return SimpleNamespace(logits=logits[:, None], past_key_values=cache)
        logits, hidden = self.lm(input_ids)
        embeds = self.lm.embed(input_ids)
        return SimpleNamespace(logits=logits, hidden_states=(embeds, *hidden))


def test_bf16_hf_target_features_train_the_float32_drafter() -> None:
    """The crash of the issue: bf16 context features into the float32 context projection
    ("expected m1 and m2 to have the same dtype")."""
    cfg = load_config(TINY)
    target = HFTarget(TinyBf16CausalLM())
    tokens = torch.randint(0, 64, (2, 64), generator=torch.Generator().manual_seed(0))
    shard = run_target(target, tokens, torch.tensor([[5, 20], [9, 40]]), [0, 2, 3], 1)
    assert shard.ctx_hidden.dtype == torch.bfloat16
    drafter = Drafter(cfg.drafter, target.embedding_weight(), target.head_weight())
    loss, loss_sum, _ = drafter_loss(drafter, shard, total_blocks=4, gamma=2.0)
    loss.backward()
    assert math.isfinite(float(loss_sum))
    assert drafter.ctx_proj.weight.dtype == torch.float32
    assert drafter.ctx_proj.weight.grad is not None
    assert bool(torch.isfinite(drafter.ctx_proj.weight.grad).all())


def test_bf16_hf_target_pipelined_run_learns(tmp_path: Path) -> None:
    cfg = load_config(TINY, ["train.log_every=10", "train.eval_every=10"])
    trainer = Trainer(
        cfg, RunOptions(tmp_path, log_out=io.StringIO()), target=HFTarget(TinyBf16CausalLM())
    )
    trainer.warmup("sequential")
    assert trainer.run_pipelined(30).step == 30
    records = read_metrics(tmp_path)
    assert all(r["loss"] is not None and r["nonfinite_steps"] == 0 for r in records), records
    assert records[-1]["loss"] < records[0]["loss"], records
    assert records[-1]["tau"] is not None and records[-1]["tau"] >= 1.0


def test_builtin_target_in_bfloat16_through_the_cli(tmp_path: Path) -> None:
    proc = run_trainer(
        tmp_path, "--steps", "3", "--set", "target.dtype=bfloat16", "--set", "train.log_every=1"
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]
    assert all(r["loss"] is not None for r in read_metrics(tmp_path))


def test_real_transformers_bf16_checkpoint(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=128,
    )
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(tmp_path / "llama")
    proc = run_trainer(
        tmp_path / "run",
        "--steps",
        "3",
        "--set",
        "train.log_every=1",
        "--set",
        f"target.hf_path={tmp_path / 'llama'}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "same dtype" not in proc.stderr
    assert len(read_metrics(tmp_path / "run")) == 3
