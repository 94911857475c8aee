"""Issue 27: DeepSpeed's ZeRO-3 buffers are sized by the largest module of the model it trains,
and in Transformers 5.23 the routed experts of a layer are ONE module with fused 3-D parameters
(MixtralExperts' ``gate_up_proj`` (E, 2f, h) and ``down_proj`` (E, h, f), GptOssExperts with
their biases, ...), not one module per expert matrix.

Expected values come from DeepSpeed 0.19.8 itself (installed package, CPU accelerator): its
``model_to_params`` (``deepspeed/runtime/zero/stage3.py``, the ``largest_layer_params`` that
``estimate_zero3_model_states_mem_needs_all_live`` feeds to the estimator: the largest
``sum(p.numel() for p in m.parameters(recurse=False))`` over ``model.modules()``) run on the
Transformers model built on the meta device (tests/arch_configs.py), and its
``estimate_zero3_model_states_mem_needs`` (``largest_layer_memory = 4 * largest_layer_params``,
the 16-bit weights twice). Never a run of parmem. On the meta device every tensor's
``data_ptr()`` is 0, so ``model_to_params``'s first value (Ψ, deduplicated by data pointer) is
not used; Ψ is ``sum(p.numel())`` of the model, tied weights once.
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
pytest.importorskip("deepspeed")

from arch_configs import T, hf_model, preset_config  # noqa: E402
from deepspeed.runtime.zero.stage3 import (  # noqa: E402
    estimate_zero3_model_states_mem_needs,
    model_to_params,
)

from parmem import ModelSpec, ParallelConfig, TrainingSetup, estimate  # noqa: E402
from parmem.engines import engine  # noqa: E402
from parmem.estimate import model_states_and_buffers  # noqa: E402
from parmem.layout import layout  # noqa: E402
from parmem.sharding import largest_module_params  # noqa: E402

MOE = ["mixtral-8x7b", "qwen3-235b-a22b", "gpt-oss-120b", "deepseek-v3"]


def _config(spec: ModelSpec):
    """The preset as its family's Hugging Face config (Transformers 5.23 key names)."""
    common = dict(vocab_size=spec.vocab_size, hidden_size=spec.hidden,
                  num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
                  num_key_value_heads=spec.kv_heads, max_position_embeddings=spec.max_positions,
                  tie_word_embeddings=spec.tied_embeddings)
    if spec.name == "mixtral-8x7b":
        return T.MixtralConfig(**common, intermediate_size=spec.expert_ffn_hidden,
                               num_local_experts=spec.num_experts, num_experts_per_tok=spec.top_k)
    if spec.name == "llama-2-7b":
        return T.LlamaConfig(**common, intermediate_size=spec.ffn_hidden)
    return preset_config(spec)


def _deepspeed_largest(model) -> int:
    """DeepSpeed's own largest_layer_params of ``model`` (model_to_params, second value)."""
    return model_to_params(model)[1]


def _largest_module(model):
    return max(model.modules(), key=lambda m: sum(p.numel() for p in m.parameters(recurse=False)))


@pytest.mark.parametrize("name", MOE)
def test_largest_module_is_the_fused_experts_block(name):
    spec = ModelSpec.preset(name)
    model = hf_model(_config(spec))
    assert type(_largest_module(model)).__name__.endswith("Experts")
    assert largest_module_params(spec) == _deepspeed_largest(model)


def test_dense_model_unchanged():
    spec = ModelSpec.preset("llama-2-7b")
    assert largest_module_params(spec) == 32000 * 4096  # the embedding (or the LM head)
    assert largest_module_params(spec) == _deepspeed_largest(hf_model(_config(spec)))


#: tiny configs of the other MoE families parmem reads; for qwen2_moe and deepseek_v2 the
#: largest module is a projection of the shared experts (one MLP of n_shared · f rows)
BASE = dict(vocab_size=64, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2)
MLA = dict(q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8,
           v_head_dim=16, n_group=1, topk_group=1, first_k_dense_replace=1)
