"""Engine profiles (parmem.engines): the registry, bad input, bytes per parameter per ZeRO stage,
optimizer presets, offload, vocabulary padding, and two engines' own numbers: DeepSpeed's
estimators (called here, installed package, CPU) and Megatron-LM's theoretical_memory_usage.py
(recorded in tests/fixtures by scripts/record_megatron_memory.py).

Expected values are the engines' documentation, the papers' counts (Lion: Chen et al. 2023,
Algorithm 2; Adafactor: Shazeer & Stern 2018, §3; 8-bit Adam: Dettmers et al. 2022, §2;
ZeRO-Offload: Ren et al. 2021, §4.1) or the engines' own code, never a run of parmem.
"""

import json
import os
from pathlib import Path

import pytest

from parmem import ModelSpec, ParallelConfig, TrainingSetup, estimate
from parmem.engines import engine, engines, optimizer_preset, optimizer_presets
from parmem.sharding import factored_numel, largest_module_params, vocab_rows
from parmem.states import model_state_bytes

FIXTURE = Path(__file__).parent / "fixtures" / "megatron_theoretical_memory.json"
PSI = 1 << 24  # a parameter count every d below divides


def per_param(engine_name, zero, d, **kw):
    m = model_state_bytes(PSI, d, zero, engine=engine_name, **kw)
    return m.total / PSI, m.host / PSI


# ---------------------------------------------------------------------------- registry
def test_engines_lists_the_five_profiles_with_versions():
    names = engines()
    assert list(names)[:1] == ["paper"]
    assert {"paper", "megatron-core", "deepspeed", "fsdp2", "hf"} <= set(names)
    assert all(title and "\n" not in title for title in names.values())
    assert "0.16.1" in engine("megatron-core").version
    assert "0.19.8" in engine("deepspeed").version
    assert "0.3.0" in engine("fsdp2").version
    assert "5.23.0" in engine("hf").version


@pytest.mark.parametrize("call", [
    lambda: engine("nemo"),
    lambda: TrainingSetup(seq_len=128, engine="nemo"),
    lambda: model_state_bytes(10, engine="nemo"),
])
def test_unknown_engine_lists_the_valid_names(call):
    with pytest.raises(ValueError, match="engine='nemo' must be one of 'paper', 'megatron-core'"):
        call()


@pytest.mark.parametrize("call", [
    lambda: optimizer_preset("muon"),
    lambda: TrainingSetup(seq_len=128, optimizer="muon"),
    lambda: model_state_bytes(10, optimizer="muon"),
])
def test_unknown_optimizer_lists_the_valid_names(call):
    with pytest.raises(ValueError, match="optimizer='muon' must be one of 'adamw', .*'lion'"):
        call()


LLAMA = ModelSpec.preset("llama-2-7b")


@pytest.mark.parametrize("name,par,setup_kw,msg", [
    ("deepspeed", ParallelConfig(pp=2, zero=2), {}, "pipeline supports ZeRO stage <= 1"),
    ("megatron-core", ParallelConfig(dp=2, zero=2), {}, "cannot express zero=2"),
    ("hf", ParallelConfig(pp=2), {}, "no pipeline parallelism"),
    ("hf", ParallelConfig(dp=2, zero=1), {}, "cannot express zero=1"),
    ("hf", ParallelConfig(), {"recompute": "selective"}, "has no recompute='selective'"),
    ("fsdp2", ParallelConfig(dp=2, zero=1), {}, "cannot express zero=1"),
    ("fsdp2", ParallelConfig(dp=2, zero=3), {"offload": "optimizer"}, "cannot offload"),
    ("megatron-core", ParallelConfig(dp=2, zero=1), {"offload": "optimizer+params"},
     "cannot offload"),
])
def test_a_layout_the_profile_cannot_express_names_the_profile(name, par, setup_kw, msg):
    setup = TrainingSetup(seq_len=1024, engine=name, **setup_kw)
    with pytest.raises(ValueError, match=msg) as err:
        estimate(LLAMA, par, setup)
    assert f"engine={name!r}" in str(err.value)


def test_offload_needs_the_zero_stage_it_shards():
    with pytest.raises(ValueError, match="offload='optimizer' needs zero >= 1"):
        model_state_bytes(PSI, 8, 0, offload="optimizer")
    with pytest.raises(ValueError, match="offload='optimizer\\+params' needs zero=3"):
        model_state_bytes(PSI, 8, 2, engine="deepspeed", offload="optimizer+params")


def test_bad_setup_fields():
    with pytest.raises(ValueError, match="grad_dtype='fp8' must be one of"):
        TrainingSetup(seq_len=128, grad_dtype="fp8")
    with pytest.raises(ValueError, match="master_weights=True needs 16-bit weights"):
        TrainingSetup(seq_len=128, precision="fp32", master_weights=True)
    with pytest.raises(ValueError, match="offload='disk' must be one of"):
        TrainingSetup(seq_len=128, offload="disk")
    with pytest.raises(ValueError, match="dropout='no' must be True or False"):
        TrainingSetup(seq_len=128, dropout="no")


