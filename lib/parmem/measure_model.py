"""A reader's own model, measured: shrink it to a CPU step, run it, set the bytes beside the estimate.

``parmem measure`` takes a model (a preset or a Transformers ``config.json``) and a data-parallel
layout, shrinks the model so that one training step runs on CPU ranks, runs that step with
Transformers' own layers (:mod:`parmem.distributed.measure_step`) at two depths, and sets the bytes
each rank held beside :func:`parmem.estimate` for exactly the shrunk model that ran. This module
is the library side (no torch import): the shrink rule, the comparison, the depth scaling, and
the readers of a ``torch.cuda.memory._snapshot()`` pickle and of Megatron-LM's and torchtitan's
memory log lines.

* :func:`shrink`: width divided by an integer factor k that keeps head_dim and the ratio of query
  to key/value heads (heads/k, kv_heads/k, hidden/k, every feed-forward width //k), the
  vocabulary cut to :data:`DEFAULT_VOCAB` unless told, depth set to two values (L1 and
  L1 + p, p the model's layer period: 1, or the sliding-window or MoE pattern). The shrunk
  config is read back by :func:`parmem.hfconfig.spec_fields`, so the spec compared is the one
  Transformers built (the worker checks its parameter count).
* :func:`compare`: per rank and category (:data:`CATEGORIES`), measured = estimate + the named
  differences (:data:`parmem.engine_records.DIFFERENCES`, one home with the recorded engine runs), and what is left over, shown rather than hidden.
* :func:`scaling`: each category is affine in depth (a fixed part and a per-layer part), so two
  depths give both; extrapolated to the full model's depth it stands beside the estimate of the
  full-depth shrunk model.
* :func:`read_snapshot`, :func:`read_log`, :func:`beside_estimate`: a reader's GPU numbers
  beside the estimate for the model and layout the reader gives.

Layouts run: DDP with the ``hf`` profile (Transformers Trainer: 16-bit weights, AdamW moments in
the parameters' dtype, ``precision="bf16-mixed"``; or ``"fp32"``), and FSDP2 with the ``fsdp2``
profile (``fully_shard`` per decoder layer and the root, ``MixedPrecisionPolicy(bf16, fp32)``);
the saved tensors are always held against the ``hf`` profile's tables, the layers that ran.
Anything else (tensor, pipeline, context or expert parallelism, recomputation, offload, adapters,
other optimizers) is refused by name (:func:`check_runnable`).
"""

from __future__ import annotations

import math
import pickle
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ._check import MAX_LAYERS, integer
from ._data import load_toml
from .config import ParallelConfig, TrainingSetup
from .engine_records import DIFFERENCES, hf_table_saved_bytes
from .estimate import Estimate, estimate
from .hfconfig import DROPOUT_KEYS, model_type, with_defaults
from .model import ModelSpec, read_config
from .units import GIB

__all__ = [
    "CATEGORIES",
    "DEFAULT_VOCAB",
    "MAX_RANKS",
    "Shrink",
    "Row",
    "Scaling",
    "model_config",
    "preset_config",
    "shrink",
    "check_runnable",
    "run_mode",
    "expected",
    "compare",
    "scaling",
    "report",
    "format_report",
    "step_args",
    "SnapshotReading",
    "LogLine",
    "read_snapshot",
    "read_log",
    "beside_estimate",
]

#: the categories measured per rank, and the estimate's field(s) each is held against
CATEGORIES: dict[str, str] = {
    "params": "params",
    "grads": "grads",
    "optimizer": "optimizer",
    "saved": "activations + logits",
}
#: the vocabulary a shrunk model keeps unless ``vocab`` is given (a CPU step's embedding and
#: fp32 logits stay small)
DEFAULT_VOCAB = 1024
#: the experts a shrunk mixture of experts keeps unless ``experts`` is given (at least top_k)
DEFAULT_EXPERTS = 8
#: the largest hidden size the default width factor aims at
DEFAULT_MAX_HIDDEN = 256
#: CPU ranks a measurement may start on this machine
MAX_RANKS = 8


# ---------------------------------------------------------------------------- the model
#: ModelSpec fields a preset's config must reproduce exactly (all but the labels)
_LABELS = ("name", "source", "family")


def preset_config(spec: ModelSpec) -> dict[str, Any]:
    """A Transformers config dict that builds the preset ``spec``: Llama (dense, rotary,
    RMSNorm, SwiGLU; Qwen2 with Q/K/V biases), Qwen3 (with q/k norms), Mixtral (MoE),
    Qwen3-MoE (MoE with q/k norms) or GPT-2 (learned positions, LayerNorm with biases, GeLU).
    The config is read back (:meth:`ModelSpec.from_hf_config`) and must give every field of
    ``spec`` (labels aside); a preset none of these builds is refused, naming the first field
    that differs: give the model's own config.json then."""
    s = spec
    drop = float(s.dropout or 0.0)
    if s.position == "learned" and s.norm == "layernorm" and s.ffn_kind == "gelu":
        cfg: dict[str, Any] = {
            "model_type": "gpt2",
            "vocab_size": s.vocab_size,
            "n_embd": s.hidden,
            "n_layer": s.layers,
            "n_head": s.heads,
            "n_inner": s.ffn_hidden,
            "n_positions": s.max_positions,
            "tie_word_embeddings": s.tied_embeddings,
            "resid_pdrop": drop,
            "embd_pdrop": drop,
            "attn_pdrop": drop,
        }
    else:
        if s.is_moe:
            mtype = "qwen3_moe" if s.qk_norm else "mixtral"
        else:
            mtype = "qwen3" if s.qk_norm else ("qwen2" if s.qkv_bias else "llama")
        cfg = {
            "model_type": mtype,
            "vocab_size": s.vocab_size,
            "hidden_size": s.hidden,
            "num_hidden_layers": s.layers,
            "num_attention_heads": s.heads,
            "num_key_value_heads": s.kv_heads,
            "head_dim": s.head_dim,
            "intermediate_size": s.ffn_hidden,
            "max_position_embeddings": s.max_positions,
            "tie_word_embeddings": s.tied_embeddings,
            "attention_dropout": drop,
            "rope_theta": s.rope_theta,
        }
        if mtype == "mixtral":
            cfg.update(
                num_local_experts=s.num_experts,
                num_experts_per_tok=s.top_k,
                intermediate_size=s.expert_ffn_hidden,
            )
        elif mtype == "qwen3_moe":
            cfg.update(
                num_experts=s.num_experts,
                num_experts_per_tok=s.top_k,
                moe_intermediate_size=s.expert_ffn_hidden,
                norm_topk_prob=s.norm_topk_prob,
                decoder_sparse_step=1,
                mlp_only_layers=[],
            )
        if mtype in ("qwen2", "qwen3", "qwen3_moe"):
            cfg["use_sliding_window"] = False
    back = ModelSpec.from_hf_config(cfg, name=s.name)
    for f in spec.__dataclass_fields__:
        if f not in _LABELS and getattr(back, f) != getattr(s, f):
            raise ValueError(
                f"preset {s.name!r}: parmem builds a preset as a Llama, Qwen2, Qwen3, Mixtral, "
                f"Qwen3-MoE or GPT-2 config, and as model_type={cfg['model_type']!r} its "
                f"{f} would be {getattr(back, f)!r}, not {getattr(s, f)!r}: give the model's "
                "own config.json instead"
            )
    return cfg


