"""The engine defaults and layout rules of ``data/engines.toml`` (issue 26), checked against each
engine's own code: Megatron-LM's recorded argument parser, Megatron-Core's ``TransformerConfig``,
torchtitan's FSDP policy, PyTorch's pipeline stage and FSDP2 parameter, DeepSpeed's ZeRO optimizer
and pipeline schedules, and a Transformers model built from a config.

Not checked here, and said so in the data: torchtitan's default attention kernel (its model
modules need Triton to import; the profile's ``flash_attention = true`` rests on reading
FlexAttention's code)."""

from __future__ import annotations

import dataclasses
import inspect
import json
from pathlib import Path

import pytest

from parmem import ModelSpec, ParallelConfig, TrainingSetup, estimate
from parmem.engines import engine

FIXTURES = Path(__file__).parent / "fixtures"


def _megatron_option(dest: str) -> dict:
    args = json.loads((FIXTURES / "megatron_lm_args.json").read_text())
    return next(o for o in args["options"] if o["dest"] == dest)


def test_megatron_defaults_are_its_parsers():
    """megatron-core's defaults: TE layers with --attention-backend auto (a fused kernel, no s x s
    scores), no overlap flags on, dropout as Megatron's config has it unless the model says
    otherwise (the library default is 0.1; parmem's recipes pass 0.0 for a model without)."""
    prof = engine("megatron-core")
    assert _megatron_option("transformer_impl")["default"] == "transformer_engine"
    assert _megatron_option("attention_backend")["default"] == "auto"
    assert prof.defaults.flash_attention
    for flag in ("overlap_grad_reduce", "overlap_param_gather"):
        assert _megatron_option(flag)["default"] is False
    assert prof.defaults.overlap == ()
    assert _megatron_option("attention_dropout")["default"] == 0.1
    assert prof.defaults.dropout == "model"
    config = pytest.importorskip("megatron.core.transformer.transformer_config")
    fields = {f.name: f.default for f in dataclasses.fields(config.TransformerConfig)}
    assert str(fields["attention_backend"]).endswith("auto")
    assert (fields["hidden_dropout"], fields["attention_dropout"]) == (0.1, 0.1)


def test_megatron_has_no_gpipe_and_no_zero_2_3():
    """Megatron-Core's schedules are 1F1B and interleaved 1F1B; its distributed optimizer is
    ZeRO-1 (ZeRO-2/3 need Megatron-FSDP, which the profile does not describe)."""
    schedules = pytest.importorskip("megatron.core.pipeline_parallel.schedules")
    names = [n for n in dir(schedules) if n.startswith("forward_backward")]
    assert not any("gpipe" in n.lower() for n in names), names
    prof = engine("megatron-core")
    assert prof.refusal("gpipe") and prof.zero_stages == (0, 1)
    # nor a zero-bubble schedule: get_forward_backward_func picks one of these three
    assert set(names) == {"forward_backward_no_pipelining",
                          "forward_backward_pipelining_with_interleaving",
                          "forward_backward_pipelining_without_interleaving"}, names
    src = inspect.getsource(schedules.get_forward_backward_func)
    assert "zero_bubble" not in src.lower() and "zbv" not in src.lower()
    assert prof.refusal("zbv")


def test_zbv_is_pytorchs_which_torchtitan_runs_and_refuses_compiled():
    """ZB-V is PyTorch's ScheduleZBVZeroBubble: two stages per rank, placed in a V by torchtitan
    (``_get_pp_rank_to_stage_indices_mapping``, style "v"), and it refuses compiled stages
    (``_check_torch_compile_compatibility``), which torchtitan's async TP needs: the fsdp2
    profile runs ZB-V, but not with tp_comm_overlap."""
    sched = pytest.importorskip("torch.distributed.pipelining.schedules")
    init = inspect.getsource(sched.ScheduleZBVZeroBubble.__init__)
    assert "_check_torch_compile_compatibility" in init and "exactly 2 stages per rank" in init
    assert "torch.compile" in inspect.getsource(sched._check_torch_compile_compatibility)
    pp = pytest.importorskip("torchtitan.distributed.pipeline_parallel")
    assert pp._get_pp_rank_to_stage_indices_mapping(1, 4, "ZBVZeroBubble", 8) == (1, 6)
    prof = engine("fsdp2")
    assert not prof.refusal("zbv") and prof.defaults.tp_comm_overlap_compiles


def test_torchtitan_keeps_a_pipeline_stage_unsharded():
    """torchtitan's default reshard policy is ``not pp_enabled``; PyTorch's pipeline stage turns
    gradient sync and resharding off for every backward but the last, and FSDP2 accumulates the
    unsharded gradients in the reduce dtype: the profile's ``pipeline_zero3 = "stage"``."""
    fsdp = pytest.importorskip("torchtitan.distributed.fsdp")
    policy = fsdp.get_fsdp_reshard_after_forward_policy
    assert policy("default", pp_enabled=True) is False
    assert policy("default", pp_enabled=False) is True
    from torch.distributed.fsdp._fully_shard._fsdp_param import FSDPParam
    from torch.distributed.pipelining import stage

    nosync = inspect.getsource(stage._PipelineStageBase.backward_maybe_with_nosync)
    assert "set_requires_gradient_sync(False)" in nosync
    assert "set_reshard_after_backward(False)" in nosync
    assert "reduce_dtype" in inspect.getsource(FSDPParam.to_accumulated_grad_if_needed)
    prof = engine("fsdp2")
    assert prof.buffers.pipeline_zero3 == "stage"
    assert prof.buffers.zero3_grads == "high"  # fp32 accumulators under mixed precision
    assert not prof.defaults.dropout  # torchtitan's models have no dropout


