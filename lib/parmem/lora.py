"""LoRA's trainable parameters, as PEFT 0.21.2 builds them on a Transformers 5.23 model.

LoRA (Hu et al. 2021) freezes a weight W (out × in) and trains A (r × in) and B (out × r): r·(in
+ out) values per adapted weight. Which weights PEFT adapts depends on the family's modules, so
every count here follows one Transformers family (``ModelSpec.family``, the config.json's
``model_type``) module by module; the sources, all read from the installed packages:

- ``peft/tuners/lora/layer.py``, ``LoraLayer.update_layer`` (lora.Linear, also on GPT-2's
  ``Conv1D``): ``lora_A = nn.Linear(in, r, bias=False)``, ``lora_B = nn.Linear(r, out,
  bias=False)`` (``lora_bias`` off, PEFT's default);
- same file, ``ParamWrapper`` (``target_parameters``): a 3-D experts parameter (E, out, in) gets
  ``lora_A = nn.Linear(in, r·E)`` and ``lora_B = nn.Linear(r·E, out)``, r·E·(in + out) values;
  a 2-D router weight (E, h) gets r·(h + E);
- ``peft/tuners/tuners_utils.py``, ``_maybe_include_all_linear_layers``: ``"all-linear"`` is
  every ``nn.Linear`` and ``Conv1D`` but the output layer (``get_output_embeddings()``), so the
  embeddings and the LM head are never adapted; ``check_target_module_exists``: a listed name
  matches a module whose full name is it or ends with ``"." + name``;
- ``peft/utils/transformers_weight_conversion.py``, ``_convert_peft_config_moe`` (the v4 → v5
  remap, for model types whose ``_MODEL_TO_CONVERSION_PATTERN`` is ``mixtral`` or
  ``qwen2_moe``: here mixtral, qwen3_moe, deepseek_v2, deepseek_v3): the v4 names of the experts
  and the router (Mixtral's ``w1 w3 w2 gate``, the others' ``gate_proj up_proj down_proj
  gate``) become ``target_parameters`` on ``experts.gate_up_proj``, ``experts.down_proj`` and
  ``gate.weight``, with rank 2r (``rank_pattern``) on the fused ``gate_up_proj``. ``"all-linear"``
  first becomes the *leaf* names of the linear modules plus those v4 names
  (``_resolve_string_target_modules``); so on these families the remap also takes
  ``gate_proj``/``up_proj``/``down_proj`` away from the dense MLPs and shared experts, which are
  then not adapted (DeepSeek's first dense layers and shared experts, Qwen3-MoE's
  ``mlp_only_layers``). Qwen2-MoE (model type ``qwen2_moe`` has no pattern of its own), Phi-MoE,
  Granite-MoE, gpt-oss and Llama 4 have no remap: their 3-D experts are not ``nn.Linear`` and
  ``"all-linear"`` leaves them frozen (their ``nn.Linear`` routers, shared experts and dense MLPs
  are adapted).

The module names and widths of each family are Transformers 5.23's ``modeling_*.py``;
``tests/test_lora_counts.py`` checks every family against ``PeftModel.
get_nb_trainable_parameters()`` of the model built on the meta device.

Refused by name (ValueError): a spec without a family (a hand-made spec; the published presets
are read as their family), a multimodal config read through its ``text_config`` (PEFT on the
multimodal model adapts its vision tower too), Qwen2-MoE without a shared expert (Transformers
still builds zero-width linears), targeting the embeddings or the LM head, names the family does
not have, and half of a fused pair (PEFT refuses it too). Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._check import MAX_WIDTH, choice, instance, integer, normalised_cache
from .model import ModelSpec, presets

__all__ = ["TARGETS", "LoraModule", "lora_modules", "lora_params", "lora_layer_params"]

#: the ``targets`` presets: PEFT's ``"all-linear"``; the attention projections (q, k, v, o as
#: the family names them, fused or not; all of MLA's); PEFT's classic ``q_proj, v_proj``
TARGETS = ("all-linear", "attention", "qv")

#: the published presets, as the Transformers family they were written from (a preset changed
#: with ``with_`` is no longer one and needs its ``family``)
PRESET_FAMILY = {
    "gpt2": "gpt2",
    "gpt2-medium": "gpt2",
    "gpt2-large": "gpt2",
    "gpt2-xl": "gpt2",
    "llama-2-7b": "llama",
    "llama-2-13b": "llama",
    "llama-2-70b": "llama",
    "llama-3-8b": "llama",
    "llama-3-70b": "llama",
    "mistral-7b": "mistral",
    "mixtral-8x7b": "mixtral",
    "qwen3-32b": "qwen3",
    "qwen3-235b-a22b": "qwen3_moe",
    "deepseek-v3": "deepseek_v3",
    "gemma-3-27b": "gemma3_text",
    "gpt-oss-120b": "gpt_oss",
    "llama-4-scout": "llama4_text",
    "llama-4-maverick": "llama4_text",
}

#: names outside the decoder layers (embeddings, LM head): refused, not modelled
OUTSIDE = ("lm_head", "embed_tokens", "wte", "wpe", "word_embeddings", "embed_in", "embed_out")

#: PEFT's v4 -> v5 remap (``_MOE_TARGET_MODULE_MAPPING``, ``_MOE_FUSED_TARGETS``), in its order
_MIXTRAL = {"gate": "gate.weight", "w1": "gate_up_proj", "w3": "gate_up_proj", "w2": "down_proj"}
_QWEN2 = {
    "gate": "gate.weight",
    "gate_proj": "gate_up_proj",
    "up_proj": "gate_up_proj",
    "down_proj": "down_proj",
}
_REMAP: dict[str, tuple[dict[str, str], tuple[str, ...]]] = {
    "mixtral": (_MIXTRAL, ("w1", "w3")),
    "qwen3_moe": (_QWEN2, ("gate_proj", "up_proj")),
    "deepseek_v2": (_QWEN2, ("gate_proj", "up_proj")),
    "deepseek_v3": (_QWEN2, ("gate_proj", "up_proj")),
}

_LLAMA_LAYOUT = (
    "llama", "mistral", "ministral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "olmo",
    "olmo2", "olmo3", "cohere", "cohere2", "granite", "exaone4", "smollm3",
)  # fmt: skip
_MOE = ("mixtral", "qwen3_moe", "deepseek_v2", "deepseek_v3", "qwen2_moe", "phimoe",
        "granitemoe", "gpt_oss", "llama4_text")  # fmt: skip
_DENSE = _LLAMA_LAYOUT + (
    "glm", "glm4", "phi3", "phi", "starcoder2", "gptj", "gpt_neox", "bloom", "falcon", "mpt",
    "gpt2", "gpt_bigcode",
)  # fmt: skip
#: every family modelled (all of :func:`parmem.hfconfig.families` but the multimodal wrappers)
FAMILIES = _DENSE + _MOE


@dataclass(frozen=True)
class LoraModule:
    """One adapted weight of a decoder layer, as PEFT shapes its adapter.

    ``name``: the module (``self_attn.q_proj``) or, for PEFT's ``ParamWrapper``, the parameter
    (``mlp.experts.gate_up_proj``, ``mlp.gate.weight``) inside the layer, as Transformers names
    it. ``in_features`` × ``out_features``: one copy's weight; ``copies``: the experts of a 3-D
    parameter (1 otherwise); ``rank_factor``: 2 on a fused ``gate_up_proj`` whose two v4 halves
    were targeted (PEFT's ``rank_pattern``); ``layers``: ``"all"``, or the ``"dense"`` or
    ``"moe"`` layers of a model with experts; ``wrapper``: PEFT's LoRA layer, ``"Linear"``
    (``nn.Linear`` and GPT-2's ``Conv1D``) or ``"ParamWrapper"``.
    """

    name: str
    in_features: int
    out_features: int
    copies: int = 1
    rank_factor: int = 1
    layers: str = "all"
    wrapper: str = "Linear"

    def a_shape(self, rank: int) -> tuple[int, int]:
        """``lora_A.weight``: (r · rank_factor · copies) × in."""
        return (rank * self.rank_factor * self.copies, self.in_features)

    def b_shape(self, rank: int) -> tuple[int, int]:
        """``lora_B.weight``: out × (r · rank_factor · copies)."""
        return (self.out_features, rank * self.rank_factor * self.copies)

    def params(self, rank: int) -> int:
        """Trainable values of this adapter in one layer: A and B."""
        (a0, a1), (b0, b1) = self.a_shape(rank), self.b_shape(rank)
        return a0 * a1 + b0 * b1

    def in_layer(self, spec: ModelSpec, layer: int) -> bool:
        """Whether decoder layer ``layer`` (0-based) holds this weight."""
        return self.layers == "all" or spec.is_moe_layer(layer) == (self.layers == "moe")

    def layer_count(self, spec: ModelSpec) -> int:
        """How many decoder layers hold this weight."""
        moe = spec.num_moe_layers
        return {"all": spec.layers, "moe": moe, "dense": spec.layers - moe}[self.layers]


@dataclass(frozen=True)
class _Site:
    """A weight PEFT can adapt: a linear module, or (``param``) a parameter the v4 -> v5 remap
    targets; ``part`` is ``"attention"`` or ``"mlp"``."""

    name: str
    in_features: int
    out_features: int
    part: str
    copies: int = 1
    layers: str = "all"
    param: bool = False


def _linear(prefix: str, rows: list[tuple[str, int, int]], part: str, layers: str) -> list[_Site]:
    return [_Site(f"{prefix}.{n}", i, o, part, layers=layers) for n, i, o in rows]


def _attention(spec: ModelSpec, family: str) -> list[_Site]:
    """The attention's linears (their modeling_*.py ``__init__``): q, k, v and the output
    projection, separate or fused; MLA's down- and up-projections (DeepseekV3Attention)."""
    h, q, kv, o = spec.hidden, spec.q_dim, spec.kv_dim, spec.o_dim
    qkv = q + 2 * kv
    fused = {  # family: (module prefix, fused QKV name, output name)
        "phi3": ("self_attn", "qkv_proj", "o_proj"),
        "gpt_neox": ("attention", "query_key_value", "dense"),
        "bloom": ("self_attention", "query_key_value", "dense"),
        "falcon": ("self_attention", "query_key_value", "dense"),
        "mpt": ("attn", "Wqkv", "out_proj"),
        "gpt2": ("attn", "c_attn", "c_proj"),
        "gpt_bigcode": ("attn", "c_attn", "c_proj"),
    }
    if family in fused:
        pre, fqkv, out = fused[family]
        return _linear(pre, [(fqkv, h, qkv), (out, o, h)], "attention", "all")
    if spec.kv_lora_rank:  # DeepseekV2Attention / DeepseekV3Attention
        a, rq, rkv = spec.heads, spec.q_lora_rank, spec.kv_lora_rank
        rope, nope, v = (
            spec.qk_rope_head_dim,
            spec.head_dim - spec.qk_rope_head_dim,
            spec.v_head_dim,
        )
        qs = [("q_a_proj", h, rq), ("q_b_proj", rq, q)] if rq else [("q_proj", h, q)]
        rows = [*qs, ("kv_a_proj_with_mqa", h, rkv + rope), ("kv_b_proj", rkv, a * (nope + v))]
        return _linear("self_attn", [*rows, ("o_proj", o, h)], "attention", "all")
    pre, out = {"gptj": ("attn", "out_proj"), "phi": ("self_attn", "dense")}.get(
        family, ("self_attn", "o_proj")
    )
    rows = [("q_proj", h, q), ("k_proj", h, kv), ("v_proj", h, kv), (out, o, h)]
    return _linear(pre, rows, "attention", "all")


def _gated(prefix: str, width: int, h: int, layers: str) -> list[_Site]:
    """A gated MLP: gate_proj and up_proj (h -> width), down_proj (width -> h)."""
    rows = [("gate_proj", h, width), ("up_proj", h, width), ("down_proj", width, h)]
    return _linear(prefix, rows, "mlp", layers)


def _mlp(spec: ModelSpec, family: str) -> list[_Site]:
    """The dense MLP's linears of a dense family (its modeling_*.py MLP class)."""
    h, f = spec.hidden, spec.ffn_hidden
    two = {  # family: (prefix, up name, down name) of a two-matrix MLP
        "phi": ("mlp", "fc1", "fc2"),
        "starcoder2": ("mlp", "c_fc", "c_proj"),
        "gptj": ("mlp", "fc_in", "fc_out"),
        "gpt_neox": ("mlp", "dense_h_to_4h", "dense_4h_to_h"),
        "bloom": ("mlp", "dense_h_to_4h", "dense_4h_to_h"),
        "falcon": ("mlp", "dense_h_to_4h", "dense_4h_to_h"),
        "mpt": ("ffn", "up_proj", "down_proj"),
        "gpt2": ("mlp", "c_fc", "c_proj"),
        "gpt_bigcode": ("mlp", "c_fc", "c_proj"),
    }
    if family in two:
        pre, up, down = two[family]
        return _linear(pre, [(up, h, f), (down, f, h)], "mlp", "all")
    if family in ("glm", "glm4", "phi3"):  # one fused gate_up_proj (h -> 2f)
        return _linear("mlp", [("gate_up_proj", h, 2 * f), ("down_proj", f, h)], "mlp", "all")
    return _gated("mlp", f, h, "all")


def _moe(spec: ModelSpec, family: str) -> list[_Site]:
    """The MLP sites of a family with experts: its MoE block's linears (and, for the remapped
    families, the experts' and router's parameters), then the dense layers' MLP."""
    h, ef, E, f = spec.hidden, spec.expert_ffn_hidden, spec.num_experts, spec.ffn_hidden
    shared = spec.shared_experts * ef
    out: list[_Site] = []
    if family in _REMAP:  # MixtralSparseMoeBlock, Qwen3MoeSparseMoeBlock, DeepseekV3MoE
        out += [
            _Site("mlp.gate.weight", h, E, "mlp", layers="moe", param=True),
            _Site("mlp.experts.gate_up_proj", h, 2 * ef, "mlp", E, "moe", True),
            _Site("mlp.experts.down_proj", ef, h, "mlp", E, "moe", True),
        ]
        if family.startswith("deepseek") and shared:
            out += _gated("mlp.shared_experts", shared, h, "moe")
    elif family == "qwen2_moe":  # Qwen2MoeSparseMoeBlock: shared expert and its gate
        out += _gated("mlp.shared_expert", shared, h, "moe")
        out += _linear("mlp", [("shared_expert_gate", h, 1)], "mlp", "moe")
    elif family == "phimoe":  # PhimoeTopKRouter is an nn.Linear
        out += _linear("mlp", [("router", h, E)], "mlp", "moe")
    elif family == "llama4_text":  # Llama4Router is an nn.Linear; one shared expert
        out += _linear("feed_forward", [("router", h, E)], "mlp", "moe")
        out += _gated("feed_forward.shared_expert", shared, h, "moe")
    if spec.num_moe_layers < spec.layers:  # the dense layers' MLP
        out += _gated("feed_forward" if family == "llama4_text" else "mlp", f, h, "dense")
    return out


def _family(spec: ModelSpec) -> str:
    """The spec's Transformers family, checked against the fields LoRA's layout reads."""
    family = spec.family
    if not family:
        name = spec.name
        if name not in PRESET_FAMILY or name not in presets() or spec != ModelSpec.preset(name):
            raise ValueError(
                f"spec.family='' (spec {name!r:.40}): LoRA's adapted modules depend on the "
                "Transformers family; read the model with ModelSpec.from_hf_config or give "
                f"family= one of {', '.join(FAMILIES)}"
            )
        family = PRESET_FAMILY[name]
    choice("spec.family", family, FAMILIES)
    if "(text_config of model_type=" in spec.source:
        raise ValueError(
            f"spec.source={spec.source!r:.80}: PEFT on the multimodal model also adapts its "
            "vision tower, which parmem does not model; read the text_config as its own "
            f"model_type ({family})"
        )
    if bool(spec.num_experts) != (family in _MOE):
        raise ValueError(
            f"spec.num_experts={spec.num_experts} does not fit spec.family={family!r}: "
            "Transformers builds that family "
            + ("with" if family in _MOE else "without")
            + " experts"
        )
    if bool(spec.kv_lora_rank) != family.startswith("deepseek"):
        raise ValueError(
            f"spec.kv_lora_rank={spec.kv_lora_rank} does not fit spec.family={family!r}: "
            "multi-head latent attention is DeepSeek's"
        )
    if family == "qwen2_moe" and not spec.shared_experts:
        raise ValueError(
            "spec.shared_experts=0 with qwen2_moe: Transformers' Qwen2MoeSparseMoeBlock still "
            "builds a zero-width shared expert and its gate, which PEFT would adapt; not modelled"
        )
    return family


def _sites(spec: ModelSpec, family: str) -> list[_Site]:
    mlp = _moe(spec, family) if family in _MOE else _mlp(spec, family)
    return _attention(spec, family) + mlp


def _matches(path: str, name: str) -> bool:
    """PEFT's ``check_target_module_exists`` on a name inside a layer: equal, or a suffix
    after a dot."""
    return path == name or path.endswith("." + name)


def _names(targets: Any, sites: list[_Site], family: str) -> tuple[str, ...]:
    """``targets`` as the module names PEFT would be given (a preset resolved)."""
    if isinstance(targets, str):
        choice("targets", targets, TARGETS)
        if targets == "attention":
            return tuple(s.name for s in sites if s.part == "attention")
        if targets == "qv":
            return ("q_proj", "v_proj")
        linear = [s.name for s in sites if not s.param]
        if family in _REMAP:  # _resolve_string_target_modules: leaf names and the v4 names
            return tuple(
                dict.fromkeys([n.rsplit(".", 1)[-1] for n in linear] + [*_REMAP[family][0]])
            )
        return tuple(linear)
    if not isinstance(targets, tuple | list) or not targets:
        raise ValueError(
            f"targets={targets!r:.60} must be one of {', '.join(map(repr, TARGETS))} or a "
            "non-empty tuple of module names"
        )
    for t in targets:
        if not isinstance(t, str) or not t:
            raise ValueError(f"targets: {t!r:.40} must be a non-empty module name (a string)")
        if t.rsplit(".", 1)[-1] in OUTSIDE:
            raise ValueError(
                f"targets: {t!r:.40} is an embedding or the LM head; LoRA on those is not "
                "modelled (all-linear never adapts them)"
            )
    return tuple(targets)


@normalised_cache(maxsize=512)
def _modules(spec: ModelSpec, targets: str | tuple[str, ...]) -> tuple[LoraModule, ...]:
    family = _family(spec)
    sites = _sites(spec, family)
    names = _names(targets, sites, family)
    params: set[str] = set()
    factor = 1
    if family in _REMAP:  # _convert_peft_config_moe
        mapping, fused = _REMAP[family]
        hit = {t: next((old for old in mapping if _matches(t, old)), "") for t in names}
        params = {mapping[old] for old in hit.values() if old}
        halves = set(hit.values()) & set(fused)
        if halves and halves != set(fused):
            raise ValueError(
                f"targets={targets!r:.80}: {', '.join(sorted(halves))} without "
                f"{', '.join(sorted(set(fused) - halves))}: they are fused into gate_up_proj on "
                f"Transformers 5's {family} (PEFT refuses it too)"
            )
        factor = len(fused) if halves else 1
        names = tuple(t for t in names if not hit[t])
    linear = [s for s in sites if not s.param]
    for t in names:
        if not any(_matches(s.name, t) for s in linear):
            have = sorted({s.name for s in linear} | set(_REMAP.get(family, ({}, ()))[0]))
            raise ValueError(
                f"targets={targets!r:.80}: model family {family!r} has no module {t!r:.40} "
                f"that PEFT can adapt in its decoder layers; its modules: {', '.join(have)}"
            )
    out = []
    for s in sites:
        if s.param:
            if not any(_matches(s.name, p) for p in params):
                continue
            rank = factor if s.name.endswith(".gate_up_proj") else 1
            out.append(LoraModule(s.name, s.in_features, s.out_features, s.copies, rank,
                                  s.layers, "ParamWrapper"))  # fmt: skip
        elif any(_matches(s.name, t) for t in names):
            out.append(LoraModule(s.name, s.in_features, s.out_features, layers=s.layers))
    return tuple(out)


def lora_modules(spec: ModelSpec, targets: Any = "all-linear") -> tuple[LoraModule, ...]:
    """The weights LoRA adapts in the decoder layers, one row per kind (see :class:`LoraModule`).

    ``targets``: one of :data:`TARGETS`, or a tuple of module names matched as PEFT's
    ``LoraConfig(target_modules=[...])`` matches them (a name equals a module's path or ends it
    after a dot: ``"q_proj"``, ``"self_attn.q_proj"``); a name the family does not have in its
    decoder layers is refused. Source: peft 0.21.2 ``tuners_utils.check_target_module_exists``,
    ``_maybe_include_all_linear_layers`` and ``transformers_weight_conversion.
    _convert_peft_config_moe`` (module docstring).
    """
    instance("spec", spec, ModelSpec, "ModelSpec.from_hf_config(config)")
    key = tuple(targets) if isinstance(targets, list) else targets
    try:
        hash(key)
    except TypeError:
        raise ValueError(f"targets={targets!r:.60} must be a string or a tuple of names") from None
    return _modules(spec, key)


def lora_layer_params(spec: ModelSpec, rank: int, targets: Any, layer: int) -> int:
    """LoRA's trainable values in decoder layer ``layer`` (0-based): Σ r·(in + out) over its
    adapted linears, r·E·(in + out) over a ParamWrapper'd experts parameter (peft 0.21.2
    ``lora/layer.py``, ``LoraLayer.update_layer`` and ``ParamWrapper.update_layer``). The
    embeddings and the LM head hold none (never targeted)."""
    r = integer("rank", rank, 1, MAX_WIDTH)
    mods = lora_modules(spec, targets)
    i = integer("layer", layer, 0, spec.layers - 1)
    return sum(m.params(r) for m in mods if m.in_layer(spec, i))


def lora_params(spec: ModelSpec, rank: int, targets: Any = "all-linear") -> int:
    """All of LoRA's trainable values, what ``PeftModel.get_nb_trainable_parameters()[0]``
    reports (peft 0.21.2, ``lora_dropout=0``, ``lora_bias=False``): the sum over the decoder
    layers of :func:`lora_layer_params` (multi-token-prediction modules, which Transformers does
    not build, hold none)."""
    r = integer("rank", rank, 1, MAX_WIDTH)
    return sum(m.params(r) * m.layer_count(spec) for m in lora_modules(spec, targets))
