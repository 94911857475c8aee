"""Launch recipes checked by the engines' own code (issue 15): every recipe of the plans in
recipe_plans.py is parsed and validated by Megatron-LM's recorded argument parser and
validation rules plus Megatron-Core's ``TransformerConfig``, DeepSpeed's ``DeepSpeedConfig``
(and Megatron-DeepSpeed's recorded parser), and torchtitan's ``ConfigManager`` and
``ParallelDims``; and the micro-batch and accumulation steps each engine will run are the plan's
``b`` and ``m``.

A recipe is written only for the engine whose memory and time the plan priced (issue 26): each
case is planned again with the engine's profile (``PROFILES``: megatron -> megatron-core,
deepspeed -> deepspeed, torchtitan -> fsdp2). A case whose forced layout the engine cannot run
(``REFUSED``: by the engines' documented rules) yields no such plan, and the paper plan's layout,
evaluated under that engine, raises naming it."""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
from functools import cache

import pytest
from engines import (
    FIXTURES,
    deepspeed_config_class,
    megatron_core,
    parse_recorded,
    recorded,
    torchtitan,
)
from recipe_plans import CASES, case_plan

from parmem import Cluster, ModelSpec, ParallelConfig, TrainingSetup, estimate, plan
from parmem.engines import engine as engine_profile
from parmem.planner import Plan, evaluate
from parmem.planner.emit import PROFILES, TARGETS
from parmem.planner.emit.deepspeed import DEEPSPEED_VERSION, MEGATRON_DEEPSPEED_COMMIT
from parmem.planner.emit.megatron import MEGATRON_LM_COMMIT, pipeline_layout
from parmem.planner.emit.torchtitan import TORCHTITAN_VERSION

NAMES = list(CASES)

#: recipe engine -> the cases whose forced layout that engine cannot run, with why (the engines'
#: own documented rules, not the planner's output):
#: Megatron-Core's distributed optimizer is ZeRO-1; gradients and weights are not sharded
#: (docs/user-guide/features/dist_optimizer.md); DeepSpeed on a Transformers model has no TP,
#: SP, CP, EP or interleaving, no selective recomputation (gradient checkpointing recomputes whole
#: layers), and its PipelineEngine refuses ZeRO-2/3 (runtime/pipe/engine.py); FSDP2 shards fully
#: (ZeRO-3) or replicates (ZeRO-0), nothing in between.
REFUSED: dict[str, dict[str, str]] = {
    "megatron": {"llama2-13b-zero3": "ZeRO-3", "llama2-13b-zero2-tp": "ZeRO-2",
                 "llama2-7b-zero2": "ZeRO-2"},
    "deepspeed": {
        "gpt3-pipeline-interleaved": "tp=8",
        "mixtral-ep-pp-vp": "ep=8, vpp=8",
        "llama3-8b-context": "tp=8, cp=4",
        "llama2-13b-zero2-tp": "tp=2",
        "mixtral-zero0-ep": "tp=2, ep=4, selective recomputation",
        "llama3-8b-two-chunks": "vpp=2",
    },
    "torchtitan": {"gpt3-pipeline-interleaved": "ZeRO-1", "llama2-13b-zero2-tp": "ZeRO-2",
                   "llama2-7b-zero1": "ZeRO-1", "llama2-7b-zero2": "ZeRO-2"},
}


def _runs(engine: str) -> list[str]:
    """The cases ``engine`` runs."""
    return [n for n in NAMES if n not in REFUSED[engine]]


@cache
def engine_plan(name: str, engine: str) -> Plan:
    """Case ``name`` planned with the profile of recipe engine ``engine`` (cached)."""
    model, (gpu, gpn, nodes), batch, seq, kw = CASES[name]
    pl = plan(
        ModelSpec.preset(model), Cluster(gpu, gpn, nodes), batch, seq, top=1,
        engine=PROFILES[engine], **kw,
    )  # fmt: skip
    assert pl.best is not None, f"{name} under {engine}: {pl.message}"
    assert pl.engine == PROFILES[engine]
    return pl


def _engine_runs(engine: str, par, st) -> None:
    """The layout obeys the profile's rules: its ZeRO stages, ZeRO with PP, its refusals."""
    prof = engine_profile(PROFILES[engine])
    assert par.zero in prof.zero_stages
    assert par.pp == 1 or (prof.pipeline and par.zero <= prof.plan_pipeline_zero_max)
    used = {"tp": par.tp > 1, "sp": par.sp, "cp": par.cp > 1, "ep": par.ep > 1,
            "interleaved": par.vpp > 1 and st.schedule == "interleaved",
            "zbv": par.pp > 1 and st.schedule == "zbv"}  # fmt: skip
    for feature, on in used.items():
        assert not (on and prof.refusal(feature)), (engine, feature)
    assert st.recompute in prof.recompute


