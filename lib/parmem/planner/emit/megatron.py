"""A planned layout as a Megatron-LM launch: ``torchrun pretrain_gpt.py`` with every flag the
layout needs, and the environment Megatron-LM's ``validate_args`` requires.

Targets Megatron-LM at commit :data:`MEGATRON_LM_COMMIT` (``scripts/record_megatron_args.py``
records that commit's argument parser and validation rules, which the tests check every recipe
against). What it writes, and why:

* ZeRO-1 is ``--use-distributed-optimizer``; ZeRO-2/3 are Megatron-FSDP
  (``--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads`` / ``optim_grads_params``),
  which ``validate_args`` accepts only with ``--ckpt-format fsdp_dtensor`` and with
  ``CUDA_DEVICE_MAX_CONNECTIONS`` unset (or above 1).
* Tensor or context parallelism without FSDP needs ``CUDA_DEVICE_MAX_CONNECTIONS=1`` (before
  Blackwell: the rule is skipped on compute capability 10 and later, where setting it is harmless).
* An uneven pipeline split is ``--pipeline-model-parallel-layout`` (``E`` embedding, ``t`` a
  transformer layer, ``L`` the loss; stages separated by ``|``, virtual stages in rank order);
  an even split with interleaving is ``--num-layers-per-virtual-pipeline-stage``.
* Full recomputation is ``--recompute-granularity full --recompute-method uniform
  --recompute-num-layers 1`` (every layer keeps only its input), selective is
  ``--recompute-granularity selective`` (the attention core, Korthikanti et al. 2022 §5).
* Data are ``--mock-data`` with the ``NullTokenizer`` of the model's vocabulary: replace them
  with ``--data-path`` and your tokenizer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .recipe import Recipe, torchrun

if TYPE_CHECKING:
    from ...config import ParallelConfig, TrainingSetup
    from ...model import ModelSpec
    from ..result import Candidate, Plan

__all__ = [
    "MEGATRON_LM_COMMIT",
    "TARGET",
    "megatron",
    "model_args",
    "pipeline_layout",
    "unexpressed",
]

#: The Megatron-LM commit the recipes are written for (github.com/NVIDIA/Megatron-LM, 2026-08-22).
MEGATRON_LM_COMMIT = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"
#: What :func:`megatron` recipes name as their target.
TARGET = f"Megatron-LM commit {MEGATRON_LM_COMMIT[:10]} (2026-08-22), pretrain_gpt.py"


#: ModelSpec features the recipe does not write at :data:`MEGATRON_LM_COMMIT`, each with what it
#: is (the spec's field, then why). A recipe without them would train another model, so it is
#: refused. Some of them Megatron-LM has flags for whose meaning the recipe does not map or
#: check (``--window-size``/``--window-attn-skip-freq``, ``--softmax-type learnable``,
#: ``--moe-shared-expert-intermediate-size``, ``--moe-layer-freq``, ``--mtp-num-layers``); the
#: others have no flag in the recorded argument parser
#: (``tests/fixtures/megatron_lm_args.json``).
_UNEXPRESSED = (
    (
        "parallel_block",
        "attention and MLP in parallel on the layer input (GPT-J, Falcon, Cohere, Phi)",
    ),
    ("sandwich_norm", "norms after attention and after the MLP too (Gemma 2/3)"),
    ("embedding_norm", "a norm after the embedding (BLOOM)"),
    ("lm_head_bias", "a bias on the output layer"),
    ("attn_softcap", "soft-capped attention logits (Gemma 2)"),
    ("logit_softcap", "soft-capped output logits (Gemma 2)"),
    ("sliding_window", "sliding-window or chunked layers between global ones (not mapped)"),
    ("attention_sinks", "attention sinks (gpt-oss; not mapped to --softmax-type)"),
    ("shared_experts", "shared experts (not mapped)"),
    ("first_dense_layers", "dense layers before the MoE layers (not mapped)"),
    ("router_bias", "a router with a learned bias (not mapped)"),
    ("mtp_layers", "multi-token prediction modules (not mapped)"),
)


def unexpressed(spec: ModelSpec) -> list[str]:
    """What of ``spec`` the Megatron-LM recipe does not express, each as ``"field: why"`` (empty
    when :func:`model_args` writes the whole model): a recipe for such a model would train
    another one, so :func:`model_args` refuses it."""
    out = [f"{f}: {why}" for f, why in _UNEXPRESSED if getattr(spec, f, 0)]
    if getattr(spec, "norm_position", "pre") != "pre":
        out.append(
            f"norm_position={spec.norm_position!r}: norms after attention and the MLP (OLMo 2)"
        )
    if spec.position not in ("rotary", "learned"):
        out.append(f"position={spec.position!r}: the recipe writes learned or rotary positions")
    if not getattr(spec, "norm_weight", True) or (
        spec.norm == "layernorm" and not getattr(spec, "norm_bias", True)
    ):
        out.append("norm_weight/norm_bias: norms without a weight or a bias")
    if not spec.bias and (getattr(spec, "attn_bias", False) or getattr(spec, "mlp_bias", False)):
        out.append(
            "attn_bias/mlp_bias: biases on some linear layers only (Megatron-LM has all or none)"
        )
    if spec.qk_norm and getattr(spec, "qk_norm_shape", "head") != "head":
        out.append(f"qk_norm_shape={spec.qk_norm_shape!r}: --qk-layernorm normalises each head")
    if spec.is_moe and spec.moe_every != 1:
        out.append(f"moe_every={spec.moe_every}: MoE layers between dense ones")
    return out


def _mla_args(spec: ModelSpec) -> list[str]:
    """Multi-latent attention (DeepSeek-V2 §2.1) as megatron/training/arguments.py names it."""
    if not spec.kv_lora_rank:
        return []
    args = ["--multi-latent-attention"]
    if spec.q_lora_rank:
        args += ["--q-lora-rank", str(spec.q_lora_rank)]
    return args + [
        "--kv-lora-rank", str(spec.kv_lora_rank),
        "--qk-head-dim", str(spec.head_dim - spec.qk_rope_head_dim),
        "--qk-pos-emb-head-dim", str(spec.qk_rope_head_dim),
        "--v-head-dim", str(spec.v_head_dim),
    ]  # fmt: skip


def model_args(spec: ModelSpec, seq_len: int) -> list[str]:
    """The model's shape as Megatron-LM arguments (GPT-style decoder, ``pretrain_gpt.py``): GQA,
    SwiGLU, RMSNorm, rotary positions, untied embeddings, biases, per-head q/k norms
    (``--qk-layernorm``), multi-latent attention and the experts. A model with a feature
    Megatron-LM cannot build (:func:`unexpressed`) raises ``ValueError`` naming it."""
    missing = unexpressed(spec)
    if missing:
        raise ValueError(
            f"a Megatron-LM recipe cannot express {spec.name!r}: " + "; ".join(missing)
        )
    args = [
        "--num-layers", str(spec.layers),
        "--hidden-size", str(spec.hidden),
        "--num-attention-heads", str(spec.heads),
        "--ffn-hidden-size", str(spec.ffn_hidden),
        "--seq-length", str(seq_len),
        "--max-position-embeddings", str(max(seq_len, spec.max_positions)),
    ]  # fmt: skip
    if spec.kv_heads != spec.heads:
        args += ["--group-query-attention", "--num-query-groups", str(spec.kv_heads)]
    if spec.head_dim * spec.heads != spec.hidden:
        args += ["--kv-channels", str(spec.head_dim)]
    if spec.ffn_kind == "swiglu":
        args.append("--swiglu")
    if spec.norm == "rmsnorm":
        args += ["--normalization", "RMSNorm"]
    if spec.position == "rotary":
        args += ["--position-embedding-type", "rope", "--rotary-base", f"{spec.rope_theta:.0f}"]
    if not spec.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if not spec.bias:
        args.append("--disable-bias-linear")
    if spec.qkv_bias:
        args.append("--add-qkv-bias")
    if spec.qk_norm:
        args.append("--qk-layernorm")
    args += _mla_args(spec)
    if spec.is_moe:
        args += [
            "--num-experts", str(spec.num_experts),
            "--moe-router-topk", str(spec.top_k),
            "--moe-ffn-hidden-size", str(spec.expert_ffn_hidden),
            "--moe-token-dispatcher-type", "alltoall",
        ]  # fmt: skip
    return args


def pipeline_layout(lps: tuple[int, ...], v: int) -> str:
    """``--pipeline-model-parallel-layout`` of a split ``lps`` (layers per pipeline rank) with
    ``v`` virtual stages per rank: rank ``i``'s layers in ``v`` equal chunks, chunk ``j`` of
    every rank before chunk ``j + 1`` of any; the embedding before the first layer, the loss
    after the last."""
    p = len(lps)
    stages = []
    for j in range(v):
        for i, n in enumerate(lps):
            k = n // v
            text = "E" if (i, j) == (0, 0) else ""
            text += f"t*{k}" if k > 1 else "t" * k
            if (i, j) == (p - 1, v - 1):
                text += ",L" if text else "L"
            stages.append(text)
    return "|".join(stages)


def _parallel(par: ParallelConfig, lps: tuple[int, ...], layers: int) -> list[str]:
    args = [
        "--tensor-model-parallel-size", str(par.tp),
        "--pipeline-model-parallel-size", str(par.pp),
    ]  # fmt: skip
    if par.cp > 1:
        args += ["--context-parallel-size", str(par.cp)]
    if par.ep > 1:
        args += ["--expert-model-parallel-size", str(par.ep)]
    if par.sp:
        args.append("--sequence-parallel")
    if len(set(lps)) > 1:
        args += ["--pipeline-model-parallel-layout", pipeline_layout(lps, par.vpp)]
    elif par.vpp > 1:
        args += ["--num-layers-per-virtual-pipeline-stage", str(layers // (par.pp * par.vpp))]
    return args


def _zero(par: ParallelConfig) -> list[str]:
    if par.zero == 0:
        args = []
    elif par.zero == 1:
        args = ["--use-distributed-optimizer"]
    else:  # Megatron-FSDP: optim_grads = ZeRO-2, optim_grads_params = ZeRO-3
        strategy = "optim_grads" if par.zero == 2 else "optim_grads_params"
        args = [
            "--use-megatron-fsdp",
            "--data-parallel-sharding-strategy", strategy,
            "--ckpt-format", "fsdp_dtensor",
            "--use-distributed-optimizer",
        ]  # fmt: skip
    if par.dp_group > 1:
        args.append("--overlap-grad-reduce")
        if par.zero >= 1:
            args.append("--overlap-param-gather")
    return args


def _recompute(recompute: str) -> list[str]:
    if recompute == "full":
        return [
            "--recompute-granularity", "full",
            "--recompute-method", "uniform",
            "--recompute-num-layers", "1",
        ]  # fmt: skip
    if recompute == "selective":
        return ["--recompute-granularity", "selective"]
    return []


def _training(st: TrainingSetup, global_batch: int, spec: ModelSpec) -> tuple[list[str], list[str]]:
    """Batch, precision, optimizer, attention and data arguments, and notes on them."""
    notes = []
    args = [
        "--micro-batch-size", str(st.micro_batch),
        "--global-batch-size", str(global_batch),
    ]  # fmt: skip
    args += {"bf16-mixed": ["--bf16"], "fp16-mixed": ["--fp16"], "bf16": ["--bf16"]}.get(
        st.precision, []
    )
    if st.precision == "bf16":
        notes.append(
            "Megatron-LM keeps fp32 main weights with --bf16: pure bf16 (no master copy) is "
            "not a flag; the recipe trains bf16-mixed"
        )
    # the profile admits only what --optimizer offers (engines.toml: optimizers)
    optimizer = {"sgd-momentum": "sgd", "sgd": "sgd", "lion": "lion"}.get(st.optimizer, "adam")
    args += ["--optimizer", optimizer]
    if st.optimizer == "sgd":
        args += ["--sgd-momentum", "0.0"]  # no momentum buffer: the "sgd" preset's 0 states
    if st.optimizer == "adamw-bf16":
        # Megatron-Core's precision-aware optimizer keeps the moments in bf16
        # (megatron/core/optimizer/optimizer_config.py: exp_avg_dtype, exp_avg_sq_dtype)
        args += ["--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16",
                 "--exp-avg-sq-dtype", "bf16"]  # fmt: skip
    args += ["--attention-backend", "flash" if st.flash else "unfused"]
    if not st.dropout_for(spec):
        args += ["--attention-dropout", "0.0", "--hidden-dropout", "0.0"]
    args += [
        "--mock-data",
        "--tokenizer-type", "NullTokenizer",
        "--vocab-size", str(spec.vocab_size),
        "--train-iters", "1000",
        "--lr", "1.0e-4",
    ]  # fmt: skip
    return args, notes


def env(par: ParallelConfig) -> tuple[tuple[str, str | None], ...]:
    """The environment ``validate_args`` requires: ``CUDA_DEVICE_MAX_CONNECTIONS`` unset with
    Megatron-FSDP, 1 with tensor or context parallelism otherwise."""
    if par.zero >= 2:
        return (("CUDA_DEVICE_MAX_CONNECTIONS", None),)
    if par.tp > 1 or par.cp > 1:
        return (("CUDA_DEVICE_MAX_CONNECTIONS", "1"),)
    return ()


def megatron(plan: Plan, c: Candidate) -> Recipe:
    """A Megatron-LM launch recipe for candidate ``c`` of ``plan``."""
    par, st, spec = c.parallel, c.setup, plan.spec
    notes = []
    if spec.is_moe and st.capacity_factor != 1.0:
        notes.append(
            f"capacity_factor={st.capacity_factor} of the plan: add --moe-expert-capacity-factor"
        )
    args = model_args(spec, plan.seq_len)
    args += _parallel(par, c.layers_per_stage, spec.layers)
    args += _zero(par)
    args += _recompute(st.recompute)
    if st.tp_comm_overlap and par.tp > 1:
        # the plan's time hides every TP collective (TrainingSetup.tp_comm_overlap)
        args.append("--tp-comm-overlap")
        notes.append("--tp-comm-overlap runs on Transformer Engine's userbuffers: TE must be "
                     "built with them")  # fmt: skip
    training, more = _training(st, plan.global_batch, spec)
    notes += more
    notes.append("replace --mock-data and the NullTokenizer with --data-path and your tokenizer")
    return Recipe(
        engine="megatron",
        target=TARGET,
        title=f"parmem plan: {spec.name} on {plan.cluster}: {c.label()}",
        launcher=torchrun(plan.cluster),
        program=("pretrain_gpt.py",),
        args=tuple(args + training),
        env=env(par),
        notes=tuple(notes),
    )
