"""Model shapes and exact parameter counts.

:class:`ModelSpec` holds the shapes that decide memory: vocabulary ``V``, hidden size ``h``,
layers ``L``, attention heads ``a`` (and key/value heads for GQA/MQA), the feed-forward size and
kind, biases, norms, embeddings and the mixture-of-experts fields. Parameter counts are computed
from the shapes, component by component, so they are exact (checked against published totals in
``tests/test_model.py``, and against Transformers' own models in ``tests/test_table.py`` and
``tests/test_hfconfig.py``).

Sources: Vaswani et al. 2017 (Transformer), Radford et al. 2019 (GPT-2: learned positions,
LayerNorm with bias, tied embeddings), Touvron et al. 2023 (Llama 2: RMSNorm, SwiGLU, rotary, GQA
for 70B), Jiang et al. 2024 (Mixtral: 8 experts, top-2, router without bias), DeepSeek-AI 2024
(DeepSeek-V2 §2.1: multi-head latent attention; DeepSeek-V3 §2: fine-grained and shared experts,
dense first layers, multi-token prediction), Gemma Team 2025 (Gemma 3: local and global layers,
q/k norms), OpenAI 2025 (gpt-oss: attention sinks, alternating windows), Meta 2025 (Llama 4:
interleaved MoE layers, chunked attention). Reading ``config.json``: :mod:`parmem.hfconfig`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from os import PathLike
from pathlib import Path
from typing import Any

from ._check import MAX_LAYERS, MAX_WIDTH, boolean, choice, integer, number
from ._data import load_toml
from .hfconfig import spec_fields
from .sharding import layer_tensors, param_counts

__all__ = ["ModelSpec", "presets"]

FFN_KINDS = ("gelu", "swiglu")
NORM_KINDS = ("layernorm", "rmsnorm")
POSITION_KINDS = ("learned", "rotary", "alibi")
NORM_POSITIONS = ("pre", "post")
QK_NORM_SHAPES = ("head", "heads", "full")


@dataclass(frozen=True)
class ModelSpec:
    """The shapes of a decoder-only transformer.

    Attributes follow the book's notation: ``vocab_size`` = V, ``hidden`` = h, ``layers`` = L,
    ``heads`` = a. ``kv_heads`` < ``heads`` is grouped-query attention (``kv_heads == 1`` is
    multi-query). ``ffn_kind="gelu"`` is the two-matrix MLP (h→f→h); ``"swiglu"`` the gated
    three-matrix MLP of Llama (gate, up, down). ``bias`` puts biases on every linear layer (GPT-2);
    ``qkv_bias`` on the Q/K/V projections only (Qwen2). ``num_experts > 0`` makes every layer's MLP a
    mixture of experts of size ``expert_ffn_hidden`` with ``top_k`` routing, a bias-free router, and
    ``shared_experts`` always-active experts. ``qk_norm`` puts an RMSNorm on each query and key
    head before the rotary embedding (Qwen3, Gemma 3): two weights of head_dim per layer, shared
    by the heads, and what a layer keeps for backward (the engine profiles' ``qk_norm`` entries).

    ``kv_heads``, ``head_dim``, ``ffn_hidden`` and ``expert_ffn_hidden`` may be left at 0 (or
    ``None``) to take their usual values: ``heads``, h/a, 4h and ``ffn_hidden``.

    Multi-head latent attention (MLA, DeepSeek-AI 2024, DeepSeek-V2 §2.1) is on when
    ``kv_lora_rank > 0``: queries go through a ``q_lora_rank`` bottleneck (0: a plain query
    projection, DeepSeek-V2-Lite), keys and values are up-projected from one shared latent of
    ``kv_lora_rank`` values plus a decoupled rotary key of ``qk_rope_head_dim``; ``head_dim`` is
    then the query/key head width (``qk_nope_head_dim + qk_rope_head_dim``) and ``v_head_dim``
    the value head width. ``sliding_window > 0`` makes layers local (each token attends to the
    last ``sliding_window`` tokens; Beltagy et al. 2020, Gemma 2, gpt-oss, and Llama 4's chunked
    layers, whose cache is bounded by the chunk the same way); with ``global_every = n`` every
    n-th layer (layer i with (i+1) % n == 0) is a full-attention layer, as Transformers' Gemma 2/3
    and gpt-oss configs build ``layer_types``. ``attention_sinks``: one learned logit per head
    per layer (gpt-oss). ``sandwich_norm``: an RMSNorm after attention and after the MLP too,
    four per layer (Gemma 2/3). ``first_dense_layers`` and ``moe_every``: layer i is an MoE layer
    when i >= first_dense_layers and (i+1) % moe_every == 0 (DeepSeek-V3's
    ``first_k_dense_replace``, Llama 4's ``interleave_moe_layer_step``, Qwen-MoE's
    ``decoder_sparse_step``); the other layers are dense MLPs of ``ffn_hidden``.
    ``shared_expert_gate``: Qwen2-MoE's sigmoid gate (h → 1) on the shared expert.
    ``router_bias``: the router has a bias (gpt-oss). ``mtp_layers``: DeepSeek-V3's
    multi-token-prediction modules (§2.2), kept on the last pipeline stage; Transformers does not
    build them, so :meth:`num_params` leaves them out unless ``mtp=True``.

    The other decoder families (issue 28; Transformers 5.23's modeling_*.py of each):
    ``parallel_block``: attention and MLP both read the layer input and add to the residual
    together, y = x + attn(n1(x)) + mlp(n2(x)) (GPT-J, Phi-1/2, Cohere, Falcon
    ``parallel_attn``, GPT-NeoX ``use_parallel_residual``); ``norms_per_layer`` = 1: one norm
    feeds both (n1 = n2; 0 derives 2, or 4 with ``sandwich_norm``). ``norm_position="post"``:
    the two norms act on the attention and MLP outputs before the residual add, none on the input
    (OLMo 2/3, EXAONE 4). ``norm_weight=False``: a LayerNorm without parameters (OLMo);
    ``norm_bias=False``: a LayerNorm without bias (Cohere, MPT; RMSNorm never has one).
    ``qk_norm_shape`` (with ``qk_norm``): ``"head"`` one weight of head_dim shared by the heads,
    ``"heads"`` one weight per head (Cohere's (heads, head_dim) LayerNorm), ``"full"`` one
    RMSNorm over all heads · head_dim (OLMo 2/3). ``attn_bias``: biases on Q, K, V and the
    output projection (Llama's ``attention_bias``, GPT-NeoX, Phi-MoE); ``mlp_bias``: on the
    dense MLP's linears (GPT-J, GPT-NeoX, Llama's ``mlp_bias``); ``lm_head_bias`` (Phi, GPT-J);
    ``embedding_norm``: a LayerNorm after the token embedding (BLOOM). ``position="alibi"``:
    ALiBi's head-wise bias on the scores (MPT, BLOOM, Falcon ``alibi``), no parameters.
    ``attn_softcap`` / ``logit_softcap``: Gemma 2's tanh soft-capping of the attention scores
    and of the logits (0: off); ``norm_topk_prob``: the router renormalises its top-k
    probabilities (Qwen-MoE's key; Mixtral-style routers do). None of these three has
    parameters; the activation tables read them. ``rope_theta``: the rotary base (config.json's
    ``rope_theta``, 10,000 unless the model says otherwise: 500,000 for Llama 3); no memory
    depends on it, but a launch recipe must pass it (Megatron-LM's ``--rotary-base``).

    ``family``: the Transformers ``model_type`` the spec was read from by
    :meth:`from_hf_config` (the text model's type for a multimodal config: ``"gemma3_text"``,
    ``"llama4_text"``); ``""`` for presets and specs built by hand.

    ``dropout`` is the model's own dropout probability (the largest of its attention, residual
    and embedding dropouts): 0.1 for GPT-2 and GPT-3, 0.0 for Llama, Mistral, Mixtral and Qwen.
    ``None`` (a spec built by hand without it) keeps the papers' assumption, dropout on
    (:attr:`has_dropout`). A :class:`~parmem.config.TrainingSetup` follows it by default.
    """

    name: str
    vocab_size: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int = 0
    head_dim: int = 0
    ffn_hidden: int = 0
    ffn_kind: str = "gelu"
    bias: bool = False
    qkv_bias: bool = False
    norm: str = "layernorm"
    tied_embeddings: bool = False
    position: str = "rotary"
    max_positions: int = 2048
    num_experts: int = 0
    top_k: int = 0
    expert_ffn_hidden: int = 0
    shared_experts: int = 0
    qk_norm: bool = False
    dropout: float | None = None
    source: str = ""
    # ---- the 2025-26 architectures (DeepSeek-V3, Qwen3, Gemma 2/3, gpt-oss, Llama 4)
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    sliding_window: int = 0
    global_every: int = 0
    attention_sinks: bool = False
    sandwich_norm: bool = False
    first_dense_layers: int = 0
    moe_every: int = 1
    shared_expert_gate: bool = False
    router_bias: bool = False
    mtp_layers: int = 0
    # ---- which Transformers architecture the spec was read from (issue 28)
    family: str = ""
    # ---- the older and other decoder families of Transformers (issue 28)
    parallel_block: bool = False
    norms_per_layer: int = 0
    norm_position: str = "pre"
    norm_weight: bool = True
    norm_bias: bool = True
    qk_norm_shape: str = "head"
    attn_bias: bool = False
    mlp_bias: bool = False
    lm_head_bias: bool = False
    embedding_norm: bool = False
    # ---- config values the activation tables read (no parameters)
    attn_softcap: float = 0.0
    logit_softcap: float = 0.0
    norm_topk_prob: bool = True
    rope_theta: float = 10000.0

    def __post_init__(self) -> None:
        # Every field is stored as checked: an ``int`` (not the NumPy integer given, whose
        # arithmetic wraps and which hashes like the equal int in the caches), a ``float``, a
        # ``str``. The checks read the stored values, so they see Python numbers too.
        for f in ("name", "source", "family"):
            if not isinstance(getattr(self, f), str):
                raise ValueError(f"{f}={getattr(self, f)!r:.60} must be a string")
            self._store(f, str.__str__(getattr(self, f)))
        for f in ("vocab_size", "hidden", "heads", "max_positions"):
            self._int(f, 1, MAX_WIDTH)
        self._int("layers", 1, MAX_LAYERS)
        self._derive_widths()
        if self.heads % self.kv_heads:
            raise ValueError(f"kv_heads={self.kv_heads} must divide heads={self.heads}")
        for f, kinds in (
            ("ffn_kind", FFN_KINDS),
            ("norm", NORM_KINDS),
            ("position", POSITION_KINDS),
        ):
            self._store(f, kinds[kinds.index(choice(f, getattr(self, f), kinds))])  # the str
        for f in ("bias", "qkv_bias", "tied_embeddings", "qk_norm", "attention_sinks"):
            boolean(f, getattr(self, f))
        for f in ("sandwich_norm", "shared_expert_gate", "router_bias"):
            boolean(f, getattr(self, f))
        if self.dropout is not None:
            self._store("dropout", number("dropout", self.dropout, 0.0, 1.0, hi_open=True))
        self._check_experts()
        self._check_attention()
        self._int("mtp_layers", 0, MAX_LAYERS)
        self._check_block()

    def _int(self, f: str, minimum: int, maximum: int) -> int:
        """Check field ``f`` with :func:`~parmem._check.integer` and store the ``int`` it gives."""
        return self._store(f, integer(f, getattr(self, f), minimum, maximum))

    def _store(self, f: str, value: Any) -> Any:
        """Store ``value`` (a checked, normalised value) in field ``f`` of this frozen spec."""
        object.__setattr__(self, f, value)
        return value

    def _check_attention(self) -> None:
        """MLA's widths and the sliding-window pattern (see the class docstring)."""
        for f in ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "v_head_dim"):
            self._int(f, 0, MAX_WIDTH)
        if self.kv_lora_rank:
            if self.kv_heads != self.heads:
                raise ValueError(
                    f"kv_heads={self.kv_heads} must equal heads={self.heads} with MLA "
                    "(kv_lora_rank > 0): every head gets its own up-projected key and value"
                )
            if not 1 <= self.qk_rope_head_dim < self.head_dim:
                raise ValueError(
                    f"qk_rope_head_dim={self.qk_rope_head_dim} must be in 1..head_dim-1 "
                    f"(head_dim={self.head_dim} = qk_nope_head_dim + qk_rope_head_dim) with MLA"
                )
            self._int("v_head_dim", 1, MAX_WIDTH)
        elif self.q_lora_rank or self.qk_rope_head_dim or self.v_head_dim:
            raise ValueError("q_lora_rank, qk_rope_head_dim and v_head_dim need kv_lora_rank >= 1")
        self._int("sliding_window", 0, MAX_WIDTH)
        self._int("global_every", 0, self.layers)
        if self.global_every and not self.sliding_window:
            raise ValueError(f"global_every={self.global_every} needs sliding_window >= 1")

    def _check_block(self) -> None:
        """The layer-block fields of the other families (see the class docstring)."""
        for f in ("parallel_block", "norm_weight", "norm_bias", "attn_bias", "mlp_bias"):
            boolean(f, getattr(self, f))
        for f in ("lm_head_bias", "embedding_norm", "norm_topk_prob"):
            boolean(f, getattr(self, f))
        for f, kinds in (("norm_position", NORM_POSITIONS), ("qk_norm_shape", QK_NORM_SHAPES)):
            self._store(f, kinds[kinds.index(choice(f, getattr(self, f), kinds))])
        for f in ("attn_softcap", "logit_softcap"):
            self._store(f, number(f, getattr(self, f), 0.0, 1e6))
        self._store("rope_theta", number("rope_theta", self.rope_theta, 1.0, 1e12))
        self._check_norm_count()
        if self.sandwich_norm and (self.parallel_block or self.norm_position != "pre"):
            raise ValueError(
                "sandwich_norm=True needs parallel_block=False and norm_position='pre'"
            )
        if self.parallel_block and self.norm_position != "pre":
            raise ValueError("parallel_block=True needs norm_position='pre'")
        if self.kv_lora_rank and (self.attn_bias or self.qk_norm):
            raise ValueError("attn_bias and qk_norm are not modelled with MLA (kv_lora_rank > 0)")

    def _check_norm_count(self) -> None:
        """``norms_per_layer``: 0 (derive it: :attr:`layer_norm_count`), the derived count, or 1
        with a parallel block."""
        n = self._int("norms_per_layer", 0, 4)
        derived = 4 if self.sandwich_norm else 2
        if n == 1 and not self.parallel_block:
            raise ValueError("norms_per_layer=1 needs parallel_block=True (one norm feeds both)")
        if n not in (0, 1, derived):
            raise ValueError(
                f"norms_per_layer={n} must be 0 (derive it), {derived} or 1 (with parallel_block)"
            )

    @property
    def layer_norm_count(self) -> int:
        """Norms in one layer: ``norms_per_layer``, or 2 (4 with ``sandwich_norm``) when it is 0."""
        return self.norms_per_layer or (4 if self.sandwich_norm else 2)

    def _derive_widths(self) -> None:
        """Fill in the widths left at 0 (or None): kv_heads = a, head_dim = h/a, f = 4h."""
        for f in ("kv_heads", "head_dim", "ffn_hidden", "expert_ffn_hidden"):
            if getattr(self, f) is None:  # the 0.1 API's "derive it"
                object.__setattr__(self, f, 0)
            self._int(f, 0, MAX_WIDTH)  # 0: derive it (not False, not 0.0)
        if not self.kv_heads:
            object.__setattr__(self, "kv_heads", self.heads)
        if not self.head_dim:
            if self.hidden % self.heads:
                raise ValueError(
                    f"heads={self.heads} must divide hidden={self.hidden} (or give head_dim)"
                )
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        if not self.ffn_hidden:
            object.__setattr__(self, "ffn_hidden", 4 * self.hidden)
        for f in ("kv_heads", "head_dim", "ffn_hidden"):
            self._int(f, 1, MAX_WIDTH)

    def _check_experts(self) -> None:
        for f in ("num_experts", "top_k", "shared_experts"):
            self._int(f, 0, MAX_WIDTH)
        if self.num_experts:
            if not 1 <= self.top_k <= self.num_experts:
                raise ValueError(
                    f"top_k={self.top_k} must be between 1 and num_experts={self.num_experts}"
                )
            if not self.expert_ffn_hidden:
                object.__setattr__(self, "expert_ffn_hidden", self.ffn_hidden)
            self._int("expert_ffn_hidden", 1, MAX_WIDTH)
        elif self.top_k or self.shared_experts or self.router_bias:
            raise ValueError("top_k, shared_experts and router_bias need num_experts >= 1")
        self._int("moe_every", 1, self.layers)
        self._int("first_dense_layers", 0, self.layers - 1)
        if not self.num_experts and (self.moe_every != 1 or self.first_dense_layers):
            raise ValueError("first_dense_layers and moe_every need num_experts >= 1")
        if self.num_experts and not self.num_moe_layers:
            raise ValueError(
                f"first_dense_layers={self.first_dense_layers} and moe_every={self.moe_every} "
                f"leave no MoE layer among layers={self.layers}"
            )
        if self.shared_expert_gate and not self.shared_experts:
            raise ValueError("shared_expert_gate needs shared_experts >= 1")

    # ------------------------------------------------------------------ constructors
    @classmethod
    def preset(cls, name: str) -> ModelSpec:
        """A named preset from ``data/models.toml`` (see :func:`presets`)."""
        table = load_toml("models.toml")
        if not isinstance(name, str):
            raise ValueError(f"name={name!r:.60} must be a preset name (a string); see presets()")
        key = name.lower()
        if key not in table:
            raise ValueError(f"unknown model preset {name!r}; known: {', '.join(sorted(table))}")
        return cls(name=key, **table[key])

    @classmethod
    def from_hf_config(cls, config: str | PathLike | dict, name: str | None = None) -> ModelSpec:
        """Read a Hugging Face ``config.json`` (a path, a directory holding one, or a dict).

        Understands the Llama, Mistral, Mixtral, Qwen2, Qwen2-MoE, Qwen3, Qwen3-MoE, DeepSeek-V2/V3,
        Gemma 2/3, gpt-oss, Llama 4 and GPT-2 families (and any config using the Llama key names;
        :func:`parmem.hfconfig.spec_fields`). A feature parmem does not model raises
        ``ValueError`` naming the key. No network access: only the file is read.
        """
        if name is not None and not isinstance(name, str):
            raise ValueError(f"name={name!r:.60} must be a string or None")
        if isinstance(config, dict):
            cfg, default = config, "hf-model"
        elif isinstance(config, str | PathLike):
            cfg, path = read_config(Path(config))
            default = path.parent.name or "hf-model"
        else:
            raise ValueError(
                "config must be a path to a config.json, its folder or a dict, "
                f"got {type(config).__name__}"
            )
        label = cfg.get("_name_or_path")
        if label is not None and not isinstance(label, str):
            raise ValueError(
                f"config['_name_or_path'] must be a string, got {type(label).__name__}"
            )
        fields_ = {k: v for k, v in spec_fields(cfg).items() if k in _SPEC_FIELDS}
        return cls(**fields_, name=name or label or default)

    def with_(self, **changes) -> ModelSpec:
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)

    def to_dict(self) -> dict:
        return asdict(self)

    # ------------------------------------------------------------------ derived shapes
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def has_dropout(self) -> bool:
        """Whether training keeps dropout masks: ``dropout > 0``, or ``dropout`` not given (the
        papers' GPT layers, Korthikanti et al. 2022, have dropout)."""
        return self.dropout is None or self.dropout > 0

    @property
    def attention(self) -> str:
        """``"mla"`` (multi-head latent attention) or ``"gqa"`` (MHA, GQA and MQA)."""
        return "mla" if self.kv_lora_rank else "gqa"

    def is_moe_layer(self, i: int) -> bool:
        """Whether layer ``i`` (0-based) has experts: i >= first_dense_layers and
        (i+1) % moe_every == 0 (Transformers' DeepseekV3DecoderLayer, Llama4TextDecoderLayer,
        Qwen2MoeDecoderLayer)."""
        return (
            self.num_experts > 0 and i >= self.first_dense_layers and (i + 1) % self.moe_every == 0
        )

    def is_local_layer(self, i: int) -> bool:
        """Whether layer ``i`` attends within ``sliding_window`` only (every layer but each
        ``global_every``-th when a window is set)."""
        if not self.sliding_window:
            return False
        return not (self.global_every and (i + 1) % self.global_every == 0)

    @property
    def num_moe_layers(self) -> int:
        """Layers with experts (:meth:`is_moe_layer`)."""
        return sum(self.is_moe_layer(i) for i in range(self.layers))

    @property
    def num_local_layers(self) -> int:
        """Sliding-window (local) layers (:meth:`is_local_layer`)."""
        return sum(self.is_local_layer(i) for i in range(self.layers))

    @property
    def o_dim(self) -> int:
        """Width of the attention output (the output projection's input): a · v_head_dim with
        MLA, a · head_dim otherwise."""
        return self.heads * (self.v_head_dim or self.head_dim)

    @property
    def q_dim(self) -> int:
        """Width of the query projection, a · head_dim."""
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of each of the key and value projections, kv_heads · head_dim."""
        return self.kv_heads * self.head_dim

    def layer_param_counts(self) -> dict[str, int]:
        """Parameters of one transformer layer by component (:func:`parmem.sharding.param_counts`
        without the embedding, LM head and final norm, divided by L); an MoE layer for a model
        with experts (its dense layers: :func:`parmem.table.layer_tensors` with
        ``moe=False``)."""
        out = dict.fromkeys(("attention", "norms"), 0)
        for x in layer_tensors(self):
            out[x.component] = out.get(x.component, 0) + x.numel
        return out

    def param_counts(self) -> dict[str, int]:
        """Parameters of the whole model by component (all layers summed).

        Keys: ``embedding``, ``positions``, ``attention``, ``mlp`` (dense) or ``experts`` /
        ``shared_experts`` / ``router`` (MoE), ``norms`` (every layer's two norms and the final
        norm), ``lm_head`` (0 when tied to the embedding). From the one parameter table,
        :mod:`parmem.sharding`.
        """
        return param_counts(self)

    def num_params(self, active: bool = False, mtp: bool = False) -> int:
        """Total parameters Ψ. With ``active=True`` only the ``top_k`` routed experts (plus the
        shared ones) of each MoE layer are counted: the parameters one token touches. The
        multi-token-prediction modules (``mtp_layers``) count only with ``mtp=True``: Transformers
        does not build them and DeepSeek-V3's 671B leaves them out (DeepSeek-AI 2024, V3 §2.2; the
        Hugging Face card lists 671B main weights and 14B MTP weights)."""
        counts = param_counts(self)
        if not mtp:
            counts.pop("mtp", None)
            counts.pop("mtp_experts", None)
        if active and self.is_moe:
            counts["experts"] = counts["experts"] // self.num_experts * self.top_k
            if "mtp_experts" in counts:
                counts["mtp_experts"] = counts["mtp_experts"] // self.num_experts * self.top_k
        return sum(counts.values())

    def __str__(self) -> str:
        kind = f"MoE {self.num_experts}x top-{self.top_k}" if self.is_moe else "dense"
        return (
            f"{self.name}: {self.num_params() / 1e9:.2f}B params ({kind}), L={self.layers}, "
            f"h={self.hidden}, a={self.heads}, kv={self.kv_heads}, V={self.vocab_size}"
        )


def presets() -> list[str]:
    """Names accepted by :meth:`ModelSpec.preset`."""
    return sorted(load_toml("models.toml"))


_SPEC_FIELDS = {f.name for f in fields(ModelSpec)}


#: the largest config.json read (real ones are a few KiB)
MAX_CONFIG_BYTES = 2**24


def read_config(path: Path) -> tuple[dict[str, Any], Path]:
    """The JSON object in ``path`` (or ``path/config.json``) and the file read; every failure is
    a ``ValueError`` naming the file."""
    try:
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise ValueError(f"config: no such file {str(path)!r}")
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise ValueError(f"config: {path} is larger than {MAX_CONFIG_BYTES} bytes")
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"config: {path} is not UTF-8 text") from None
    except OSError as e:  # permission denied, a name too long, ...
        raise ValueError(f"config: cannot read {str(path)!r}: {e.strerror or e}") from None
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"config: {path} is not valid JSON ({e.msg} at line {e.lineno})") from None
    except RecursionError:
        raise ValueError(f"config: {path} is nested too deeply to be a config.json") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"config: {path} must hold a JSON object")
    return cfg, path