# ---------------------------------------------------------------------------- bytes per parameter
D = 8


@pytest.mark.parametrize("name,expected", [
    # ZeRO §5 (Rajbhandari et al. 2020): 16, 4 + 12/d, 2 + 14/d, 16/d
    ("paper", [16, 4 + 12 / D, 2 + 14 / D, 16 / D]),
    # Megatron-LM docs/user-guide/features/dist_optimizer.md: bf16 params, fp32 grads: 18 without
    # the distributed optimizer, 6 + 12/d with it
    ("megatron-core", [18, 6 + 12 / D, None, None]),
    # DeepSpeed: stage 0 = FP16_Optimizer (2 + 2 + 12); stage 1: 16-bit grads whole, fp32 grad
    # partition + master + moments sharded; stage 2: 2 + 18/d (estimate_zero2_...); stage 3:
    # 20/d at the optimizer step as the engine runs (16-bit weights and gradient partition,
    # fp32 master and moments, the fp32 gradient in the step; data/engine_runs/deepspeed.json),
    # where estimate_zero3_... says 18/d
    ("deepspeed", [16, 4 + 16 / D, 2 + 18 / D, 20 / D]),
    # torchtitan/FSDP2: fp32 sharded weights, fp32 gradients, fp32 moments: 16/d; DDP: 16
    ("fsdp2", [16, None, None, 16 / D]),
    # Transformers Trainer on a 16-bit checkpoint: bf16 weights, gradients and AdamW moments
    ("hf", [8, None, None, None]),
])
def test_bytes_per_parameter_per_zero_stage(name, expected):
    for zero, want in enumerate(expected):
        if want is None:
            with pytest.raises(ValueError, match=f"engine={name!r}"):
                model_state_bytes(PSI, D, zero, engine=name)
        else:
            assert per_param(name, zero, D) == (want, 0.0)


@pytest.mark.parametrize("precision,plain,dist", [
    # dist_optimizer.md's table: fp16 params, fp16 grads 20 / 4 + 16/d; fp32: 16 / 8 + 8/d
    ("fp16-mixed", 20, 4 + 16 / D),
    ("bf16-mixed", 18, 6 + 12 / D),
    ("fp32", 16, 8 + 8 / D),
])
def test_megatron_distributed_optimizer_table(precision, plain, dist):
    assert per_param("megatron-core", 0, D, precision=precision)[0] == plain
    assert per_param("megatron-core", 1, D, precision=precision)[0] == dist


def test_grad_dtype_and_master_weights_override_the_profile():
    # paper with fp32 gradients (Megatron's choice): 2 + 4 + 12
    assert per_param("paper", 0, D, grad_dtype="fp32")[0] == 18
    # pure bf16 weights with an fp32 master copy = mixed precision
    assert per_param("paper", 0, D, precision="bf16", master_weights=True)[0] == 2 + 2 + 4 + 4
    # mixed precision without master weights: 2 + 2 + 8
    assert per_param("paper", 0, D, master_weights=False)[0] == 12
    # torchtitan's training.dtype="bfloat16" (config/configs.py): "all parameters, gradients,
    # and optimizer states in bfloat16, without an extra copy of fp32 weights"
    assert per_param("fsdp2", 3, D, master_weights=False)[0] == (2 + 2 + 2 * 2) / D


# ---------------------------------------------------------------------------- optimizer presets
@pytest.mark.parametrize("opt,moments", [
    ("adamw", 8), ("adam", 8),            # Kingma & Ba 2015: m and v, fp32
    ("lion", 4),                          # Chen et al. 2023, Algorithm 2: one momentum
    ("sgd-momentum", 4), ("sgd", 0),
])
def test_optimizer_states_per_parameter(opt, moments):
    # mixed precision: 2 (weights) + 2 (grads) + 4 (fp32 master) + the optimizer's moments
    assert per_param("paper", 0, D, optimizer=opt)[0] == 2 + 2 + 4 + moments


def test_adam_8bit_is_one_byte_per_moment_plus_block_scales():
    # Dettmers et al. 2022 §2: two 8-bit states, one fp32 absmax per block of 2048 values each
    n = 2048 * 1000
    m = model_state_bytes(n, optimizer="adam-8bit")
    assert m.optimizer == 4 * n + 2 * (n + 4 * 1000)
    assert optimizer_preset("adam-8bit").block == 2048