def model_config(spec: ModelSpec, model: str) -> dict[str, Any]:
    """The Transformers config dict of the reader's model: the config.json ``model`` names (a
    path or its folder) when ``spec`` was read from one (``spec.family`` set), else
    :func:`preset_config` of the preset. A multimodal config gives its ``text_config``."""
    if not spec.family:
        return preset_config(spec)
    cfg, _ = read_config(Path(model).expanduser())
    if "text_config" in cfg and model_type(cfg) != spec.family:
        text = dict(cfg["text_config"])
        if cfg.get("tie_word_embeddings") is not None:
            text.setdefault("tie_word_embeddings", cfg["tie_word_embeddings"])
        text["model_type"] = spec.family
        cfg = text
    return cfg


# ---------------------------------------------------------------------------- shrink
#: config keys holding a feed-forward width, divided by the width factor
_FFN_KEYS = ("intermediate_size", "n_inner", "moe_intermediate_size",
             "shared_expert_intermediate_size")  # fmt: skip
#: config keys holding the hidden size and the head counts, per family's names
_HIDDEN_KEYS = ("hidden_size", "n_embd")
_HEAD_KEYS = ("num_attention_heads", "n_head")
_LAYER_KEYS = ("num_hidden_layers", "n_layer")


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def _period(spec: ModelSpec) -> int:
    """The layer period: every ``p`` layers repeat (Gemma's local/global pattern, Qwen-MoE's
    ``decoder_sparse_step``); 1 when all layers are alike. Dense first layers are refused: the
    depth scaling assumes layers that repeat."""
    if spec.first_dense_layers:
        raise ValueError(
            f"first_dense_layers={spec.first_dense_layers}: the first layers differ from the "
            "others, so a two-depth measurement does not scale to the model's depth"
        )
    return math.lcm(spec.global_every or 1, spec.moe_every or 1)


@dataclass(frozen=True)
class Shrink:
    """The shrunk model a CPU step runs: ``config`` (the Transformers config, depth unset: see
    :meth:`config_at`), the reader's ``model``, the ``width_factor`` k, the ``vocab``, the two
    ``depths`` run and the layer ``period``."""

    model: ModelSpec
    config: dict[str, Any] = field(repr=False)
    width_factor: int
    vocab: int
    depths: tuple[int, int]
    period: int

    @property
    def family(self) -> str:
        return self.model.family or str(self.config["model_type"])

    def config_at(self, layers: int) -> dict[str, Any]:
        """The shrunk config with ``layers`` layers (``layer_types`` cut to them, Qwen-MoE's
        ``mlp_only_layers`` kept below them)."""
        integer("layers", layers, 1, MAX_LAYERS)
        cfg = dict(self.config)
        key = "n_layer" if "n_layer" in cfg or self.family == "gpt2" else "num_hidden_layers"
        cfg[key] = layers
        if isinstance(cfg.get("layer_types"), list):
            types = cfg["layer_types"]
            period = len(types) if len(types) < layers else layers
            cfg["layer_types"] = [types[i % period] for i in range(layers)]
        if isinstance(cfg.get("mlp_only_layers"), list):
            cfg["mlp_only_layers"] = [i for i in cfg["mlp_only_layers"] if i < layers]
        return cfg

    def spec_at(self, layers: int) -> ModelSpec:
        """The :class:`~parmem.model.ModelSpec` of :meth:`config_at` (what the worker builds)."""
        name = f"{self.model.name} /{self.width_factor} L{layers}"
        return ModelSpec.from_hf_config(self.config_at(layers), name=name)

    def describe(self) -> str:
        """One line: what the shrink changed."""
        m, s = self.model, self.spec_at(self.depths[0])
        parts = [
            ("width kept" if self.width_factor == 1 else f"width /{self.width_factor}")
            + f" (h {m.hidden} -> {s.hidden}, heads {m.heads} -> "
            f"{s.heads}, kv heads {m.kv_heads} -> {s.kv_heads}, head_dim {s.head_dim}"
        ]
        if m.ffn_hidden != s.ffn_hidden:
            parts[0] += f", f {m.ffn_hidden} -> {s.ffn_hidden}"
        if m.is_moe:
            parts[0] += f", expert f {m.expert_ffn_hidden} -> {s.expert_ffn_hidden}"
        parts[0] += ")"
        if m.num_experts != s.num_experts:
            parts.append(f"experts {m.num_experts} -> {s.num_experts}")
        if m.vocab_size != s.vocab_size:
            parts.append(f"vocab {m.vocab_size} -> {s.vocab_size}")
        parts.append(f"layers {m.layers} -> {self.depths[0]} and {self.depths[1]}")
        return ", ".join(parts)


