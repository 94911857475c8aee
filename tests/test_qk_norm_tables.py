"""Per-head q/k norms (Qwen3, Gemma 3) in every engine's activation table (issue 28): counted, or
the spec refused by name, never left out silently.

Expected differences are derived here from the norms' shapes: a per-head RMSNorm over q
(a·head_dim values per token) and over k (kv·head_dim) keeps its 16-bit input; Megatron-Core's
norms also keep an fp32 rstd per row (per token and head; transformer/attention.py
SelfAttention.q_layernorm/k_layernorm with the spec's norm class); the paper's accounting leaves
norm statistics out unless asked (``norm_stat_bytes``)."""

import pytest

from parmem import ModelSpec, ParallelConfig, TrainingSetup, estimate
from parmem.activations import layer_terms

S, B = 512, 2
T = S * B


def _pair():
    qwen = ModelSpec.preset("qwen3-32b")
    return qwen, qwen.with_(qk_norm=False)


def _layer(spec, engine):
    return sum(t.bytes for t in layer_terms(spec, S, B, flash=True, dropout=False, engine=engine))


def test_paper_counts_the_norm_inputs():
    with_, without = _pair()
    q, kv = with_.heads * with_.head_dim, with_.kv_heads * with_.head_dim
    assert _layer(with_, "paper") - _layer(without, "paper") == 2 * T * (q + kv)


def test_megatron_core_counts_inputs_and_fp32_rstd():
    with_, without = _pair()
    q, kv = with_.heads * with_.head_dim, with_.kv_heads * with_.head_dim
    extra = 2 * T * (q + kv) + 4 * T * (with_.heads + with_.kv_heads)
    assert _layer(with_, "megatron-core") - _layer(without, "megatron-core") == extra


def test_tensor_parallelism_splits_them_with_the_heads():
    with_, without = _pair()
    one = _layer(with_, "megatron-core") - _layer(without, "megatron-core")
    four = sum(t.bytes for t in layer_terms(with_, S, B, tp=4, flash=True, dropout=False,
                                            engine="megatron-core"))
    four -= sum(t.bytes for t in layer_terms(without, S, B, tp=4, flash=True, dropout=False,
                                             engine="megatron-core"))
    assert 4 * four == one


def test_fsdp2_refuses_what_torchtitan_was_not_measured_on():
    with pytest.raises(ValueError, match="qk_norm=True .* is not modelled by the 'fsdp2'"):
        estimate(ModelSpec.preset("qwen3-32b"), ParallelConfig(dp=8, zero=3),
                 TrainingSetup(seq_len=1024, engine="fsdp2"))