def test_the_plans_cover_every_axis():
    best = [case_plan(n).best for n in NAMES]
    pars = [c.parallel for c in best]
    assert len(best) >= 8
    assert any(p.pp > 1 and p.vpp == 1 for p in pars) and any(p.vpp > 1 for p in pars)
    assert any(p.cp > 1 for p in pars) and any(p.ep > 1 for p in pars)
    assert {1, 2, 3} <= {p.zero for p in pars}
    assert any(len(set(c.layers_per_stage)) > 1 for c in best)
    assert any(c.setup.recompute == "full" for c in best)


def test_targets_name_the_pinned_versions():
    from importlib.metadata import version

    import deepspeed
    import torchtitan as tt  # noqa: F401

    assert deepspeed.__version__ == DEEPSPEED_VERSION
    assert version("torchtitan") == TORCHTITAN_VERSION
    assert recorded("megatron_lm_args")["commit"] == MEGATRON_LM_COMMIT
    assert recorded("megatron_deepspeed_args")["commit"] == MEGATRON_DEEPSPEED_COMMIT
    for engine, target in TARGETS.items():
        pl = engine_plan(NAMES[0], engine)
        text = pl.emit(engine)
        assert f"# target: {target}" in text.splitlines()[1], engine
        assert pl.emit() == text  # the plan's own engine by default
    with pytest.raises(ValueError, match="sized and timed with engine='paper'"):
        case_plan(NAMES[0]).emit("megatron")


@pytest.mark.parametrize("engine,name", [(e, n) for e in REFUSED for n in REFUSED[e]])
def test_an_engine_gets_no_recipe_for_a_layout_it_cannot_run(engine, name):
    """The planner never offers the forced layout under the engine, and evaluating the paper
    plan's layout under the engine's profile raises naming the engine."""
    model, (gpu, gpn, nodes), batch, seq, kw = CASES[name]
    spec, cluster, profile = ModelSpec.preset(model), Cluster(gpu, gpn, nodes), PROFILES[engine]
    try:
        pl = plan(spec, cluster, batch, seq, top=1, engine=profile, **kw)
    except ValueError as e:
        assert f"engine={profile!r}" in str(e)
    else:
        assert pl.best is None and not pl.candidates, pl.best
        with pytest.raises(ValueError, match="nothing to emit"):
            pl.emit()
    c = case_plan(name).best
    setup = dataclasses.replace(c.setup, engine=profile)
    with pytest.raises(ValueError, match=f"engine={profile!r}"):
        evaluate(spec, cluster, c.parallel, setup, layers_per_stage=c.layers_per_stage)


@pytest.mark.parametrize("engine", list(REFUSED))
def test_the_recipes_checked_cover_what_each_engine_runs(engine):
    """Every ZeRO stage the engine offers and a pipeline appear among the recipes checked."""
    pars = [engine_plan(n, engine).best.parallel for n in _runs(engine)]
    assert set(engine_profile(PROFILES[engine]).zero_stages) <= {p.zero for p in pars}
    assert any(p.pp > 1 for p in pars)
    if engine != "deepspeed":
        assert any(p.vpp > 1 for p in pars) and any(p.cp > 1 for p in pars)
        assert any(p.ep > 1 for p in pars)
    if engine == "torchtitan":  # ZB-V, which only torchtitan runs
        assert any(engine_plan(n, engine).best.setup.schedule == "zbv" for n in _runs(engine))


# ---------------------------------------------------------------------------- Megatron-LM
def _cp(a) -> int:
    return a.context_parallel_size or 1


def _fsdp(a) -> bool:
    return bool(a.use_megatron_fsdp)


def _layout_stages(a) -> int:
    return len(a.pipeline_model_parallel_layout.split("|"))


