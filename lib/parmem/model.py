"""Model shapes and exact parameter counts.

:class:`ModelSpec` holds the shapes that decide memory: vocabulary ``V``, hidden size ``h``,
layers ``L``, attention heads ``a`` (and key/value heads for GQA/MQA), the feed-forward size and
kind, biases, norms, embeddings and the mixture-of-experts fields. Parameter counts are computed
from the shapes, component by component, so they are exact (checked against published totals in
``tests/test_model.py``).

Sources: Vaswani et al. 2017 (Transformer), Radford et al. 2019 (GPT-2: learned positions,
LayerNorm with bias, tied embeddings), Touvron et al. 2023 (Llama 2: RMSNorm, SwiGLU, rotary, GQA
for 70B), Jiang et al. 2024 (Mixtral: 8 experts, top-2, router without bias).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from os import PathLike
from pathlib import Path
from typing import Any

from ._check import MAX_LAYERS, MAX_WIDTH, boolean, choice, integer, number
from ._data import load_toml
from .sharding import layer_tensors, param_counts

__all__ = ["ModelSpec", "presets"]

FFN_KINDS = ("gelu", "swiglu")
NORM_KINDS = ("layernorm", "rmsnorm")
POSITION_KINDS = ("learned", "rotary")


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
    head before the rotary embedding (Qwen3); it changes what a layer keeps for backward (the
    engine profiles' ``qk_norm`` entries), not the parameter count here.

    ``kv_heads``, ``head_dim``, ``ffn_hidden`` and ``expert_ffn_hidden`` may be left at 0 (or
    ``None``) to take their usual values: ``heads``, h/a, 4h and ``ffn_hidden``.

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

    def __post_init__(self) -> None:
        for f in ("name", "source"):
            if not isinstance(getattr(self, f), str):
                raise ValueError(f"{f}={getattr(self, f)!r:.60} must be a string")
        for f in ("vocab_size", "hidden", "heads", "max_positions"):
            integer(f, getattr(self, f), 1, MAX_WIDTH)
        integer("layers", self.layers, 1, MAX_LAYERS)
        self._derive_widths()
        if self.heads % self.kv_heads:
            raise ValueError(f"kv_heads={self.kv_heads} must divide heads={self.heads}")
        choice("ffn_kind", self.ffn_kind, FFN_KINDS)
        choice("norm", self.norm, NORM_KINDS)
        choice("position", self.position, POSITION_KINDS)
        for f in ("bias", "qkv_bias", "tied_embeddings", "qk_norm"):
            boolean(f, getattr(self, f))
        if self.dropout is not None:
            number("dropout", self.dropout, 0.0, 1.0, hi_open=True)
        self._check_experts()

    def _derive_widths(self) -> None:
        """Fill in the widths left at 0 (or None): kv_heads = a, head_dim = h/a, f = 4h."""
        for f in ("kv_heads", "head_dim", "ffn_hidden", "expert_ffn_hidden"):
            if getattr(self, f) is None:  # the 0.1 API's "derive it"
                object.__setattr__(self, f, 0)
            integer(f, getattr(self, f), 0, MAX_WIDTH)  # 0: derive it (not False, not 0.0)
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
            integer(f, getattr(self, f), 1, MAX_WIDTH)

    def _check_experts(self) -> None:
        integer("num_experts", self.num_experts, 0, MAX_WIDTH)
        integer("top_k", self.top_k, 0, MAX_WIDTH)
        integer("shared_experts", self.shared_experts, 0, MAX_WIDTH)
        if self.num_experts:
            if not 1 <= self.top_k <= self.num_experts:
                raise ValueError(
                    f"top_k={self.top_k} must be between 1 and num_experts={self.num_experts}"
                )
            if not self.expert_ffn_hidden:
                object.__setattr__(self, "expert_ffn_hidden", self.ffn_hidden)
            integer("expert_ffn_hidden", self.expert_ffn_hidden, 1, MAX_WIDTH)
        elif self.top_k or self.shared_experts:
            raise ValueError("top_k and shared_experts need num_experts >= 1")

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

        Understands the Llama, Mistral, Mixtral, Qwen2, Qwen2-MoE and GPT-2 families (and any
        config using the Llama key names). No network access: only the file is read.
        """
        if name is not None and not isinstance(name, str):
            raise ValueError(f"name={name!r:.60} must be a string or None")
        if isinstance(config, dict):
            cfg, default = config, "hf-model"
        elif isinstance(config, str | PathLike):
            cfg, path = _read_config(Path(config))
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
        return cls(**_from_hf(cfg), name=name or label or default)

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
    def q_dim(self) -> int:
        """Width of the query projection, a · head_dim."""
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of each of the key and value projections, kv_heads · head_dim."""
        return self.kv_heads * self.head_dim

    def layer_param_counts(self) -> dict[str, int]:
        """Parameters of one transformer layer by component (:func:`parmem.sharding.param_counts`
        without the embedding, LM head and final norm, divided by L)."""
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

    def num_params(self, active: bool = False) -> int:
        """Total parameters Ψ. With ``active=True`` only the ``top_k`` routed experts (plus the
        shared ones) of each MoE layer are counted: the parameters one token touches."""
        counts = param_counts(self)
        if active and self.is_moe:
            counts["experts"] = counts["experts"] // self.num_experts * self.top_k
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


def _read_config(path: Path) -> tuple[dict[str, Any], Path]:
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


def _key(key: str) -> str:
    """How a message names a config.json key: ``config['hidden_size']``."""
    return f"config[{key!r}]"


def _need(cfg: dict[str, Any], *keys: str, maximum: int = MAX_WIDTH) -> int:
    """The first of ``keys`` that is set (not null), as an integer >= 1."""
    for k in keys:
        if cfg.get(k) is not None:
            return integer(_key(k), cfg[k], 1, maximum)
    raise ValueError(f"config: missing {keys[0]!r} (model_type={cfg.get('model_type')!r:.40})")


#: Hugging Face config keys that hold a dropout probability (GPT-2: resid/embd/attn_pdrop; Llama,
#: Mistral, Mixtral, Qwen: attention_dropout; others: hidden_dropout …).
_HF_DROPOUT_KEYS = (
    "attention_dropout",
    "hidden_dropout",
    "resid_pdrop",
    "embd_pdrop",
    "attn_pdrop",
    "dropout",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
)


def _hf_dropout(cfg: dict[str, Any], default: float) -> float:
    """The largest dropout probability a config states; ``default`` (the family's Hugging Face
    default: 0.1 for GPT-2, 0.0 for the Llama key names) when it states none."""
    found = [number(_key(k), cfg[k], 0.0, 1.0) for k in _HF_DROPOUT_KEYS if cfg.get(k) is not None]
    return max(found) if found else default


def _opt(cfg: dict[str, Any], key: str) -> int:
    """``key`` as an integer >= 0, 0 when it is missing or null (0: "take the usual value")."""
    value = cfg.get(key)
    return 0 if value is None else integer(_key(key), value, 0, MAX_WIDTH)


def _flag(cfg: dict[str, Any], key: str, default: bool) -> bool:
    """``key`` as a JSON boolean (``"false"`` is refused, not read as true); ``default`` when it
    is missing or null."""
    value = cfg.get(key)
    return default if value is None else boolean(_key(key), value)


def _from_hf(cfg: dict[str, Any]) -> dict[str, Any]:
    """Map a Hugging Face config dict onto ModelSpec fields, each value checked under its key."""
    mtype = cfg.get("model_type", "")
    if not isinstance(mtype, str):
        raise ValueError(f"{_key('model_type')} must be a string, got {type(mtype).__name__}")
    mtype = mtype.lower()
    if mtype == "gpt2" or "n_embd" in cfg:
        h = _need(cfg, "n_embd")
        return dict(
            vocab_size=_need(cfg, "vocab_size"),
            hidden=h,
            layers=_need(cfg, "n_layer", maximum=MAX_LAYERS),
            heads=_need(cfg, "n_head"),
            ffn_hidden=_opt(cfg, "n_inner") or 4 * h,
            ffn_kind="gelu",
            bias=True,
            norm="layernorm",
            tied_embeddings=_flag(cfg, "tie_word_embeddings", True),
            position="learned",
            max_positions=_need(cfg, "n_positions", "n_ctx"),
            dropout=_hf_dropout(cfg, 0.1),
            source=f"Hugging Face config.json (model_type={mtype or 'gpt2'})",
        )
    h = _need(cfg, "hidden_size")
    heads = _need(cfg, "num_attention_heads")
    attention_bias = _flag(cfg, "attention_bias", False)
    out = dict(
        vocab_size=_need(cfg, "vocab_size"),
        hidden=h,
        layers=_need(cfg, "num_hidden_layers", maximum=MAX_LAYERS),
        heads=heads,
        kv_heads=_opt(cfg, "num_key_value_heads") or heads,
        head_dim=_opt(cfg, "head_dim"),
        ffn_hidden=_need(cfg, "intermediate_size"),
        ffn_kind="swiglu",
        bias=_flag(cfg, "mlp_bias", False) and attention_bias,
        qkv_bias=mtype.startswith("qwen2") or attention_bias,
        norm="rmsnorm",
        qk_norm=mtype.startswith("qwen3"),  # Qwen3Attention's q_norm and k_norm (RMSNorm per head)
        tied_embeddings=_flag(cfg, "tie_word_embeddings", False),
        position="rotary",
        max_positions=_opt(cfg, "max_position_embeddings") or 2048,
        dropout=_hf_dropout(cfg, 0.0),
        source=f"Hugging Face config.json (model_type={mtype or 'unknown'})",
    )
    out.update(_hf_experts(cfg))
    return {k: v for k, v in out.items() if k in _SPEC_FIELDS}


def _hf_experts(cfg: dict[str, Any]) -> dict[str, int]:
    """The mixture-of-experts fields of a Mixtral / Qwen2-MoE config (none for a dense one)."""
    experts = _opt(cfg, "num_local_experts") or _opt(cfg, "num_experts")
    if not experts:
        return {}
    width = _opt(cfg, "moe_intermediate_size") or _need(cfg, "intermediate_size")
    out = dict(
        num_experts=experts, top_k=_need(cfg, "num_experts_per_tok"), expert_ffn_hidden=width
    )
    shared = _opt(cfg, "shared_expert_intermediate_size")
    if shared:
        # Qwen2-MoE: one shared expert of its own width; counted as shared_experts of
        # expert width, so we only support the case where it is a multiple of that width.
        if shared % width:
            raise ValueError(
                "config: shared_expert_intermediate_size must be a multiple of "
                "moe_intermediate_size for parmem's shared-expert model"
            )
        out["shared_experts"] = shared // width
    return out