TINY = {
    "mixtral": dict(intermediate_size=48, num_local_experts=4, num_experts_per_tok=2),
    "phimoe": dict(intermediate_size=48, num_local_experts=4, num_experts_per_tok=2),
    "granitemoe": dict(intermediate_size=48, num_local_experts=4, num_experts_per_tok=2),
    "qwen2_moe": dict(intermediate_size=128, moe_intermediate_size=16, num_experts=2,
                      shared_expert_intermediate_size=256, num_experts_per_tok=1),
    "qwen3_moe": dict(intermediate_size=128, moe_intermediate_size=32, num_experts=4,
                      num_experts_per_tok=2, head_dim=16),
    "gpt_oss": dict(intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
                    head_dim=16),
    "llama4_text": dict(intermediate_size=32, intermediate_size_mlp=96, num_local_experts=4,
                        num_experts_per_tok=1, interleave_moe_layer_step=2, head_dim=16),
    "deepseek_v2": dict(**MLA, intermediate_size=64, moe_intermediate_size=16,
                        n_routed_experts=2, n_shared_experts=8, num_experts_per_tok=1),
    "deepseek_v3": dict(**MLA, intermediate_size=128, moe_intermediate_size=16,
                        n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2),
}


@pytest.mark.parametrize("family", sorted(TINY))
def test_every_moe_family_matches_deepspeeds_largest_layer(family):
    cfg = transformers.AutoConfig.for_model(family, **BASE, **TINY[family])
    model = hf_model(cfg)
    spec = ModelSpec.from_hf_config(cfg.to_dict())
    assert spec.num_params() == sum(p.numel() for p in model.parameters())
    assert largest_module_params(spec) == _deepspeed_largest(model)


def test_expert_parallel_rank_holds_its_local_experts():
    # parmem's choice (the deepspeed profile refuses ep > 1): the fused block of E/e experts
    spec = ModelSpec.preset("deepseek-v3")  # 256 experts of 3 · 2048 · 7168
    assert largest_module_params(spec, ep=8) == 256 // 8 * 3 * 2048 * 7168


def _padding(n, gpus, k):
    """k bytes per parameter over ``gpus`` flat shards: parmem pads each to ⌈n/gpus⌉ values
    (as DeepSpeed's flat buffers do); the estimator rounds k·n/gpus down."""
    return k * -(-n // gpus) - int(k * n / gpus)


@pytest.mark.parametrize("name", [*MOE, "llama-2-7b"])
def test_zero3_buffer_equals_deepspeeds_estimator(name):
    """The deepspeed profile's ZeRO-3 buffer at d = 8 (comm_buffers less the 16-bit reduction
    bucket and the layout's other buffers) is the estimator's largest_layer_memory for DeepSpeed's
    own largest_layer_params; with the model states, the estimator's GPU total plus the 16-bit
    gradient partition the engine keeps (measured). Ψ of the total is
    the stage's (DeepSeek-V3's MTP module is trained by parmem's model, not built by
    Transformers; the buffer does not depend on Ψ)."""
    spec = ModelSpec.preset(name)
    par, setup = ParallelConfig(dp=8, zero=3), TrainingSetup(seq_len=1024, engine="deepspeed")
    # the model states and buffers alone: the hf table refuses DeepSeek-V3's multi-latent
    # attention, so estimate() raises for it; for the others they are estimate()'s own numbers
    lay = layout(spec, par, setup)
    parts = model_states_and_buffers(spec, par, setup)[0]
    states = parts["params"] + parts["grads"] + parts["optimizer"] + parts["optimizer_step"]
    n = lay.stages[0].params
    if spec.attention != "mla":
        st = estimate(spec, par, setup).stages[0]
        assert (st.model_states, st.comm_buffers, st.num_params) == (states, parts["comm_buffers"], n)
    _, gpu, largest_memory = estimate_zero3_model_states_mem_needs(
        n, _deepspeed_largest(hf_model(_config(spec))), num_gpus_per_node=8,
        num_nodes=1, cpu_offload=False, cpu_offload_params=False)
    bucket = 2 * engine("deepspeed").buffers.reduce_bucket  # the 16-bit reduction bucket
    zero3 = parts["comm_buffers"] - bucket - lay.comm_buffer_bytes
    assert zero3 == largest_memory  # 4 bytes x the largest module: 16-bit, two copies
    # named: the engine's 16-bit gradient partition (2Ψ/N), which the estimator leaves out and
    # the recorded ZeRO-3 step holds (data/engine_runs/deepspeed.json), and its fp32 gradients
    # made one sub-group (1e9 elements, sub_group_size) at a time in step(), where the estimator
    # counts all 4Ψ/N
    shard = -(-n // 8)
    named = 2 * shard - 4 * (shard - min(shard, 10**9))
    assert states + zero3 == gpu + _padding(n, 8, 18) + named