#: validate_args rules the recipes depend on: (a message of the recorded rule, the check).
MEGATRON_RULES = [
    ("is not divisible by total_model_size",
     lambda a, env, world: world % (a.tensor_model_parallel_size
                                    * a.pipeline_model_parallel_size * _cp(a)) == 0),
    ("Megatron-FSDP requires the `fsdp_dtensor` checkpointing format",
     lambda a, env, world: not _fsdp(a) or a.ckpt_format == "fsdp_dtensor"),
    ("FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset",
     lambda a, env, world: not _fsdp(a) or env.get("CUDA_DEVICE_MAX_CONNECTIONS") != "1"),
    ("CUDA_DEVICE_MAX_CONNECTIONS to 1",
     lambda a, env, world: _fsdp(a) or (a.tensor_model_parallel_size == 1 and _cp(a) == 1)
     or env.get("CUDA_DEVICE_MAX_CONNECTIONS") == "1"),
    ("--overlap-param-gather only supported with distributed optimizer",
     lambda a, env, world: not a.overlap_param_gather or a.use_distributed_optimizer
     or _fsdp(a)),
    ("Must use --overlap-param-gather with --overlap-grad-reduce",
     lambda a, env, world: not a.overlap_param_gather or a.overlap_grad_reduce),
    ("GEMM overlap can happen only when sequence parallelism is enabled",
     lambda a, env, world: not a.tp_comm_overlap or a.sequence_parallel),
    ("No more than one of the following arguments can be set at the same time",
     lambda a, env, world: sum(x is not None for x in (
         a.pipeline_model_parallel_layout, a.num_layers_per_virtual_pipeline_stage,
         a.num_virtual_stages_per_pipeline_rank)) <= 1),
    ("The length of pipeline_model_parallel_layout must be divisible",
     lambda a, env, world: a.pipeline_model_parallel_layout is None
     or _layout_stages(a) % a.pipeline_model_parallel_size == 0),
    ("number of layers per pipeline stage must be divisible number of layers per virtual",
     lambda a, env, world: a.num_layers_per_virtual_pipeline_stage is None
     or (a.num_layers // a.pipeline_model_parallel_size)
     % a.num_layers_per_virtual_pipeline_stage == 0),
    ("Number of layers should be divisible by the pipeline-model-parallel size",
     lambda a, env, world: a.pipeline_model_parallel_layout is not None
     or a.num_layers % a.pipeline_model_parallel_size == 0),
    ("Number of experts should be a multiple of expert model parallel_size",
     lambda a, env, world: not a.expert_model_parallel_size
     or a.num_experts % a.expert_model_parallel_size == 0),
    ("recompute method is not yet supported for selective recomputing granularity",
     lambda a, env, world: a.recompute_granularity != "selective" or a.recompute_method is None),
]  # fmt: skip


def test_megatron_rules_exist_at_the_recorded_commit():
    messages = [r["message"] for r in recorded("megatron_lm_args")["rules"]]
    for fragment, _ in MEGATRON_RULES:
        assert any(fragment in m for m in messages), fragment


def _transformer_config(a):
    import torch

    mc = megatron_core()
    kw = dict(
        num_layers=a.num_layers, hidden_size=a.hidden_size,
        num_attention_heads=a.num_attention_heads, ffn_hidden_size=a.ffn_hidden_size,
        num_query_groups=a.num_query_groups if a.group_query_attention else None,
        kv_channels=a.kv_channels,
        tensor_model_parallel_size=a.tensor_model_parallel_size,
        pipeline_model_parallel_size=a.pipeline_model_parallel_size,
        context_parallel_size=_cp(a),
        expert_model_parallel_size=a.expert_model_parallel_size or 1,
        sequence_parallel=bool(a.sequence_parallel),
        pipeline_model_parallel_layout=a.pipeline_model_parallel_layout,
        recompute_granularity=a.recompute_granularity, recompute_method=a.recompute_method,
        recompute_num_layers=a.recompute_num_layers,
        gated_linear_unit=bool(a.swiglu), normalization=a.normalization or "LayerNorm",
        add_bias_linear=a.add_bias_linear,
        num_moe_experts=a.num_experts, moe_router_topk=a.moe_router_topk or 2,
        moe_ffn_hidden_size=a.moe_ffn_hidden_size,
        moe_token_dispatcher_type=a.moe_token_dispatcher_type or "allgather",
        bf16=bool(a.bf16), params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16,
    )  # fmt: skip
    if a.num_layers_per_virtual_pipeline_stage:
        kw["virtual_pipeline_model_parallel_size"] = a.num_layers // (
            a.pipeline_model_parallel_size * a.num_layers_per_virtual_pipeline_stage
        )
    return mc.TransformerConfig(**kw)


@pytest.mark.parametrize("name", _runs("megatron"))
def test_megatron_recipe_passes_megatron_checks(name):
    pl = engine_plan(name, "megatron")
    c, recipe = pl.best, pl.recipe("megatron")
    par, st, world = c.parallel, c.setup, pl.cluster.world_size
    _engine_runs("megatron", par, st)
    a = parse_recorded("megatron_lm_args", list(recipe.args))
    env = {k: v for k, v in recipe.env if v is not None}
    for fragment, ok in MEGATRON_RULES:
        assert ok(a, env, world), fragment
    if par.zero >= 2:
        assert ("CUDA_DEVICE_MAX_CONNECTIONS", None) in recipe.env  # must be unset
    # Megatron-Core validates the model and parallel part
    _transformer_config(a)
    if a.pipeline_model_parallel_layout:
        layout = megatron_core().Layout(a.pipeline_model_parallel_layout, par.pp)
        layout.validate_layer_layout(num_layers=pl.spec.layers, mtp_num_layers=None)
        per_rank = [sum(str(x).endswith("decoder") for chunk in row for x in chunk)
                    for row in layout.layout]
        assert tuple(per_rank) == c.layers_per_stage
        assert layout.virtual_pipeline_model_parallel_size == par.vpp
    elif par.vpp > 1:
        assert a.num_layers // (par.pp * a.num_layers_per_virtual_pipeline_stage) == par.vpp
    # what Megatron-LM will run: d = N / (t·p·cp), m = G / (b·d)
    d = world // (a.tensor_model_parallel_size * a.pipeline_model_parallel_size * _cp(a))
    assert d == par.dp and a.micro_batch_size == st.micro_batch
    assert a.global_batch_size % (a.micro_batch_size * d) == 0
    assert a.global_batch_size // (a.micro_batch_size * d) == st.num_microbatches
    assert (a.recompute_granularity or "none") == st.recompute