def test_deepspeed_fp32_partition_and_pipeline_schedules():
    """ZeRO-1/2 make the fp32 gradient partition inside step() and drop it after each group's
    update (the profile's ``phase = "step"``); the pipeline engine has no interleaved
    (virtual-stage) schedule."""
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.pipe import schedule
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    step = inspect.getsource(DeepSpeedZeroOptimizer.step)
    assert "single_partition_of_fp32_groups[i].grad = None" in step
    cats = {c.name: c for c in engine("deepspeed").categories("bf16-mixed", 2)}
    assert cats["grad_partition"].phase == "step"
    names = [n for n in dir(schedule) if n.endswith("Schedule")]
    assert "TrainSchedule" in names
    assert not any("nterleav" in n or "bubble" in n.lower() for n in names), names
    assert engine("deepspeed").refusal("interleaved") and engine("deepspeed").refusal("zbv")
    # and the estimate follows: the partition is not counted at the activation peak
    d, psi = 8, ModelSpec.preset("gpt2-medium").num_params()
    est = estimate(ModelSpec.preset("gpt2-medium"), ParallelConfig(dp=d, zero=2),
                   TrainingSetup(seq_len=1024, engine="deepspeed")).peak
    assert est.optimizer_step == 4 * -(-psi // d)


def test_transformers_default_attention_is_sdpa():
    """A Transformers model built from a config runs SDPA unless told otherwise: the hf (and
    deepspeed) profiles' fused-attention default."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=1, num_attention_heads=4,
                                   num_key_value_heads=2)
    model = transformers.LlamaForCausalLM(cfg)
    assert model.config._attn_implementation == "sdpa"
    assert cfg.attention_dropout == 0.0
    for name in ("hf", "deepspeed"):
        assert engine(name).defaults.flash_attention and engine(name).defaults.dropout == "model"


def test_megatron_qk_layernorm_is_a_per_head_norm_of_the_layers_norm_class():
    """What the megatron-core table and the recipes say of --qk-layernorm, read from
    Megatron-Core 0.16.1: the local layer spec builds q_layernorm and k_layernorm with the same
    norm class as the layer's own norms (so they keep what that norm keeps), and SelfAttention
    builds them over hidden_size_per_attention_head (one norm per head, split with the heads
    under TP); without the flag they are identities."""
    import inspect

    specs = pytest.importorskip("megatron.core.models.gpt.gpt_layer_specs")
    attention = pytest.importorskip("megatron.core.transformer.attention")
    on = specs.get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm").submodules
    attn = on.self_attention.submodules
    assert attn.q_layernorm is attn.k_layernorm is on.input_layernorm
    off = specs.get_gpt_layer_local_spec(qk_layernorm=False, normalization="RMSNorm").submodules
    assert off.self_attention.submodules.q_layernorm.__name__ == "IdentityOp"
    source = inspect.getsource(attention.SelfAttention.__init__)
    for norm in ("q_layernorm", "k_layernorm"):
        block = source[source.index(f"self.{norm} = build_module("):][:300]
        assert "hidden_size=self.hidden_size_per_attention_head" in block, norm


def test_megatron_recomputes_layernorm_and_moe_act_without_a_matmul():
    """parmem.planner.heldout.ELEMENTWISE_RECOMPUTE: Megatron-Core 0.16.1's recompute_modules
    "layernorm" and "moe_act" are valid choices of its TransformerConfig, and every checkpoint
    they make (transformer_layer.py, moe/experts.py) wraps a norm or the experts' activation
    function, never a matmul: a run that recomputes only them does the same FLOPs."""
    import ast

    from megatron.core.transformer import moe, transformer_layer
    from megatron.core.transformer.transformer_config import TransformerConfig

    from parmem.planner.heldout import ELEMENTWISE_RECOMPUTE

    base = dict(num_layers=2, hidden_size=64, num_attention_heads=4,
                recompute_granularity="selective")  # fmt: skip
    assert TransformerConfig(**base, recompute_modules=["layernorm"]).recompute_modules == [
        "layernorm"]  # fmt: skip
    with pytest.raises(ValueError, match="moe_grouped_gemm"):  # a valid name, grouped GEMM only
        TransformerConfig(**base, recompute_modules=["moe_act"])
    with pytest.raises(AssertionError, match="Invalid choices"):
        TransformerConfig(**base, recompute_modules=["not_a_module"])

    wrapped: dict[str, set[str]] = {}
    experts = Path(moe.__file__).with_name("experts.py")
    for path in (Path(transformer_layer.__file__), experts):
        for node in ast.walk(ast.parse(path.read_text())):
            f = node.func if isinstance(node, ast.Call) else None
            if isinstance(f, ast.Attribute) and f.attr == "checkpoint" and isinstance(
                    f.value, ast.Attribute) and f.value.attr.endswith("_checkpoint"):  # fmt: skip
                first = node.args[0]
                name = first.attr if isinstance(first, ast.Attribute) else first.id
                wrapped.setdefault(f.value.attr, set()).add(name)
    assert wrapped == {
        "input_layernorm_checkpoint": {"input_layernorm"},  # "layernorm"
        "pre_mlp_norm_checkpoint": {"pre_mlp_layernorm"},  # "layernorm"
        "activation_checkpoint": {"activation_func_with_probs", "bias_act_func"},  # "moe_act"
    }
    assert set(ELEMENTWISE_RECOMPUTE) == {"layernorm", "moe_act"}