def test_adafactor_keeps_rows_plus_columns_per_matrix():
    # Shazeer & Stern 2018 §3: a r x c matrix keeps r + c second-moment values, a vector all of
    # its values; no first moment (beta1 = 0). GPT-2 small, counted by hand from its shapes.
    spec = ModelSpec.preset("gpt2")
    h, f, V, P, L = 768, 3072, 50257, 1024, 12
    layer = (3 * (h + h) + (h + h)          # q, k, v, o weights
             + 3 * h + h                    # q, k, v, o biases
             + (f + h) + (h + f)            # fc1, fc2 weights
             + f + h                        # fc1, fc2 biases
             + 4 * h)                       # two LayerNorms, weight and bias
    want = L * layer + (V + h) + (P + h) + 2 * h   # embedding, positions, final norm
    assert factored_numel(spec) == (want, 0)
    est = estimate(spec, setup=TrainingSetup(seq_len=1024, optimizer="adafactor"))
    n = spec.num_params()
    assert est.stages[0].optimizer == 4 * n + 4 * want  # fp32 master + factored moment
    # from ZeRO-1 on, the shard is a flat 1-D buffer: a full second moment of n/d values
    par = ParallelConfig(dp=4, zero=1)
    est = estimate(spec, par, TrainingSetup(seq_len=1024, optimizer="adafactor"))
    assert est.stages[0].optimizer == 8 * -(-n // 4)
    assert optimizer_presets()["adafactor"].factored


# ---------------------------------------------------------------------------- offload
def test_zero_offload_moves_gradients_and_fp32_states_to_the_host():
    # Ren et al. 2021 (ZeRO-Offload) §4.1: the GPU keeps the 16-bit weights (2 per parameter);
    # the host the 16-bit gradients and the fp32 master weights, momentum and variance (2 + 12)
    assert per_param("paper", 2, D, offload="optimizer") == (2, 14 / D)
    # ZeRO-Infinity-style parameter offload at stage 3: nothing of the model states stays
    assert per_param("paper", 3, D, offload="optimizer+params") == (0, 16 / D)
    # ZeRO-1: the gradients stay whole on the GPU
    assert per_param("paper", 1, D, offload="optimizer") == (2 + 2, 12 / D)


def test_host_bytes_per_node_in_the_estimate():
    spec = ModelSpec.preset("llama-2-7b")
    par = ParallelConfig(dp=16, zero=3)
    setup = TrainingSetup(seq_len=1024, engine="deepspeed", offload="optimizer+params")
    est = estimate(spec, par, setup, gpus_per_node=8)
    n = spec.num_params()
    shard = -(-n // 16)
    assert est.stages[0].model_states == 0
    assert est.stages[0].host == 18 * shard
    assert est.host_bytes_per_node == 8 * 18 * shard
    assert "host:" in str(est) and "offload=optimizer+params" in str(est)


# ---------------------------------------------------------------------------- vocabulary padding
def test_megatron_pads_the_vocabulary_to_a_multiple_of_128_t():
    # Megatron-LM vocab_size_with_padding: V = 32000 at t = 8 pads to 32768 (multiple of 1024)
    spec = ModelSpec.preset("llama-2-70b")
    assert vocab_rows(spec, 8, 128) == 32768 // 8
    assert vocab_rows(spec, 8) == 4000  # no padding: ceil(V/t)
    assert vocab_rows(spec, 1, 128) == 32000  # already a multiple of 128
    par = ParallelConfig(tp=8, pp=4, dp=4, zero=1)
    st = dict(seq_len=4096, num_microbatches=8)
    mc = estimate(spec, par, TrainingSetup(engine="megatron-core", **st))
    pa = estimate(spec, par, TrainingSetup(**st))
    h = 8192
    assert mc.stages[0].num_params - pa.stages[0].num_params == (32768 - 32000) // 8 * h
    assert mc.stages[-1].logits == 4 * 4096 * 32768 // 8


def test_largest_module_is_the_embedding_for_llama():
    spec = ModelSpec.preset("llama-2-7b")
    assert largest_module_params(spec) == 32000 * 4096
    assert largest_module_params(spec.with_(vocab_size=1000)) == 11008 * 4096  # an MLP matrix


# ---------------------------------------------------------------------------- dropout follows the model
def test_dropout_follows_the_model():
    gpt3, llama = ModelSpec.preset("gpt3-175b"), ModelSpec.preset("llama-2-7b")
    assert gpt3.dropout == 0.1 and llama.dropout == 0.0
    setup = TrainingSetup(seq_len=2048)
    assert setup.dropout_for(gpt3) and not setup.dropout_for(llama)
    assert TrainingSetup(seq_len=2048, dropout=True).dropout_for(llama)
    s, h = 2048, 4096
    on = estimate(llama, setup=TrainingSetup(seq_len=s, dropout=True, flash_attention=True))
    off = estimate(llama, setup=TrainingSetup(seq_len=s, flash_attention=True))
    # two 1-byte masks per layer (attention output, MLP) and the embedding's mask
    assert on.stages[0].activations - off.stages[0].activations == (2 * 32 + 1) * s * h


@pytest.mark.parametrize("cfg,dropout", [
    ({"model_type": "gpt2", "vocab_size": 50257, "n_embd": 768, "n_layer": 12, "n_head": 12,
      "n_positions": 1024, "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1}, 0.1),
    ({"model_type": "gpt2", "vocab_size": 50257, "n_embd": 768, "n_layer": 12, "n_head": 12,
      "n_positions": 1024}, 0.1),  # GPT2Config's defaults
    ({"model_type": "llama", "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
      "num_hidden_layers": 32, "num_attention_heads": 32, "attention_dropout": 0.0}, 0.0),
    ({"model_type": "qwen2", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
      "attention_dropout": 0.05}, 0.05),
    ({"model_type": "mistral", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4}, 0.0),  # Llama key names: no dropout
])
def test_from_hf_config_reads_the_dropout(cfg, dropout):
    assert ModelSpec.from_hf_config(cfg).dropout == dropout


# ---------------------------------------------------------------------------- activations per profile
def test_megatron_fused_swiglu_keeps_6sbf_not_8sbf():
    # fusions/fused_bias_swiglu.py SwiGLUFunction saves its 2f-wide input; linear_fc2 keeps the
    # f-wide output: 2·(2sbf) + 2sbf = 6sbf bytes, where the paper's unfused count is 8sbf
    from parmem.activations import layer_terms

    spec = ModelSpec.preset("llama-2-7b")
    s, f = 4096, 11008

    def mlp(name):
        terms = layer_terms(spec, s, 1, engine=name)
        return sum(x.bytes for x in terms if x.name in ("mlp hidden", "swiglu input",
                                                         "fc2 input"))
    assert mlp("paper") == 8 * s * f
    assert mlp("megatron-core") == 6 * s * f


def test_every_profile_estimates_every_model_it_can_express():
    for name in engines():
        for model in ("gpt2", "llama-2-7b", "mixtral-8x7b"):
            spec = ModelSpec.preset(model)
            est = estimate(spec, ParallelConfig(), TrainingSetup(seq_len=1024, engine=name,
                                                                 flash_attention=True))
            assert est.peak_bytes > est.stages[0].model_states > 0


# ---------------------------------------------------------------------------- DeepSpeed's estimators
def _deepspeed():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
    return estimate_zero2_model_states_mem_needs, estimate_zero3_model_states_mem_needs


# (preset, GPUs per node, nodes): Ψ and the largest layer from the model's own table
DS_CASES = [
    ("llama-2-7b", 8, 1),
    ("llama-2-13b", 8, 2),
    ("llama-2-70b", 8, 4),
    ("mistral-7b", 4, 1),
    ("gpt2-xl", 2, 1),
    ("mixtral-8x7b", 8, 8),
]


#: DeepSpeedZeroConfig.sub_group_size (runtime/zero/config.py): ZeRO-3 makes the fp32 gradients
#: of this many elements at a time in step()
SUB_GROUP = 1_000_000_000


def _padding(n, gpus, k):
    """k bytes per parameter over ``gpus`` flat shards: parmem pads each to ⌈n/gpus⌉ values
    (as DeepSpeed's flat buffers do); the estimator rounds k·n/gpus down."""
    return k * -(-n // gpus) - int(k * n / gpus)


@pytest.mark.parametrize("name,gpn,nodes", DS_CASES)
def test_deepspeed_profile_equals_deepspeeds_estimators(name, gpn, nodes):
    """The deepspeed profile's model states, and at ZeRO-3 its live-parameter buffer, equal
    estimate_zero2_model_states_mem_needs / estimate_zero3_model_states_mem_needs of the installed
    DeepSpeed, on the GPU and (with additional_buffer_factor=1) on the host. Differences named:
    the flat-shard padding (⌈Ψ/N⌉ per shard, zero when N divides Ψ, as here for all but gpt2-xl);
    ZeRO-2 offload's host term max(4N, 16)Ψ exceeds the 16Ψ per node of sharded fp32 states when
    N > 4, so the host is compared for N <= 4 only."""
    zero2, zero3 = _deepspeed()
    spec = ModelSpec.preset(name)
    psi, ll, n = spec.num_params(), largest_module_params(spec), gpn * nodes

    def ours(zero, offload="none"):
        m = model_state_bytes(psi, n, zero, engine="deepspeed", offload=offload)
        return m.total, m.host * gpn

    # ZeRO-2: 2Ψ + 18Ψ/N on the GPU; offloaded: 2Ψ on the GPU, 16Ψ/N per GPU on the host
    cpu, gpu = zero2(psi, gpn, nodes, cpu_offload=False)
    assert ours(2)[0] == gpu + _padding(psi, n, 18)
    cpu, gpu = zero2(psi, gpn, nodes, cpu_offload=True, additional_buffer_factor=1)
    assert ours(2, "optimizer")[0] == gpu
    if n <= 4:
        assert ours(2, "optimizer")[1] == cpu + _padding(psi, n, 16) * gpn
    # ZeRO-3: 4 x largest layer + 18Ψ/N; offload_optimizer: + 2Ψ/N on the GPU, 16Ψ/node host;
    # offload_param too: the largest layer only on the GPU, 18Ψ per node on the host. One named
    # difference, from the engine's own step (data/engine_runs/deepspeed.json): without offload
    # the engine also keeps its 16-bit gradient partition (grad_partitions_flat_buffer), 2Ψ/N,
    # which the estimator leaves out, and makes the fp32 gradients in the step one sub-group
    # (sub_group_size, 1e9 elements) at a time, where the estimator counts all 4Ψ/N of them
    buffer = 2 * 2 * ll  # the deepspeed profile's ZeRO-3 live parameters (2 bytes, 2 copies)
    for offload, opt, par in (("none", False, False), ("optimizer", True, False),
                              ("optimizer+params", True, True)):
        cpu, gpu, largest = zero3(psi, ll, gpn, nodes, cpu_offload=opt, cpu_offload_params=par,
                                  zero_init=True, additional_buffer_factor=1)
        assert largest == buffer
        total, host = ours(3, offload)
        k_gpu = {"none": 18, "optimizer": 2, "optimizer+params": 0}[offload]
        shard = -(-psi // n)
        named = 2 * shard - 4 * (shard - min(shard, SUB_GROUP)) if offload == "none" else 0
        assert total + buffer == gpu + _padding(psi, n, k_gpu) + named
        if opt:
            k_host = 18 if par else 16
            assert host == int(cpu) + _padding(psi, n, k_host) * gpn


def test_deepspeed_estimate_matches_the_estimator_through_estimate():
    # the same check through estimate(): model states + the ZeRO-3 live-parameter buffer (the
    # comm_buffers left once the 16-bit reduction bucket of 5e8 elements is taken away), with
    # the named difference above: the engine's 16-bit gradient partition, 2Ψ/N
    _, zero3 = _deepspeed()
    spec = ModelSpec.preset("llama-2-7b")
    est = estimate(spec, ParallelConfig(dp=8, zero=3), TrainingSetup(seq_len=1024,
                                                                     engine="deepspeed"))
    st = est.stages[0]
    bucket = 2 * engine("deepspeed").buffers.reduce_bucket
    _, gpu, _ = zero3(spec.num_params(), largest_module_params(spec), 8, 1, cpu_offload=False,
                      cpu_offload_params=False)
    shard = -(-spec.num_params() // 8)  # below one sub-group: the whole fp32 partition in step
    assert shard < SUB_GROUP
    assert st.model_states + st.comm_buffers - bucket == gpu + 2 * shard


TINY = {
    "llama": dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2),
    "mistral": dict(vocab_size=2048, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=1),
    "qwen2": dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2),
    "gpt2": dict(vocab_size=1000, n_embd=64, n_layer=2, n_head=4, n_positions=128),
}


@pytest.mark.parametrize("family", sorted(TINY))
def test_deepspeed_counts_the_same_parameters_and_largest_layer(family):
    """DeepSpeed's own model_to_params on a real (tiny) Transformers model gives the Ψ and the
    largest layer that the estimators above were fed from parmem's table."""
    _deepspeed()
    transformers = pytest.importorskip("transformers")
    from deepspeed.runtime.zero.stage3 import model_to_params

    cfg = transformers.AutoConfig.for_model(family, **TINY[family])
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    spec = ModelSpec.from_hf_config(cfg.to_dict())
    assert model_to_params(model) == (spec.num_params(), largest_module_params(spec))


# ---------------------------------------------------------------------------- Megatron's formula
def _megatron_cases():
    return json.loads(FIXTURE.read_text())


def _spec(fix, model):
    return ModelSpec(name=model, position="rotary", max_positions=4096, **fix["models"][model])


def _estimate(spec, c):
    v = c.get("v") or 1
    par = ParallelConfig(dp=c["d"], tp=c["t"], pp=c["p"], ep=c.get("e", 1), sp=c["t"] > 1,
                         zero=1 if c["dist_opt"] else 0, vpp=v)
    # Megatron's compute_activation_memory counts the unfused attention core (the s x s scores
    # selective recompute drops): compare with the local (non-TE) attention, flash_attention=False,
    # not the profile's default fused kernel
    setup = TrainingSetup(seq_len=2048, num_microbatches=c["m"], recompute=c["recompute"],
                          engine="megatron-core", schedule="interleaved" if v > 1 else "1f1b",
                          flash_attention=False)
    return estimate(spec, par, setup)


def test_megatron_fixture_names_its_commit():
    fix = _megatron_cases()
    assert fix["megatron_lm_commit"].startswith("d98e8a64dd")
    assert len(fix["cases"]) >= 8


@pytest.mark.parametrize("i", range(10))
def test_megatron_core_weights_equal_megatrons_formula(i):
    """compute_weight_and_optimizer_memory: 18 (or 6 + 12/d with the distributed optimizer) bytes
    per parameter of the most loaded shard, padded vocabulary, GQA, SwiGLU and MoE (experts over
    the expert-data-parallel group d/e) included. Equal for p = 1. For p > 1 the formula puts
    1/p of the final norm on the first stage (it divides every replicated parameter by p); the
    final norm lives on the last stage, so the profile's first stage is lower by that share."""
    fix = _megatron_cases()
    c = fix["cases"][i]
    m = fix["models"][c["model"]]
    st = _estimate(_spec(fix, c["model"]), c).stages[0]
    per = 18 if not c["dist_opt"] else 6 + 12 / c["d"]
    final_norm = (2 if m["norm"] == "layernorm" else 1) * m["hidden"]
    share = final_norm / c["p"] * per if c["p"] > 1 else 0
    assert st.model_states == c["weight_and_optimizer_bytes"] - share


def _applies(c, fix):
    m = fix["models"][c["model"]]
    return (c["recompute"] == "selective" and c["t"] > 1 and m["ffn_kind"] == "gelu"
            and not m.get("num_experts") and m.get("kv_heads", m["heads"]) == m["heads"])


def test_megatron_core_activations_equal_megatrons_formula_where_it_applies():
    """compute_activation_memory (Korthikanti et al. 2022 Table 2: sbh(18 + 4f/h)/t per layer with
    SP and selective recompute, the first stage's L layers in flight, 8sbp/t token ids, sbhp/t
    embedding dropout mask, and 4sbh(1 + V/h)/t for the final norm, head and logits when p = 1)
    applies to dense multi-head GeLU layers with SP + selective recompute. There the profile
    equals it plus four named terms the formula leaves out:

    * norm statistics: LayerNorm's fp32 mean and rstd, 2 norms x 8 bytes per token per layer
      (8 bytes per token for the final norm when p = 1), divided by t under SP;
    * token ids: the vocab-parallel embedding keeps 8 bytes per token on every TP rank, not
      8/t;
    * the attention core of the one layer being recomputed (5as²b/t), alive during its
      backward;
    * interleaved schedule: the formula scales the embedding terms by 1 + (p-1)/(pv) micro-batches
      (a fraction), the profile counts whole micro-batches in flight (⌈units/v⌉);
    * the local spec's unfused RoPE keeps cos and sin for Q and for K, 4 x 2 s (h/a) bytes per
      layer on every TP rank, and the cross-entropy keeps int64 target ids, 8 bytes per token on
      every TP rank of the last stage (both measured: data/engine_runs/megatron-core.json).

    Where the formula does not apply, the profile differs for a reason: full recompute (the
    formula then uses compute_activation_memory_without_sp, which assumes no recompute at all:
    sbh(10 + 24/t) per layer); GQA (the formula's 18sbh counts K and V at full width, GQA keeps
    kv_heads/a of them); SwiGLU (the formula's 4f/h is GeLU's input and output; Megatron-Core's
    fused SwiGLU keeps 6sbf, see test_megatron_swiglu_layer_differs_by_named_terms); MoE (the
    formula counts a dense MLP, not top_k experts' dispatched tokens and a router); models
    without dropout (the formula counts the masks). Full recompute, GQA (llama-2-70b) and MoE
    (mixtral-8x7b) cases are in the fixture for the weight check only."""
    fix = _megatron_cases()
    checked = 0
    for c in fix["cases"]:
        if not _applies(c, fix):
            continue
        m = fix["models"][c["model"]]
        spec = _spec(fix, c["model"])
        est = _estimate(spec, c)
        st = est.stages[0]
        s, b, h, a, t, p = 2048, 1, m["hidden"], m["heads"], c["t"], c["p"]
        v = c.get("v") or 1
        # micro-batches (chunk-micro-batches when interleaved) the first stage holds: 1F1B
        # min(m, p); interleaved 1F1B p·v + p - 1 (Narayanan et al. 2021 §2.2)
        units = p * v + p - 1 if v > 1 else min(c["m"], p)
        mb = -(-units // v)  # micro-batches in flight for the embedding terms
        n_layers = m["layers"] // p * units // v  # layer-micro-batches held
        stats = n_layers * 16 * s * b // t + (8 * s * b // t if p == 1 else 0)
        ids = 8 * s * b * mb
        core = 5 * a * s * s * b // t
        if v > 1:
            frac = 1 + (p - 1) / (p * v)
            formula_emb = (8 * s * b * p + s * b * h * p) * frac / t
            emb = ids + s * b * h // t * mb
        else:
            formula_emb = (8 * s * b * p + s * b * h * p) * min(1, c["m"] / p) / t
            emb = ids + s * b * h // t * mb
        # the local spec's unfused RoPE: cos and sin for Q and K, (s, 1, 1, h/a) bf16 each, per
        # layer on every TP rank; the cross-entropy's int64 target ids (every TP rank, last stage)
        rope = n_layers * 4 * 2 * s * (h // a)
        ce_ids = 8 * s * b if p == 1 else 0
        ours = st.activations + (st.logits if p == 1 else 0)
        assert ours == (c["activation_bytes_sp_selective"] - formula_emb + emb + stats + core
                        + rope + ce_ids)
        checked += 1
    assert checked >= 5


def test_megatron_swiglu_layer_differs_by_named_terms():
    """Llama-2-7B at t = 4 (MHA, SwiGLU, RMSNorm, no dropout), SP + selective: the profile equals
    the formula plus fused SwiGLU's extra 2sbf/t per layer (6sbf kept, the formula's 4sbf assumes
    GeLU), minus the dropout masks Llama does not have (2sbh/t per layer and the embedding's
    sbh/t), plus RMSNorm's fp32 rstd (2 norms x 4 bytes per token per layer, 4 for the final
    norm, divided by t), the token ids on every TP rank (8sb, not 8sb/t), the recomputed
    layer's softmax output (2as²b/t: no attention dropout), the unfused RoPE's cos and sin
    (4 x 2 s h/a per layer) and the cross-entropy's int64 target ids (8sb)."""
    fix = _megatron_cases()
    (c,) = [c for c in fix["cases"] if c["model"] == "llama-2-7b"]
    st = _estimate(_spec(fix, "llama-2-7b"), c).stages[0]
    s, h, f, a, t, L = 2048, 4096, 11008, 32, c["t"], 32
    named = (2 * s * f // t * L - 2 * s * h // t * L - s * h // t
             + 8 * s // t * L + 4 * s // t + (8 * s - 8 * s // t) + 2 * a * s * s // t
             + L * 4 * 2 * s * (h // a) + 8 * s)
    assert st.activations + st.logits == c["activation_bytes_sp_selective"] + named


# ---------------------------------------------------------------------------- the command line
def test_cli_engines_lists_one_line_each(capsys):
    from parmem.cli import main

    assert main(["engines"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split()[0] for line in lines] == list(engines())
    assert main(["engines", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[1]["name"] == "megatron-core" and "0.16.1" in rows[1]["version"]


def test_cli_estimate_with_an_engine(capsys):
    from parmem.cli import main

    args = ["estimate", "--model", "llama-2-70b", "--tp", "8", "--pp", "4", "--dp", "4",
            "--zero", "1", "--seq", "4096", "--microbatches", "8", "--json"]
    assert main([*args, "--engine", "megatron-core"]) == 0
    got = json.loads(capsys.readouterr().out)
    ref = estimate(ModelSpec.preset("llama-2-70b"), ParallelConfig(dp=4, tp=8, pp=4, zero=1),
                   TrainingSetup(seq_len=4096, num_microbatches=8, engine="megatron-core"))
    assert got["setup"]["engine"] == "megatron-core"
    assert [s["total"] for s in got["stages"]] == [s.total for s in ref.stages]
    assert main(args[:-1] + ["--engine", "megatron-core"]) == 0
    assert "engine=megatron-core" in capsys.readouterr().out


def test_cli_estimate_offload_prints_host_memory(capsys):
    from parmem.cli import main

    assert main(["estimate", "--model", "llama-2-7b", "--dp", "8", "--zero", "3", "--seq", "2048",
                 "--engine", "deepspeed", "--offload", "optimizer+params"]) == 0
    out = capsys.readouterr().out
    assert "host:" in out and "per node of 8 GPUs" in out


def test_cli_default_dropout_follows_the_model_and_flags_override(capsys):
    from parmem.cli import main

    base = ["estimate", "--model", "llama-2-7b", "--seq", "2048", "--flash", "--json"]
    peaks = []
    for extra in ([], ["--no-dropout"], ["--dropout"]):
        assert main(base + extra) == 0
        peaks.append(json.loads(capsys.readouterr().out)["peak_bytes"])
    assert peaks[0] == peaks[1] < peaks[2]


# ---------------------------------------------------------------------------- the TOML loader
def test_load_toml_reads_with_the_standard_library(tmp_path, monkeypatch):
    import parmem._data as data

    monkeypatch.setattr(data, "DATA_DIRS", (tmp_path,))
    data.load_toml.cache_clear()
    try:
        (tmp_path / "t.toml").write_text('[a]\nb = 1\n')
        assert data.load_toml("t.toml") == {"a": {"b": 1}}
        (tmp_path / "bad.toml").write_text("[a\n")
        with pytest.raises(ValueError, match="data file 'bad.toml' is not valid TOML"):
            data.load_toml("bad.toml")
        with pytest.raises(ValueError, match="data file 'missing.toml' not found"):
            data.load_toml("missing.toml")
    finally:
        data.load_toml.cache_clear()
        monkeypatch.undo()
    assert "paper" in data.load_toml("engines.toml")["engines"]


# ---------------------------------------------------------------------------- torchtitan's SAC
def test_torchtitan_selective_ac_keeps_every_second_matmul():
    """torchtitan's SelectiveAC (distributed/activation_checkpoint.py) keeps the block's input,
    the attention kernel's output and log-sum-exp and the outputs of the 1st, 3rd and 5th matmul
    of a block (wqkv, w1, w2), and recomputes the rest; Llama-2-7B shapes on a GPU, per token:
    2h + 2(q + 2kv) + 2q + 4a + 2f + 2h bytes, where a plain forward keeps the norms' inputs and
    fp32 rstd, their outputs, Q, K, V, the log-sum-exp, the projection input, the gathered
    complex64 RoPE cache (4·head_dim) and four f-wide MLP tensors."""
    from parmem.activations import kept_terms, layer_terms

    spec = ModelSpec.preset("llama-2-7b")
    s, h, a, f = 4096, 4096, 32, 11008
    kept = kept_terms(spec, s, 1, recompute="selective", engine="fsdp2", flash=True)
    assert sum(x.bytes for x in kept) == s * (2 * h + 2 * 3 * h + 2 * h + 4 * a + 2 * f + 2 * h)
    full = layer_terms(spec, s, 1, engine="fsdp2", flash=True)
    rope = 4 * 128  # the complex64 cache gathered per token, head_dim/2 values
    assert sum(x.bytes for x in full) == s * (2 * (2 * h + 4) + 2 * 2 * h + 6 * h + 4 * a
                                              + 2 * h + rope + 8 * f)


def test_hf_layer_is_the_paper_plus_rmsnorms_fp32_copies():
    """Transformers' LlamaDecoderLayer with SDPA keeps the paper's tensors (Korthikanti et al.
    2022 with SwiGLU and FlashAttention: 2 + 2 + 2 + 4 + 2 + 2 + 2 + 8f/h per sbh, plus the
    log-sum-exp) and, per RMSNorm, an fp32 copy of its input (4sbh) and an fp32 rsqrt (4sb); the
    rotary cos and sin once per model (2 x 2·s·head_dim); the loss's int64 shifted labels and
    its 0-d fp32 total weight on the last stage (ForCausalLMLoss, measured in
    tests/test_hf_layers.py). Llama-2-7B: 45.5·sbh + 8sb per layer, where the paper's table
    gives 37.5·sbh."""
    s, h, a, f, d = 4096, 4096, 32, 11008, 128
    spec = ModelSpec.preset("llama-2-7b")
    est = estimate(spec, setup=TrainingSetup(seq_len=s, engine="hf", flash_attention=True))
    per_layer = s * (2 * (4 * h + 2 * h + 4) + 2 * (2 * h) + 2 * h + 4 * h + 4 * a + 2 * h
                     + 8 * f)
    assert per_layer == s * h * 45.5 + 8 * s + 4 * a * s
    first = 8 * s  # int64 token ids
    last = s * (4 * h + 2 * h + 4 + 2 * h)  # final RMSNorm and the LM head's input
    last += 8 * s + 4  # the loss: int64 shifted labels and nll_loss's 0-d fp32 total weight
    assert est.stages[0].activations == 32 * per_layer + 2 * 2 * s * d + first + last


def test_megatron_moe_layer_as_its_router_and_dispatcher_keep_it():
    """Megatron-Core's MoE layer with its defaults (softmax after top-k, no aux loss, allgather
    dispatcher, unfused permute), read from transformer/moe/router.py and moe_utils.py and
    measured on CPU ranks (data/engine_runs/megatron-core.json), per token of Mixtral-8x7B
    (h = 4096, expert f = 14336, E = 8, k = 2): int64 top-k indices (8k), the fp32 top-k softmax
    (4k), the bool routing map (E) and the bf16 routing probabilities (2E) masked_select keeps,
    int64 sorted indices (8k), the dispatched inputs (2hk), the fused weighted SwiGLU input and
    fc2 input (3 x 2fk) and the permuted probabilities (2k); no expert output (the experts apply
    the probabilities to their hidden); the paper table's router term is 8E instead."""
    from parmem.activations import layer_terms

    spec = ModelSpec.preset("mixtral-8x7b")
    h, f, E, k, s = 4096, 14336, 8, 2, 1024
    moe = {"router top-k indices", "router top-k probabilities", "routing map (transposed)",
           "routing probabilities (transposed)", "sorted token indices", "expert inputs",
           "expert hidden", "permuted probabilities"}
    terms = layer_terms(spec, s, 1, engine="megatron-core")
    got = sum(x.bytes for x in terms if x.name in moe)
    assert got == s * (8 * k + 4 * k + E + 2 * E + 8 * k + 2 * h * k + 3 * 2 * f * k + 2 * k)
    assert "expert outputs" not in {x.name for x in terms}


def test_deepspeed_zero3_step_gradients_are_one_sub_group_of_deepspeeds_default():
    """The deepspeed profile caps ZeRO-3's step-only fp32 gradients at one sub-group; the cap is
    DeepSpeed 0.19.8's own default ``sub_group_size`` (DeepSpeedZeroConfig), read here, and so
    is the reduction bucket (``reduce_bucket_size``)."""
    _deepspeed()
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    cfg = DeepSpeedZeroConfig()
    prof = engine("deepspeed")
    (cat,) = [c for c in prof.states if c.name == "grad_partition" and 3 in c.stages]
    assert cat.phase == "step" and cat.max_elements == int(cfg.sub_group_size)
    assert prof.buffers.reduce_bucket == int(cfg.reduce_bucket_size)


def test_a_profile_without_its_loss_peak_is_refused_by_name():
    """A profile that does not say what its loss holds is not read as the papers' (no
    transient): data/engines.toml must give loss_peak for each profile."""
    from parmem._data import load_toml
    from parmem.engines import _profile

    doc = load_toml("engines.toml")
    table = {k: v for k, v in doc["engines"]["fsdp2"].items() if k != "loss_peak"}
    with pytest.raises(ValueError, match="lacks 'loss_peak'"):
        _profile("fsdp2", table, doc.get("activations", {}))