def test_megatron_parser_refuses_what_megatron_refuses():
    with pytest.raises(AssertionError, match="does not know"):
        parse_recorded("megatron_lm_args", ["--uneven-pp"])
    with pytest.raises(argparse.ArgumentError, match="invalid choice: 'fsdp'"):
        parse_recorded("megatron_lm_args", ["--ckpt-format", "fsdp"])


@pytest.mark.parametrize("lps,v,text", [
    ((11, 11, 10), 1, "Et*11|t*11|t*10,L"),
    ((4, 4), 2, "Et*2|t*2|t*2|t*2,L"),
    ((1, 1), 1, "Et|t,L"),
])  # fmt: skip
def test_pipeline_layout_strings(lps, v, text):
    assert pipeline_layout(lps, v) == text
    layout = megatron_core().Layout(text, len(lps))
    layout.validate_layer_layout(num_layers=sum(lps), mtp_num_layers=None)


# ---------------------------------------------------------------------------- DeepSpeed
class _MPU:
    def __init__(self, d: int):
        self.d = d

    def get_data_parallel_world_size(self) -> int:
        return self.d


@pytest.mark.parametrize("name", _runs("deepspeed"))
def test_deepspeed_recipe_passes_deepspeed_checks(name, monkeypatch):
    pl = engine_plan(name, "deepspeed")
    c, recipe = pl.best, pl.recipe("deepspeed")
    par, st, world = c.parallel, c.setup, pl.cluster.world_size
    _engine_runs("deepspeed", par, st)
    DeepSpeedConfig = deepspeed_config_class()
    import deepspeed.comm as dist

    monkeypatch.setattr(dist, "get_rank", lambda *a, **k: 0)
    monkeypatch.setattr(dist, "get_world_size", lambda *a, **k: world)
    data = json.loads(recipe.file("ds_config.json"))
    plain = par.tp == 1 and par.pp == 1
    cfg = DeepSpeedConfig(data, mpu=None if plain else _MPU(par.dp))
    # the data-parallel size DeepSpeed derives, and what it will run
    assert cfg.world_size == par.dp
    assert cfg.train_micro_batch_size_per_gpu == st.micro_batch
    assert cfg.gradient_accumulation_steps == st.num_microbatches
    assert cfg.train_batch_size == pl.global_batch
    assert cfg.zero_optimization_stage == par.zero
    if plain and par.ep > 1:
        from deepspeed.module_inject.auto_ep_config import validate_autoep_config

        ep = cfg.expert_parallel_config
        assert ep.enabled and ep.autoep_size == par.ep
        validate_autoep_config(ep, world_size=world, pp_size=1, tp_size=1, sp_size=par.cp,
                               zero_stage=par.zero)
    if not plain:  # Megatron-DeepSpeed's flags, by its recorded parser
        a = parse_recorded("megatron_deepspeed_args", list(recipe.args))
        assert (a.tensor_model_parallel_size, a.pipeline_model_parallel_size) == (par.tp, par.pp)
        assert a.micro_batch_size == st.micro_batch and a.global_batch_size == pl.global_batch
        assert a.zero_stage == par.zero and a.deepspeed and a.deepspeed_config
        assert (a.ds_sequence_parallel_size or 1) == par.cp
        assert (a.moe_expert_parallel_size or 1) == par.ep
        assert "Megatron-DeepSpeed" in " ".join(recipe.notes)


def test_deepspeed_check_refuses_the_old_batch_arithmetic(monkeypatch):
    """What the issue saw: with the world size as the data-parallel size, 1536 != 4·4·768."""
    DeepSpeedConfig = deepspeed_config_class()
    import deepspeed.comm as dist

    monkeypatch.setattr(dist, "get_rank", lambda *a, **k: 0)
    monkeypatch.setattr(dist, "get_world_size", lambda *a, **k: 768)
    bad = {"train_batch_size": 1536, "train_micro_batch_size_per_gpu": 4,
           "gradient_accumulation_steps": 4}
    with pytest.raises(AssertionError, match="1536 != 4 \\* 4 \\* 768"):
        DeepSpeedConfig(bad)