def _default_factor(spec: ModelSpec, allowed: list[int]) -> int:
    """The smallest allowed factor that brings h to at most :data:`DEFAULT_MAX_HIDDEN`, else the
    largest allowed."""
    for k in allowed:
        if spec.hidden // k <= DEFAULT_MAX_HIDDEN:
            return k
    return allowed[-1]


def shrink(
    config: dict[str, Any],
    *,
    width_factor: int | None = None,
    layers: int | None = None,
    vocab: int | None = None,
    experts: int | None = None,
    dropout: bool | None = None,
    name: str | None = None,
) -> Shrink:
    """Shrink the Transformers ``config`` for a CPU step.

    ``width_factor`` k (default: the smallest that brings the hidden size to at most
    :data:`DEFAULT_MAX_HIDDEN`) must divide the query heads, the key/value heads and the hidden
    size, so head_dim and the GQA ratio stay; every feed-forward width is divided by k (rounded
    down). ``vocab`` (default: the model's, at most :data:`DEFAULT_VOCAB`). ``layers`` is the
    first depth L1 (default 2, or the layer period if larger); the second is L1 + p.
    ``experts`` (a mixture of experts; default: the model's, at most :data:`DEFAULT_EXPERTS`
    or its top-k if larger) keeps top-k. ``dropout=False`` zeroes every dropout key; ``True``
    needs a model with dropout. ``name``: the model's name in the report.
    """
    if not isinstance(config, dict):
        raise ValueError(f"config must be a dict, got {type(config).__name__}")
    label = name or config.get("_name_or_path") or "model"
    full = ModelSpec.from_hf_config(config, name=str(label))
    mtype = full.family
    cfg = with_defaults(dict(config, model_type=mtype), mtype)
    k = _factor(full, width_factor)
    out = _narrow(dict(config, model_type=mtype), cfg, full, k)
    v = min(full.vocab_size, DEFAULT_VOCAB) if vocab is None else integer("vocab", vocab, 1)
    if v > full.vocab_size:
        raise ValueError(f"--vocab {v} is larger than the model's vocabulary ({full.vocab_size})")
    out["vocab_size"] = v
    # token ids past the cut vocabulary (a family's class defaults too: GPT-2's 50256): none
    for key in {"bos_token_id", "eos_token_id", "pad_token_id"} | set(out):
        value = out.get(key)
        if not key.endswith("_token_id"):
            continue
        if isinstance(value, list):
            value = [t for t in value if isinstance(t, int) and 0 <= t < v] or None
        out[key] = value if value is None or isinstance(value, list) or 0 <= value < v else None
    _set_experts(out, cfg, full, experts)
    if dropout is False:
        out.update({key: 0.0 for key in DROPOUT_KEYS if key in cfg})
    elif dropout and not full.has_dropout:
        raise ValueError(f"--dropout: {full.name} has no dropout (its config's dropouts are 0)")
    p = _period(full)
    first = max(2, p) if layers is None else integer("layers", layers, 1, MAX_LAYERS)
    if first % p:
        raise ValueError(f"--layers {first} must be a multiple of the layer period {p}")
    result = Shrink(full, out, k, v, (first, first + p), p)
    _check_kept(result, k)
    return result


def _factor(full: ModelSpec, width_factor: int | None) -> int:
    """The width factor: ``width_factor`` checked, or :func:`_default_factor`."""
    allowed = [k for k in _divisors(math.gcd(full.heads, full.kv_heads)) if full.hidden % k == 0]
    if width_factor is None:
        return _default_factor(full, allowed)
    k = integer("width_factor", width_factor, 1)
    if k not in allowed:
        raise ValueError(
            f"--width-factor {k} must divide the query heads ({full.heads}), the key/value "
            f"heads ({full.kv_heads}) and the hidden size ({full.hidden}), so that head_dim "
            f"and the GQA ratio stay; allowed: {', '.join(map(str, allowed))}"
        )
    return k