# ---------------------------------------------------------------------------- torchtitan
@pytest.mark.parametrize("name", _runs("torchtitan"))
def test_torchtitan_recipe_passes_torchtitan_checks(name):
    pl = engine_plan(name, "torchtitan")
    c, recipe = pl.best, pl.recipe("torchtitan")
    par, st, world = c.parallel, c.setup, pl.cluster.world_size
    _engine_runs("torchtitan", par, st)
    tt = torchtitan()
    cfg = tt.ConfigManager().parse_args(list(recipe.args))
    pd = tt.ParallelDims.from_config(cfg.parallelism, world)  # its parallel-dims check
    assert (pd.tp, pd.pp, pd.cp, pd.ep) == (par.tp, par.pp, par.cp, par.ep)
    batch_degree = pd.dp_replicate * pd.dp_shard
    assert batch_degree == par.dp
    if par.ep > 1:
        assert (pd.dp_shard * pd.cp * pd.tp) % pd.ep == 0  # efsdp = dp_shard·cp·tp / ep
    assert cfg.parallelism.enable_sequence_parallel == (par.sp or par.tp == 1)
    divisor = (pd.tp if cfg.parallelism.enable_sequence_parallel else 1) * (
        2 * pd.cp if pd.cp > 1 else 1)
    assert cfg.training.seq_len % divisor == 0  # the trainer's sequence-length rule
    # what torchtitan will run (Trainer.__init__): accumulation steps and pipeline micro-batches
    local, G = cfg.training.local_batch_size, cfg.training.global_batch_size
    assert G == pl.global_batch and G % (local * batch_degree) == 0
    accumulation = G // (local * batch_degree)
    if pd.pp > 1:
        ppmb = cfg.parallelism.pipeline_parallel_microbatch_size
        assert local % ppmb == 0
        micro, per_schedule = ppmb, local // ppmb
        model = types.SimpleNamespace(layers=[None] * pl.spec.layers)
        stages, layers, first, last = tt.pipeline_metadata(pd, cfg.parallelism, model)
        assert stages == par.pp * par.vpp
        parts = tt.split(stages, layers, first, last)
        schedule = cfg.parallelism.pipeline_parallel_schedule
        assert schedule == {"zbv": "ZBVZeroBubble", "interleaved": "Interleaved1F1B",
                            "1f1b": "1F1B"}[st.schedule]  # fmt: skip
        # the stages torchtitan gives each rank (a loop, or ZB-V's V: stages r and 2p-1-r)
        per_rank = [sum(m.startswith("layers.") for s in tt.rank_stages(r, par.pp, schedule, stages)
                        for m in parts[s]) for r in range(par.pp)]  # fmt: skip
        assert tuple(per_rank) == c.layers_per_stage
    else:
        micro, per_schedule = local, 1
    assert micro == st.micro_batch
    assert accumulation * per_schedule == st.num_microbatches
    ac = type(cfg.activation_checkpoint).__qualname__ if cfg.activation_checkpoint else "none"
    assert ac.split(".")[0].lower().replace("ac", "") in (
        {"full": "full", "selective": "selective", "none": "none"}[st.recompute],)


# ---------------------------------------------------------------------------- what a recipe builds
def _megatron_args(spec, nodes=1):
    pl = plan(spec, Cluster("h100-sxm", 8, nodes), 64, 4096, top=1, engine="megatron-core")
    return parse_recorded("megatron_lm_args", list(pl.recipe("megatron").args))


def test_megatron_recipe_builds_per_head_qk_norms_and_latent_attention():
    """Qwen3's per-head q/k RMSNorms are Megatron-LM's --qk-layernorm; multi-latent attention
    (DeepSeek-V2 §2.1) its --multi-latent-attention with the ranks and head widths, parsed by
    the recorded argument parser."""
    a = _megatron_args(ModelSpec.preset("qwen3-32b"), nodes=2)
    assert a.qk_layernorm is True
    mla = ModelSpec(name="mla-dense", vocab_size=32000, hidden=2048, layers=24, heads=16,
                    head_dim=192, ffn_hidden=10944, ffn_kind="swiglu", norm="rmsnorm",
                    q_lora_rank=0, kv_lora_rank=512, qk_rope_head_dim=64, v_head_dim=128)
    # the megatron-core activation table has no MLA rows, so the planner refuses to size it
    # (the recorded runs showed that table is the engine's own, term by term); the model
    # arguments its recipe would write still parse
    with pytest.raises(ValueError, match="attention=mla"):
        estimate(mla, ParallelConfig(dp=8), TrainingSetup(seq_len=4096, engine="megatron-core"))
    from parmem.planner.emit.megatron import model_args

    a = parse_recorded("megatron_lm_args", list(model_args(mla, 4096)))
    assert a.multi_latent_attention is True and a.q_lora_rank is None
    assert (a.kv_lora_rank, a.qk_head_dim, a.qk_pos_emb_head_dim, a.v_head_dim) == (512, 128, 64, 128)


@pytest.mark.parametrize("preset, field", [
    ("gemma-3-27b", "sandwich_norm"),
    ("gpt-oss-120b", "attention_sinks"),
    ("deepseek-v3", "shared_experts"),
    ("llama-4-maverick", "moe_every=2"),
])  # fmt: skip
def test_a_model_megatron_cannot_build_gets_no_recipe(preset, field):
    from parmem.planner.emit.megatron import model_args

    with pytest.raises(ValueError, match=f"cannot express {preset!r}: .*{field}"):
        model_args(ModelSpec.preset(preset), 4096)


def test_config_families_megatron_cannot_build_are_named():
    from parmem.planner.emit.megatron import unexpressed

    gptj = ModelSpec.from_hf_config({"model_type": "gptj", "n_layer": 2, "n_embd": 64, "n_head": 4,
                                     "vocab_size": 128, "rotary_dim": 8})
    assert any(u.startswith("parallel_block") for u in unexpressed(gptj))
    olmo2 = ModelSpec.from_hf_config({"model_type": "olmo2", "num_hidden_layers": 2,
                                      "hidden_size": 64, "num_attention_heads": 4,
                                      "intermediate_size": 96, "vocab_size": 128})
    assert any(u.startswith("norm_position='post'") for u in unexpressed(olmo2))


def test_what_the_megatron_recipe_refuses_has_no_flag_at_the_recorded_commit():
    """The refusals said to have no Megatron-LM flag (planner/emit/megatron.py) have none in the
    recorded argument parser: no parallel attention/MLP block, sandwich or post norms, embedding
    norm, output-layer bias, logit soft-capping or ALiBi option; position embeddings are
    learned_absolute, rope, mrope or none."""
    options = json.loads((FIXTURES / "megatron_lm_args.json").read_text())["options"]
    flags = [f for o in options for f in o["flags"]]
    for word in ("parallel-attn", "parallel-block", "sandwich", "softcap", "soft-cap",
                 "embedding-norm", "embedding-layernorm", "lm-head", "output-layer-bias",
                 "post-attn", "post-mlp", "alibi"):
        assert not [f for f in flags if word in f], word
    pos = next(o for o in options if "--position-embedding-type" in o["flags"])
    assert "alibi" not in pos["choices"]


def test_the_deepspeed_recipe_refuses_interleaved_stages():
    """Megatron-DeepSpeed under --deepspeed pipelines with DeepSpeed's PipelineEngine, one chunk
    per stage (runtime/pipe/engine.py): a recipe with virtual stages would not run them, so it
    is refused rather than written (the deepspeed profile refuses the layout as well)."""
    from parmem import TrainingSetup
    from parmem.planner.emit.deepspeed import _megatron_deepspeed_args

    pl = plan(ModelSpec.preset("llama-2-13b"), Cluster("h100-sxm", 8, 2), 64, 4096, top=1,
              engine="deepspeed")
    par = ParallelConfig(dp=2, tp=2, pp=4, vpp=2)
    with pytest.raises(ValueError, match="vpp=2: DeepSpeed's PipelineEngine"):
        _megatron_deepspeed_args(pl, par, TrainingSetup(seq_len=4096, schedule="interleaved"))
    with pytest.raises(ValueError, match="engine='deepspeed'"):
        estimate(pl.spec, par, TrainingSetup(seq_len=4096, schedule="interleaved",
                                             engine="deepspeed"))


def test_the_rotary_base_reaches_both_megatron_recipes():
    """Llama 3's rotary base is 500,000 (meta-llama/Meta-Llama-3-70B config.json rope_theta);
    Megatron-LM's default --rotary-base is 10,000, so a recipe without it trains another model.
    Megatron-DeepSpeed spells it --rotary-position-embeddings-theta. Both recorded parsers
    read it back as the integer."""
    from parmem.planner.emit.deepspeed import _megatron_deepspeed_args

    spec = ModelSpec.preset("llama-3-70b")
    assert spec.rope_theta == 500000
    a = _megatron_args(spec, nodes=4)
    assert a.rotary_base == 500000
    assert _megatron_args(ModelSpec.preset("llama-2-13b"), nodes=2).rotary_base == 10000
    pl = plan(spec, Cluster("h100-sxm", 8, 4), 64, 4096, top=1, engine="deepspeed")
    args = _megatron_deepspeed_args(pl, ParallelConfig(dp=8, tp=2, pp=2), pl.best.setup)
    ds = parse_recorded("megatron_deepspeed_args", args)
    assert ds.rope_theta == 500000  # dest of --rotary-position-embeddings-theta