def _narrow(out: dict[str, Any], cfg: dict[str, Any], full: ModelSpec, k: int) -> dict[str, Any]:
    """``out`` with the hidden size, the head counts and the feed-forward widths divided by
    ``k`` under the family's key names (``cfg``: the config with the family's defaults), head_dim
    kept, the depth keys removed (:meth:`Shrink.config_at` sets them)."""
    aliases = load_toml("hf_families.toml")[full.family].get("aliases", {})
    for alias, real in aliases.items():  # one name per key (GPT-2: n_embd, not hidden_size)
        if alias in out and real in cfg:
            out[real] = out.pop(alias)
    for key in _HIDDEN_KEYS:
        if key in cfg:
            out[key] = full.hidden // k
    for key in _HEAD_KEYS:
        if key in cfg:
            out[key] = full.heads // k
    if "n_head" not in cfg:
        out["num_key_value_heads"] = full.kv_heads // k
        out["head_dim"] = full.head_dim
    for key in _FFN_KEYS:
        if isinstance(cfg.get(key), int):
            out[key] = max(1, cfg[key] // k)
    for key in _LAYER_KEYS:
        out.pop(key, None)
    return out


def _set_experts(
    out: dict[str, Any], cfg: dict[str, Any], full: ModelSpec, experts: int | None
) -> None:
    """The experts a shrunk mixture of experts keeps (see :func:`shrink`)."""
    if not full.is_moe:
        if experts is not None:
            raise ValueError(f"--experts: {full.name} has no experts")
        return
    if experts is None:
        e = min(full.num_experts, max(DEFAULT_EXPERTS, full.top_k))
    else:
        e = integer("experts", experts, full.top_k, full.num_experts)
    for key in ("num_experts", "num_local_experts"):
        if key in cfg:
            out[key] = e


def _check_kept(sh: Shrink, k: int) -> None:
    """The shrunk config must read back with head_dim kept and the heads divided by ``k``."""
    full, small = sh.model, sh.spec_at(sh.depths[0])
    if small.head_dim != full.head_dim:
        raise ValueError(
            f"model_type={full.family!r}: the shrunk config reads as head_dim {small.head_dim}, "
            f"not {full.head_dim}"
        )
    if small.heads != full.heads // k or small.kv_heads != full.kv_heads // k:
        raise ValueError(
            f"model_type={full.family!r}: the shrunk config reads as {small.heads} heads and "
            f"{small.kv_heads} key/value heads, not {full.heads // k} and {full.kv_heads // k}"
        )


# ---------------------------------------------------------------------------- what runs
#: ParallelConfig / TrainingSetup fields a measurement runs only at their default, and the flag
_ONLY_DEFAULT: tuple[tuple[str, object, str], ...] = (
    ("tp", 1, "--tp"),
    ("pp", 1, "--pp"),
    ("ep", 1, "--ep"),
    ("cp", 1, "--cp"),
    ("sp", False, "--sp"),
    ("vpp", 1, "--vpp"),
)
_SETUP_DEFAULT: tuple[tuple[str, object, str], ...] = (
    ("num_microbatches", 1, "--microbatches"),
    ("recompute", "none", "--recompute"),
    ("optimizer", "adamw", "--optimizer"),
    ("offload", "none", "--offload"),
    ("adapter", "none", "--adapter"),
    ("fp8", "none", "--fp8"),
    ("grad_dtype", None, "--grad-dtype"),
    ("offload_activations", False, "--offload-activations"),
    ("loss_chunks", None, "--loss-chunks"),
)
#: (engine, zero) -> how the step runs, and the precisions it runs
_MODES = {
    ("hf", 0): ("ddp", ("bf16-mixed", "fp32")),
    ("fsdp2", 3): ("fsdp2", ("bf16-mixed",)),
}


def check_runnable(parallel: ParallelConfig, setup: TrainingSetup) -> str:
    """The step mode (``"ddp"`` or ``"fsdp2"``) for this layout, or ``ValueError`` naming the
    flag a CPU measurement cannot run: one step of data parallelism (DDP with ``--engine hf``,
    FSDP2 with ``--engine fsdp2 --zero 3``) of AdamW on ``--dp`` ranks, one micro-batch, no
    recomputation, nothing offloaded, no adapters."""
    for f, default, flag in _ONLY_DEFAULT:
        if getattr(parallel, f) != default:
            raise ValueError(
                f"{flag} {getattr(parallel, f)}: parmem measure runs data parallelism only "
                "(DDP, or FSDP2 with --engine fsdp2 --zero 3)"
            )
    for f, default, flag in _SETUP_DEFAULT:
        if getattr(setup, f) != default:
            raise ValueError(
                f"{flag} {getattr(setup, f)}: parmem measure runs one AdamW step of one "
                "micro-batch without recomputation, offload, adapters or FP8"
            )
    return run_mode(parallel, setup)


def run_mode(parallel: ParallelConfig, setup: TrainingSetup) -> str:
    """``"ddp"`` (``--engine hf``, ZeRO 0) or ``"fsdp2"`` (``--engine fsdp2 --zero 3``)."""
    got = _MODES.get((setup.engine, parallel.zero))
    if got is None:
        raise ValueError(
            f"--engine {setup.engine} --zero {parallel.zero}: parmem measure runs DDP with "
            "--engine hf (--zero 0) or FSDP2 with --engine fsdp2 --zero 3"
        )
    mode, precisions = got
    if setup.precision not in precisions:
        raise ValueError(
            f"--precision {setup.precision}: the {mode} step runs {', '.join(precisions)}"
        )
    if not 1 <= parallel.dp <= MAX_RANKS:
        raise ValueError(f"--dp {parallel.dp}: parmem measure starts 1..{MAX_RANKS} CPU ranks")
    return mode


def _hf_setup(setup: TrainingSetup) -> TrainingSetup:
    """The setup of the ``hf`` profile for the saved tensors (the Transformers layers that ran)."""
    return replace(setup, engine="hf", grad_buckets=None)


def step_args(sh: Shrink, parallel: ParallelConfig, setup: TrainingSetup) -> dict[str, Any]:
    """The worker's keyword arguments (:func:`parmem.distributed.measure_step.step`): the
    configs of the two depths, the step's shapes, the dtype, the attention kernel the profile
    assumes (SDPA when it keeps no s x s scores, else eager), the mode and DDP's buckets."""
    from .layout import layout

    mode = check_runnable(parallel, setup)
    for layers in sh.depths:  # the estimate's own refusals, before any rank starts
        expected(sh.spec_at(layers), parallel, setup, 0)
    lay = layout(sh.spec_at(sh.depths[0]), ParallelConfig(dp=parallel.dp), _hf_setup(setup))
    attn = "sdpa" if lay.flash else "eager"
    if attn == "sdpa" and lay.dropout and _attention_dropout(sh.config) > 0:
        raise ValueError(
            "attention dropout under SDPA on CPU runs PyTorch's fp32 math kernel (no fused CPU "
            "kernel has dropout), which no GPU run does: give --no-flash (eager attention) or "
            "--no-dropout"
        )
    dtype = "fp32" if setup.precision == "fp32" or mode == "fsdp2" else "bf16"
    return {
        "configs": [sh.config_at(n) for n in sh.depths],
        "seq_len": setup.seq_len,
        "micro_batch": setup.micro_batch,
        "dtype": dtype,
        "attn": attn,
        "mode": mode,
        "buckets": lay.setup.buckets if mode == "ddp" else "view",
    }


def _attention_dropout(cfg: dict[str, Any]) -> float:
    return max(float(cfg.get(k) or 0.0) for k in ("attention_dropout", "attn_pdrop"))


# ---------------------------------------------------------------------------- compare
@dataclass(frozen=True)
class Row:
    """One category of one rank: ``measured``, ``estimate``, the ``named`` differences
    ((name, bytes) pairs) and what is left over (:attr:`unexplained`)."""

    category: str
    measured: int
    estimate: int
    named: tuple[tuple[str, int], ...] = ()

    @property
    def named_bytes(self) -> int:
        return sum(n for _, n in self.named)

    @property
    def unexplained(self) -> int:
        """measured - estimate - the named differences: 0 when the estimate and the names say
        everything the run held."""
        return self.measured - self.estimate - self.named_bytes


#: the differences of :data:`parmem.engine_records.DIFFERENCES` a measurement may name
_USED = ("adamw-step-counters", "adamw-fused-step-counters", "shifted-labels-padding",
         "repeat-kv-view", "cpu-kernels")  # fmt: skip


def _est_stage(est: Estimate) -> Any:
    if len(est.stages) != 1:
        raise ValueError("parmem measure compares one pipeline stage")
    return est.stages[0]


def expected(
    spec: ModelSpec, parallel: ParallelConfig, setup: TrainingSetup, param_tensors: int,
    device: str = "cpu",
) -> dict[str, tuple[int, tuple[tuple[str, int], ...]]]:  # fmt: skip
    """Per category: (the estimate for one rank, the named differences a run on ``device``
    adds) for ``spec`` under ``parallel``/``setup`` (model states from ``setup.engine``'s
    profile, saved tensors from the ``hf`` profile). ``param_tensors``: the parameter tensors
    the model has (AdamW's step counters)."""
    st = _est_stage(estimate(spec, parallel, setup))
    hf_par = ParallelConfig(dp=parallel.dp)
    hf = _hf_setup(setup)
    acts = _est_stage(estimate(spec, hf_par, hf))
    rec = {"model": spec.to_dict(), "parallel": {"dp": parallel.dp}, "setup": asdict(hf),
           "device": device}  # fmt: skip
    if hf_table_saved_bytes(rec, "cuda") != acts.activations:  # the tables as estimate sums them
        raise ValueError(
            f"the hf profile's tables sum to {hf_table_saved_bytes(rec, 'cuda'):,} bytes, the "
            f"estimate's activations are {acts.activations:,}: this layout is not one parmem "
            "measure compares"
        )
    names = ["cpu-kernels"] if device == "cpu" else []
    names += ["shifted-labels-padding", "repeat-kv-view"]
    saved_named = tuple(
        (n, b) for n in names if (b := DIFFERENCES[n].bytes(rec)) or n == "cpu-kernels"
    )
    # the CPU run's AdamW keeps its step counters on the host; the GPU path's fused AdamW (the
    # Trainer's adamw_torch_fused) keeps them in device memory
    steps = "adamw-fused-step-counters" if device == "cuda" else "adamw-step-counters"
    return {
        "params": (st.params, ()),
        "grads": (st.grads, ()),
        "optimizer": (st.optimizer, ((steps, 4 * param_tensors),)),
        "saved": (acts.activations + acts.logits, saved_named),
    }


def compare(
    spec: ModelSpec,
    parallel: ParallelConfig,
    setup: TrainingSetup,
    ranks: list[dict[str, Any]],
    device: str = "cpu",
) -> list[list[Row]]:
    """For each rank's measurement (``ranks``: dicts with ``params``, ``grads``,
    ``optimizer``, ``saved`` and ``param_tensors``), one :class:`Row` per category of
    :data:`CATEGORIES`: measured beside the estimate and the named differences."""
    out = []
    for r in ranks:
        exp = expected(spec, parallel, setup, int(r["param_tensors"]), device)
        rows = []
        for c in CATEGORIES:
            named = tuple((k, n) for k, n in exp[c][1] if n)  # a difference of 0 is not one
            rows.append(Row(c, int(r[c]), exp[c][0], named))
        out.append(rows)
    return out


@dataclass(frozen=True)
class Scaling:
    """Each category as fixed + per-layer bytes, from two depths L1 < L2 (``depths``; the
    increment is per ``period`` layers), extrapolated to ``full_layers`` and set beside the
    estimate (plus its named differences) of the full-depth shrunk model."""

    depths: tuple[int, int]
    period: int
    full_layers: int
    per_layer: dict[str, int]
    fixed: dict[str, int]
    profile_per_layer: dict[str, int]
    extrapolated: dict[str, int] | None
    direct: dict[str, tuple[int, int]] | None  # category -> (estimate, named bytes)
    note: str = ""


def scaling(
    sh: Shrink,
    parallel: ParallelConfig,
    setup: TrainingSetup,
    measured: tuple[dict[str, Any], dict[str, Any]],
    device: str = "cpu",
) -> Scaling:
    """Fixed and per-layer bytes of each category from rank 0's measurements at the two depths
    of ``sh`` (``measured``), the profile's own per-layer bytes (estimate plus named
    differences at L2 minus at L1), and the extrapolation to the model's depth beside the
    direct estimate there. Per layer means per ``period`` layers for a patterned model; the
    extrapolation needs the depth to be L1 plus a whole number of periods."""
    (l1, l2), p = sh.depths, sh.period
    m1, m2 = measured
    per = {c: m2[c] - m1[c] for c in CATEGORIES}
    fixed = {c: m1[c] - (l1 // p) * per[c] for c in CATEGORIES}
    t1, t2 = int(m1["param_tensors"]), int(m2["param_tensors"])

    def modelled(layers: int, tensors: int) -> dict[str, tuple[int, int]]:
        exp = expected(sh.spec_at(layers), parallel, setup, tensors, device)
        return {c: (e, sum(n for _, n in named)) for c, (e, named) in exp.items()}

    e1, e2 = modelled(l1, t1), modelled(l2, t2)
    prof = {c: sum(e2[c]) - sum(e1[c]) for c in CATEGORIES}
    full = sh.model.layers
    if (full - l1) % p or full < l1:
        return Scaling(sh.depths, p, full, per, fixed, prof, None, None,
                       f"the depth {full} is not {l1} plus a whole number of periods of {p} "
                       "layers: no extrapolation")  # fmt: skip
    blocks = (full - l1) // p
    extra = {c: m1[c] + blocks * per[c] for c in CATEGORIES}
    direct = modelled(full, t1 + blocks * (t2 - t1))
    return Scaling(sh.depths, p, full, per, fixed, prof, extra, direct)


# ---------------------------------------------------------------------------- the report
def _b(n: int) -> str:
    return f"{n:,}"


def report(
    sh: Shrink,
    parallel: ParallelConfig,
    setup: TrainingSetup,
    results: list[list[dict[str, Any]]],
    device: str = "cpu",
) -> dict[str, Any]:
    """The whole comparison as a plain dict (the ``--json`` output; :func:`format_report`
    prints it): per depth the rows of every rank, whether the ranks agree, the scaling, and
    the estimate of the reader's full model at the layout. ``results``: the worker's return
    value per rank (a list over the depths). Raises ``ValueError`` when a rank refused the run
    or built a model whose parameter count differs from the spec's."""
    mode = run_mode(parallel, setup)
    for per_rank in results:
        for r in per_rank:
            if r.get("refused"):
                raise ValueError(r["refused"])
    depths = []
    for i, layers in enumerate(sh.depths):
        spec = sh.spec_at(layers)
        ranks = [per_rank[i] for per_rank in results]
        for r in ranks:
            if int(r["num_params"]) != spec.num_params():
                raise ValueError(
                    f"Transformers built {int(r['num_params']):,} parameters at {layers} layers, "
                    f"parmem's spec counts {spec.num_params():,}: the spec does not describe "
                    "what ran, nothing is compared"
                )
        rows = compare(spec, parallel, setup, ranks, device)
        depths.append(
            {
                "layers": layers,
                "num_params": spec.num_params(),
                "param_tensors": int(ranks[0]["param_tensors"]),
                "ranks_equal": all(r == rows[0] for r in rows),
                "rows": [[_row_dict(x) for x in rank_rows] for rank_rows in rows],
                "peak": [r.get("peak") for r in ranks],
            }
        )
    sc = scaling(sh, parallel, setup, (results[0][0], results[0][1]), device)
    full_est = _est_stage(estimate(sh.model, parallel, setup))
    return {
        "model": sh.model.name,
        "family": sh.family,
        "shrink": sh.describe(),
        "width_factor": sh.width_factor,
        "vocab": sh.vocab,
        "mode": mode,
        "device": device,
        "world_size": parallel.dp,
        "engine": setup.engine,
        "seq_len": setup.seq_len,
        "micro_batch": setup.micro_batch,
        "precision": setup.precision,
        "depths": depths,
        "scaling": {
            "depths": list(sc.depths),
            "period": sc.period,
            "full_layers": sc.full_layers,
            "per_layer": sc.per_layer,
            "fixed": sc.fixed,
            "profile_per_layer": sc.profile_per_layer,
            "extrapolated": sc.extrapolated,
            "direct": {c: {"estimate": e, "named": n} for c, (e, n) in (sc.direct or {}).items()},
            "note": sc.note,
        },
        "full_model_estimate": {
            "params": full_est.params,
            "grads": full_est.grads,
            "optimizer": full_est.optimizer,
            "saved": full_est.activations + full_est.logits,
            "total": full_est.total,
        },
        "named": {k: {"doc": v.doc, "gpu": v.gpu} for k, v in DIFFERENCES.items() if k in _USED},
    }


def _row_dict(r: Row) -> dict[str, Any]:
    return {
        "category": r.category,
        "measured": r.measured,
        "estimate": r.estimate,
        "named": dict(r.named),
        "unexplained": r.unexplained,
    }


def format_report(rep: dict[str, Any]) -> str:
    """:func:`report` as text: one table per depth (rank 0, and every rank when they differ),
    the depth scaling and the named differences."""
    how = {"ddp": "DDP", "fsdp2": "FSDP2 (fully_shard per decoder layer)"}[rep["mode"]]
    lines = [
        f"{rep['model']} (model_type={rep['family']}) shrunk for a {rep['device'].upper()} step: "
        f"{rep['shrink']}",
        f"one AdamW step, {how} on {rep['world_size']} {rep['device']} ranks, --engine "
        f"{rep['engine']}, {rep['precision']}, s={rep['seq_len']}, b={rep['micro_batch']}; saved "
        "tensors against the hf profile (the Transformers layers that ran); bytes per rank",
    ]
    for d in rep["depths"]:
        shown = [0] if d["ranks_equal"] else range(len(d["rows"]))
        lines.append("")
        lines.append(
            f"{d['layers']} layers ({d['num_params']:,} parameters, {d['param_tensors']} "
            "tensors): " + ("every rank equal" if d["ranks_equal"] else "ranks differ")
        )
        lines.append(f"  {'rank':<5}{'category':<10}{'measured':>13}{'estimate':>13}"
                     f"{'difference':>12}  named")  # fmt: skip
        for i in shown:
            for r in d["rows"][i]:
                diff = r["measured"] - r["estimate"]
                named = ", ".join(f"{k} {v:+,}" for k, v in r["named"].items())
                left = f"; unexplained {r['unexplained']:+,}" if r["unexplained"] else ""
                lines.append(
                    f"  {i:<5}{r['category']:<10}{_b(r['measured']):>13}{_b(r['estimate']):>13}"
                    f"{diff:>+12,}  {named or '-'}{left}"
                )
        if any(p is not None for p in d["peak"]):
            lines.append(f"  peak allocated (torch.cuda.max_memory_allocated): {d['peak']}")
    sc = rep["scaling"]
    l1, l2 = sc["depths"]
    unit = "layer" if sc["period"] == 1 else f"{sc['period']} layers"
    lines += [
        "",
        f"depth scaling (rank 0): per {unit} = M({l2}) - M({l1}); fixed = M({l1}) - "
        f"{l1 // sc['period']} x per {unit}",
        f"  {'category':<10}{'per ' + unit:>14}{'profile':>12}{'fixed':>13}"
        f"{'at ' + str(sc['full_layers']):>15}{'estimate+named':>16}{'difference':>12}",
    ]
    for c in CATEGORIES:
        if sc["extrapolated"] is not None:
            est = sc["direct"][c]["estimate"] + sc["direct"][c]["named"]
            tail = (
                f"{_b(sc['extrapolated'][c]):>15}{_b(est):>16}{sc['extrapolated'][c] - est:>+12,}"
            )
        else:
            tail = ""
        lines.append(
            f"  {c:<10}{_b(sc['per_layer'][c]):>14}{_b(sc['profile_per_layer'][c]):>12}"
            f"{_b(sc['fixed'][c]):>13}{tail}"
        )
    if sc["note"]:
        lines.append(f"  {sc['note']}")
    f = rep["full_model_estimate"]
    lines += [
        "",
        f"the full model at this layout (parmem.estimate, unshrunk, GiB = 2**30 bytes): params "
        f"{f['params'] / GIB:.2f}, grads {f['grads'] / GIB:.2f}, optimizer "
        f"{f['optimizer'] / GIB:.2f}, saved {f['saved'] / GIB:.2f}, total {f['total'] / GIB:.2f}",
        "named differences:",
    ]
    used = {k for d in rep["depths"] for rows in d["rows"] for r in rows for k in r["named"]}
    for k in sorted(used):
        v = rep["named"][k]
        lines.append(f"  {k} ({'also' if v['gpu'] else 'not'} on a GPU): {v['doc']}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- readers
class _PlainUnpickler(pickle.Unpickler):
    """Unpickles plain Python values only: a snapshot is dicts, lists, strings and numbers;
    any class (code a pickle could run) is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise ValueError(
            f"the pickle names {module}.{name}: not a torch.cuda.memory._snapshot() dump "
            "(plain dicts and lists only)"
        )


@dataclass(frozen=True)
class SnapshotReading:
    """A ``torch.cuda.memory._snapshot()`` per device: ``allocated`` (the requested bytes of
    the blocks in state ``active_allocated``), ``allocated_blocks`` (their rounded block sizes,
    what ``torch.cuda.memory_allocated`` counts), ``reserved`` (the segments' ``total_size``)
    and ``peak`` (the largest requested bytes allocated over the recorded trace, ``None`` when
    no trace was recorded; ``trace_events`` events)."""

    device: int
    allocated: int
    allocated_blocks: int
    reserved: int
    peak: int | None
    trace_events: int


def read_snapshot(blob: bytes) -> list[SnapshotReading]:
    """Read the bytes of a pickled ``torch.cuda.memory._snapshot()`` (``_dump_snapshot``).

    Structure (torch/cuda/memory.py ``_snapshot``): ``segments``, each with ``device``,
    ``total_size`` and ``blocks`` (``size``, ``requested_size``, ``state``); and
    ``device_traces``, one list of trace entries per device when
    ``torch.cuda.memory._record_memory_history()`` ran (``action``, ``size``). The peak walks
    the trace backwards from the snapshot's state: before an ``alloc`` the allocated bytes were
    lower by its size, before a ``free_requested`` higher; the caching allocator decreases its
    allocated bytes at the free request and records the block's requested size there
    (c10/cuda/CUDACachingAllocator.cpp, ``DeviceCachingAllocator::free``), so every number here
    is in requested bytes."""
    import io

    try:
        data = _PlainUnpickler(io.BytesIO(blob)).load()
    except ValueError:
        raise
    except Exception as e:
        raise ValueError(f"not a pickle: {type(e).__name__}: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("segments"), list):
        raise ValueError("not a torch.cuda.memory._snapshot() dump: no 'segments' list")
    try:
        out = _snapshot_devices(data)
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise ValueError(
            f"not a torch.cuda.memory._snapshot() dump: {type(e).__name__} {e}"
        ) from None
    if not out:
        raise ValueError("the snapshot holds no segments and no trace")
    return out


def _snapshot_devices(data: dict[str, Any]) -> list[SnapshotReading]:
    per: dict[int, list[int]] = {}
    for seg in data["segments"]:
        acc = per.setdefault(int(seg.get("device", 0)), [0, 0, 0])
        acc[2] += int(seg["total_size"])
        for b in seg["blocks"]:
            if b["state"] == "active_allocated":
                acc[0] += int(b.get("requested_size", b["size"]))
                acc[1] += int(b["size"])
    traces = data.get("device_traces") or []
    out = []
    for dev in sorted(set(per) | {i for i, t in enumerate(traces) if t}):
        alloc, blocks, reserved = per.get(dev, [0, 0, 0])
        trace = traces[dev] if dev < len(traces) else []
        out.append(
            SnapshotReading(dev, alloc, blocks, reserved, _trace_peak(alloc, trace), len(trace))
        )
    return out


def _trace_peak(now: int, trace: list[dict[str, Any]]) -> int | None:
    """The most bytes allocated over ``trace``, walking back from ``now`` (see
    :func:`read_snapshot`); ``None`` without a trace."""
    if not trace:
        return None
    peak = now
    for e in reversed(trace):
        if e["action"] == "alloc":
            now -= int(e["size"])
        elif e["action"] == "free_requested":
            now += int(e["size"])
        peak = max(peak, now)
    return peak


@dataclass(frozen=True)
class LogLine:
    """One memory line of a training log, in bytes: ``engine`` (``"megatron"``, ``"torchtitan"``),
    ``rank`` (Megatron; ``None`` for torchtitan, which logs rank 0's device), ``step`` (the
    iteration or step; ``None`` for torchtitan's line after the model is built), and whatever the
    line gives of ``allocated``, ``max_allocated``, ``reserved`` and ``max_reserved``."""

    engine: str
    rank: int | None
    step: int | None
    allocated: int | None = None
    max_allocated: int | None = None
    reserved: int | None = None
    max_reserved: int | None = None


_MIB, _NUM = 2**20, r"([0-9]+(?:\.[0-9]*)?)"
# Megatron-LM megatron/training/utils.py report_memory: "[Rank {r}] " + name + " memory (MB)"
# + " | allocated: {:.2f} | max allocated: ... | reserved: ... | max reserved: ..." (MB = 2**20
# bytes), name = "(after {iteration} iterations)" (megatron/training/training.py training_log)
_MEGATRON = re.compile(
    rf"\[Rank (\d+)\] \(after (\d+) iterations\) memory \(MB\) \| allocated: {_NUM} \| "
    rf"max allocated: {_NUM} \| reserved: {_NUM}(?: \| max reserved: {_NUM})?"
)
# torchtitan 0.3.0 components/metrics.py MetricsProcessor.log: "step: {step:2}  loss: ...
# memory: {max_reserved_gib:5.2f}GiB({max_reserved_pct:.2f}%)" (torch.cuda.memory_stats
# "reserved_bytes.all.peak", GiB = 2**30); trainer.py after the model is built:
# "CUDA memory usage for model: {max_reserved_gib:.2f}GiB({pct:.2f}%)"
_TITAN_STEP = re.compile(rf"step:\s*(\d+)\s.*?memory:\s*{_NUM}GiB\(")
_TITAN_MODEL = re.compile(rf"memory usage for model: {_NUM}GiB\(")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _mib(text: str | None) -> int | None:
    return None if text is None else int(round(float(text) * _MIB))


def read_log(text: str) -> list[LogLine]:
    """Every memory line of a Megatron-LM or torchtitan training log (other lines are skipped;
    terminal colours are removed first). ``ValueError`` when there is none."""
    out = []
    for line in _ANSI.sub("", text).splitlines():
        m = _MEGATRON.search(line)
        if m:
            r, it, a, ma, res, mres = m.groups()
            out.append(LogLine("megatron", int(r), int(it), _mib(a), _mib(ma), _mib(res),
                               _mib(mres)))  # fmt: skip
            continue
        m = _TITAN_STEP.search(line)
        if m:
            out.append(LogLine("torchtitan", None, int(m[1]),
                               max_reserved=int(round(float(m[2]) * GIB))))  # fmt: skip
            continue
        m = _TITAN_MODEL.search(line)
        if m:
            out.append(
                LogLine("torchtitan", None, None, max_reserved=int(round(float(m[1]) * GIB)))
            )
    if not out:
        raise ValueError(
            "no memory line found: expected Megatron-LM's '[Rank R] (after N iterations) memory "
            "(MB) | allocated: ...' or torchtitan's 'step: N ... memory: X.XXGiB(Y.YY%)'"
        )
    return out


def _stage_of_rank(rank: int, parallel: ParallelConfig) -> int:
    """The pipeline stage of global ``rank`` under Megatron-Core's default rank order
    ``"tp-cp-ep-dp-pp"`` (megatron/core/parallel_state.py initialize_model_parallel): the
    pipeline rank varies slowest, so stage = rank // (t·cp·d)."""
    return rank // (parallel.tp * parallel.cp * parallel.dp) % parallel.pp


def beside_estimate(
    est: Estimate, readings: list[LogLine] | list[SnapshotReading], bounds_: Any = None
) -> list[dict[str, Any]]:
    """Each reading beside the estimate of its rank's stage: ``what`` (the reading's number),
    ``reading``, ``parmem`` and the parmem quantity it is set beside, in bytes.

    * allocated between steps (Megatron's ``allocated`` after an iteration; a snapshot's
      allocated) beside the model states (params + grads + optimizer);
    * the peak (Megatron's ``max allocated``; a snapshot's trace peak) beside the stage's
      total without the CUDA context (``max_memory_allocated`` does not count it);
    * reserved (Megatron's ``max reserved``, torchtitan's ``memory``, a snapshot's segments)
      beside the expected reserved of :func:`parmem.bounds.bounds` when ``bounds_`` (its
      result) is given, else beside the peak (reserved is at least the allocated peak).
    """
    rows: list[dict[str, Any]] = []

    def add(who: str, stage: int, what: str, value: int | None, kind: str) -> None:
        if value is None:
            return
        st = est.stages[stage]
        peak = st.total - st.cuda_context
        if kind == "states":
            ref, label = st.params + st.grads + st.optimizer, "model states"
        elif kind == "peak":
            ref, label = peak, "peak (no CUDA context)"
        elif bounds_ is not None:
            sb = bounds_.stages[stage] if hasattr(bounds_, "stages") else bounds_
            ref, label = sb.reserved, "expected reserved (bounds)"
        else:
            ref, label = peak, "peak (no CUDA context)"
        rows.append({"who": who, "stage": stage, "what": what, "reading": value,
                     "parmem": ref, "beside": label, "difference": value - ref})  # fmt: skip

    for r in readings:
        if isinstance(r, SnapshotReading):
            who = f"snapshot device {r.device}"
            add(who, 0, "allocated", r.allocated, "states")
            add(who, 0, "peak (trace)", r.peak, "peak")
            add(who, 0, "reserved", r.reserved, "reserved")
        elif r.engine == "megatron":
            stage = _stage_of_rank(r.rank or 0, est.parallel)
            who = f"rank {r.rank} after {r.step} iterations"
            add(who, stage, "allocated", r.allocated, "states")
            add(who, stage, "max allocated", r.max_allocated, "peak")
            add(who, stage, "max reserved", r.max_reserved or r.reserved, "reserved")
        else:
            who = "model built" if r.step is None else f"step {r.step}"
            add(who, 0, "max reserved", r.max_reserved, "reserved")
    return rows