def test_megatron_recipe_keeps_adam_moments_in_bf16_when_planned_so():
    """DeepSeek-V3's bf16 AdamW moments (§3.3.3) are Megatron-Core's precision-aware optimizer:
    the recorded parser must read them back as bf16 (optimizer_config.py: exp_avg_dtype)."""
    spec = ModelSpec.preset("llama-3-8b")
    pl = plan(spec, Cluster("h100-sxm", 8, 1), 64, 4096, top=1, engine="megatron-core",
              optimizer="adamw-bf16")
    a = parse_recorded("megatron_lm_args", list(pl.recipe("megatron").args))
    assert a.use_precision_aware_optimizer
    assert (str(a.exp_avg_dtype), str(a.exp_avg_sq_dtype)) in {("bf16", "bf16"),
                                                                ("torch.bfloat16", "torch.bfloat16")}
    default = plan(spec, Cluster("h100-sxm", 8, 1), 64, 4096, top=1, engine="megatron-core")
    assert not parse_recorded("megatron_lm_args",
                              list(default.recipe("megatron").args)).use_precision_aware_optimizer


@pytest.mark.parametrize(("optimizer", "engine", "flag"), [
    ("lion", "megatron-core", ("--optimizer", "lion")),
    ("sgd", "megatron-core", ("--sgd-momentum", "0.0")),
    ("adamw-bf16", "fsdp2", ("--optimizer.implementation", "fused_opt_states_bf16")),
])
def test_recipes_run_the_optimizer_that_was_priced(optimizer, engine, flag):
    """The optimizer the estimate priced is the one the recipe launches: Megatron-LM's
    --optimizer choices and torchtitan's bf16-moment implementation, read back by their parsers."""
    spec = ModelSpec.preset("llama-3-8b")
    pl = plan(spec, Cluster("h100-sxm", 8, 1), 64, 4096, top=1, engine=engine, optimizer=optimizer)
    emit = "megatron" if engine == "megatron-core" else "torchtitan"
    args = list(pl.recipe(emit).args)
    i = args.index(flag[0])
    assert args[i + 1] == flag[1]
    if emit == "megatron":
        a = parse_recorded("megatron_lm_args", args)
        assert a.optimizer == ("lion" if optimizer == "lion" else "sgd")
    else:
        cfg = torchtitan().ConfigManager().parse_args(args)
        assert cfg.optimizer.implementation == "fused_opt_states_bf16"


@pytest.mark.parametrize(("optimizer", "engine"), [("adam-8bit", "megatron-core"),
                                                   ("adafactor", "fsdp2")])
def test_an_optimizer_the_engine_lacks_is_refused_by_name(optimizer, engine):
    spec = ModelSpec.preset("llama-3-8b")
    zero = 3 if engine == "fsdp2" else 1
    with pytest.raises(ValueError, match=f"cannot run optimizer='{optimizer}'"):
        estimate(spec, ParallelConfig(dp=8, zero=zero),
                 TrainingSetup(seq_len=4096, engine=engine, optimizer=optimizer))


def test_a_zero3_deepspeed_recipe_says_to_build_the_model_sharded():
    """Without deepspeed.zero.Init (runtime/zero/partition_parameters.py) each rank builds the
    whole model before ZeRO-3 shards it: 140 GB of bf16 weights for a 70B model, on every GPU."""
    spec = ModelSpec.preset("llama-2-70b")
    pl = plan(spec, Cluster("a100-80gb", 8, 8), 128, 4096, top=1, engine="deepspeed",
              zero=(3,))
    recipe = pl.recipe("deepspeed")
    assert pl.best.parallel.zero == 3
    assert any("deepspeed.zero.Init" in n for n in recipe.notes)
    small = plan(ModelSpec.preset("llama-2-7b"), Cluster("a100-80gb", 8, 1), 64, 4096, top=1,
                 engine="deepspeed", zero=(1,))
    assert not any("zero.Init" in n for n in small.recipe("deepspeed").notes)


@pytest.mark.parametrize("engine", ["megatron-core", "fsdp2"])
def test_recipes_turn_on_the_tp_overlap_the_time_assumed(engine):
    """tp_comm_overlap=True prices every TP collective as overlapped; the recipe then turns the
    engine's switch on (Megatron-LM's --tp-comm-overlap, torchtitan 0.3.0's async TP under
    torch.compile), read back by the engines' parsers; without it, neither is on."""
    spec = ModelSpec.preset("llama-3-8b")
    emit = "megatron" if engine == "megatron-core" else "torchtitan"
    zero = 1 if engine == "megatron-core" else 3
    on, off = (plan(spec, Cluster("h100-sxm", 8, 1), 64, 4096, top=1, engine=engine, tp=4,
                    sp=True, zero=zero, tp_comm_overlap=flag) for flag in (True, False))  # fmt: skip
    for pl, flag in ((on, True), (off, False)):
        assert pl.best is not None and pl.best.setup.tp_comm_overlap is flag
        recipe = pl.recipe(emit)
        args = list(recipe.args)
        if emit == "megatron":
            a = parse_recorded("megatron_lm_args", args)
            assert a.tp_comm_overlap is flag
            env = {k: v for k, v in recipe.env if v is not None}
            for fragment, ok in MEGATRON_RULES:  # Megatron-LM's validate_args, as recorded
                assert ok(a, env, pl.cluster.world_size), fragment
        else:
            cfg = torchtitan().ConfigManager().parse_args(args)
            assert cfg.compile.enable_async_tensor_parallel is flag
            assert cfg.compile.enable is flag
    # the same layout is faster when every TP collective may hide
    assert on.best.time.tp < off.best.time.tp


def test_an_engine_without_a_tp_overlap_switch_refuses_it():
    spec = ModelSpec.preset("llama-2-7b")
    st = TrainingSetup(seq_len=4096, engine="deepspeed", tp_comm_overlap=True)
    with pytest.raises(ValueError, match="has no tp_comm_overlap=True"):
        estimate(spec, ParallelConfig(dp=8), st)
    st = TrainingSetup(seq_len=4096, engine="megatron-core", tp_comm_overlap=True)
    with pytest.raises(ValueError, match="needs sequence parallelism"):
        estimate(spec, ParallelConfig(dp=2, tp=4, sp=False), st)


@pytest.mark.parametrize(("model", "chunks", "want"), [("llama-3-8b", None, 8),
                                                       ("llama-3-8b", 4, 4),
                                                       ("mistral-7b", None, 0)])  # fmt: skip
def test_the_torchtitan_recipe_runs_the_loss_the_estimate_counts(model, chunks, want):
    """torchtitan 0.3.0's own Llama 3 configs wrap the loss in ChunkedLossWrapper (8 chunks) and
    its Transformers backend keeps the plain CrossEntropyLoss: the recipe's parsed config runs
    the chunks the plan's layout counts (parmem.estimate.loss_pieces), and says
    --loss.num_chunks only where the plan's differ from the config's."""
    from parmem.layout import layout

    spec = ModelSpec.preset(model)
    pl = plan(spec, Cluster("h100-sxm", 8, 1), 64, 4096, top=1, engine="fsdp2",
              loss_chunks=chunks)  # fmt: skip
    c = pl.best
    assert layout(spec, c.parallel, c.setup, list(c.layers_per_stage)).loss_chunks == want
    args = list(pl.recipe("torchtitan").args)
    assert ("--loss.num_chunks" in args) == (chunks is not None)
    cfg = torchtitan().ConfigManager().parse_args(args)
    kind = type(cfg.loss).__qualname__.split(".")[0]
    if want:
        assert kind == "ChunkedLossWrapper" and cfg.loss.num_chunks == want
    else:
        assert kind == "CrossEntropyLoss"


def test_a_whole_loss_for_torchtitans_own_llama_has_no_recipe():
    spec = ModelSpec.preset("llama-3-8b")
    pl = plan(spec, Cluster("h100-sxm", 8, 1), 64, 4096, top=1, engine="fsdp2", loss_chunks=0)
    with pytest.raises(ValueError, match="loss_chunks=0"):
        pl.recipe("torchtitan")


def test_every_native_torchtitan_config_chunks_the_loss_as_the_profile_says():
    """[engines.fsdp2.native] against torchtitan 0.3.0's own config registry: each preset's
    "--module/--config" parses, and its loss is ChunkedLossWrapper with the profile's
    loss_chunks (the default every estimate of those models uses)."""
    prof = engine_profile("fsdp2")
    assert prof.native and prof.loss_chunks
    for model, config in prof.native:
        module, name = config.split("/")
        cfg = torchtitan().ConfigManager().parse_args(["--module", module, "--config", name])
        assert type(cfg.loss).__qualname__.split(".")[0] == "ChunkedLossWrapper", model
        assert cfg.loss.num_chunks == prof.loss_chunks == prof.default_loss_chunks(model)


def test_torchtitans_vocab_sharded_loss_is_the_one_measured_under_tp():
    """engine_loss('fsdp2', tp=True) measures _LossParallelCrossEntropy (loss_peak_tp): it is
    what torchtitan's cross_entropy_loss calls on vocab-sharded logits, in both SPMD backends."""
    import ast
    import inspect

    from torchtitan.components.loss import cross_entropy_loss

    calls = [n for n in ast.walk(ast.parse(inspect.getsource(cross_entropy_loss)))
             if isinstance(n, ast.Attribute) and n.attr == "apply"
             and getattr(n.value, "id", "") == "_LossParallelCrossEntropy"]  # fmt: skip
    assert len(calls) == 2
