"""Bytes of quantized weights and of memory-saving optimizers, as the libraries allocate them.

Ground truth: the sources of bitsandbytes 0.50.2, Transformers 5.23.0 and galore-torch 1.0
(``tests/test_quant.py`` runs each on CPU, or on the meta device through the library's own shape
functions, and counts the bytes of every tensor it keeps).

**4-bit weights** (QLoRA; Dettmers et al. 2023). ``bitsandbytes/functional.py``
``quantize_4bit`` (the CUDA kernel ``backends/cuda/ops.py`` and the fake ``_ops.py`` allocate
the same) keeps per weight of n elements: the packed data, two 4-bit codes a byte, ⌈n/2⌉ bytes
(``(n+1)//(2·s)`` elements of the ``quant_storage`` dtype of s bytes); the ``QuantState``: the
16-entry fp32 code table (64 B, ``get_4bit_type`` builds one per weight) and either the fp32
absmax of each block of 64 (4·⌈n/64⌉ B), or with double quantization (``compress_statistics``)
the uint8 absmax per block (⌈n/64⌉ B), the fp32 offset (a 0-d tensor, 4 B), the fp32 absmax of
each 256 blocks (``quantize_blockwise(..., blocksize=256)``, 4·⌈blocks/256⌉ B) and its own copy
of the 256-entry fp32 dynamic map (1024 B, ``code.to(device, copy=True)``).
**8-bit weights** (LLM.int8(); ``nn/modules.py`` ``Int8Params._quantize``,
``int8_vectorwise_quant``): int8 data (n B) and one fp32 scale per row (4·rows B).

**Which tensors** (Transformers 5.23 ``integrations/bitsandbytes.py``
``replace_with_bnb_linear``, ``quantizers/base.py`` ``get_keys_to_not_convert``): only modules
whose type *is* ``nn.Linear`` (or GPT-2's ``Conv1D``) become ``Linear4bit``/``Linear8bitLt``;
the output embedding, tied weights and the module of the last parameter are skipped. So kept in
16-bit: embeddings, learned positions, the LM head, every norm, every bias, attention sinks, the
routers (a ``Parameter`` or an ``nn.Linear`` subclass in every family) and **the routed experts**:
Transformers 5 holds them as fused 3-D ``nn.Parameter``s (``experts.gate_up_proj``,
``experts.down_proj``), which bitsandbytes never quantizes (measured for Mixtral, Qwen3-MoE,
Qwen2-MoE, DeepSeek-V2/V3, gpt-oss, GraniteMoE, Phi-MoE, Llama 4 loaded from a 16-bit
checkpoint; only a *pre-quantized* Llama 4 checkpoint is rebuilt with one ``nn.Linear`` per expert,
``SequentialLlama4TextExperts``, which is not modelled). Shared experts are one ``nn.Linear`` MLP
of ``shared_experts · expert_ffn_hidden`` and are quantized, as is Qwen2-MoE's
``shared_expert_gate``. Falcon's projections are ``FalconLinear`` (a subclass): nothing is
quantized (Transformers warns "no linear modules were found"). Fused projections are one
quantized tensor each (its own blocks and quant state): QKV in GPT-2, GPT-BigCode, GPT-NeoX,
BLOOM, MPT and Phi-3, gate+up in Phi-3, GLM and GLM-4. A spec without ``family`` (a preset)
is taken as Llama-style separate projections. Multi-token-prediction modules are not built by
Transformers and are not counted. Buffers (rotary ``inv_freq``, DeepSeek-V3's fp32
``e_score_correction_bias``) are not parameters and are not counted; neither are gpt-oss's norms
upcast to fp32 under an fp16 load (``_keep_in_fp32_modules``; ``dtype_16`` means bf16).

**8-bit optimizers** (``optim/optimizer.py`` ``Optimizer2State.init_state``): a tensor of fewer
than ``min_8bit_size`` (4096) elements keeps two fp32 states (8n B); a larger one two uint8 states
(2n B) and two fp32 absmax per block of 256 (8·⌈n/256⌉ B); the optimizer shares two 256-entry fp32
maps (``dynamic``, ``udynamic``: 2048 B) among all its 8-bit tensors; ``step`` is a Python int.
Paged optimizers allocate the same bytes; the states of a tensor of at least 10**5 elements come
from ``F.get_paged`` (CUDA unified memory, ``cudaMallocManaged``): they count on the GPU but the
driver may evict them to host memory under pressure (:func:`bnb_paged_state_bytes`).

**GaLore** (galore_torch 1.0 ``GaLoreAdamW``, ``GaLoreProjector``): per 2-D parameter of a galore
group, the projection matrix and Adam's two moments on the projected gradient, all in the
gradient's dtype; other parameters keep two full moments. The SVD's fp32 transients (every
``update_proj_gap`` steps) and the full-size back-projected update of each step are transient and
not counted here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ._check import boolean, cdiv, choice, instance, integer, normalised_cache
from .hfconfig import FAMILIES
from .model import ModelSpec
from .table import layer_tensors, model_tensors

__all__ = [
    "QUANTS",
    "STORAGES",
    "BNB_OPTIMIZERS",
    "GALORE_PROJ_TYPES",
    "QuantBytes",
    "BnbTensor",
    "weight_bytes_4bit",
    "weight_bytes_int8",
    "bnb_tensors",
    "layer_weight_bytes",
    "outer_weight_bytes",
    "model_weight_bytes",
    "dequant_weight_bytes",
    "dequant_transient_bytes",
    "bnb_optimizer_state_bytes",
    "bnb_paged_state_bytes",
    "galore_state_bytes",
    "GALORE_FAMILIES",
    "galore_groups",
    "galore_state_total",
]

#: weight formats: bitsandbytes 4-bit NF4 / FP4, LLM.int8(), no quantization
QUANTS = ("nf4", "fp4", "int8", "none")
#: ``bnb_4bit_quant_storage`` (Transformers' BitsAndBytesConfig names) -> bytes of an element
STORAGES = {"uint8": 1, "int8": 1, "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}
#: ``quantize_4bit``'s block sizes
BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)
#: bitsandbytes AdamW variants: name -> (8-bit states, paged)
BNB_OPTIMIZERS = {
    "adamw8bit": (True, False),
    "paged_adamw8bit": (True, True),
    "paged_adamw": (False, True),
    "adamw": (False, False),
}
GALORE_PROJ_TYPES = ("std", "reverse_std", "right", "left", "full")

#: the largest tensor accepted (elements): far above any real one
MAX_NUMEL = 2**50
#: fp32 entries of the 4-bit code table and of the 8-bit dynamic map (``create_dynamic_map``)
_CODE4, _CODE8 = 16, 256
#: blocks of absmax quantized together by double quantization; optimizer state block size
_NESTED_BLOCK, _OPTIM_BLOCK = 256, 256
#: paged optimizers allocate unified memory for tensors of at least this many elements
_PAGED_MIN = 100_000

#: Transformers 5.23 families whose Q, K, V are one nn.Linear, and whose gate, up are one
_FUSED_QKV = {"bloom", "gpt2", "gpt_bigcode", "gpt_neox", "mpt", "phi3", "falcon"}
_FUSED_GATE_UP = {"phi3", "glm", "glm4"}
#: families whose projections are nn.Linear subclasses: replace_with_bnb_linear skips them
_UNCONVERTED = {"falcon"}
_KNOWN = set(FAMILIES) | {"gemma3_text", "llama4_text", ""}


# ---------------------------------------------------------------------------- one weight
def weight_bytes_4bit(
    n_elements: int,
    quant_type: str = "nf4",
    blocksize: int = 64,
    double_quant: bool = True,
    storage: str = "uint8",
) -> int:
    """Bytes bitsandbytes 0.50.2 keeps for one 4-bit weight of ``n_elements``: packed data and
    its ``QuantState`` tensors (module docstring; ``functional.py`` ``quantize_4bit``,
    ``_ops.py`` fake ``quantize_4bit``/``quantize_blockwise``). NF4 and FP4 cost the same.

    A ``storage`` wider than a byte must hold the ⌈n/2⌉ packed bytes whole: otherwise the CPU
    path's ``view`` fails and the CUDA path allocates ``(n+1)//(2·s)`` elements, fewer bytes than
    it writes; such an ``n_elements`` is refused."""
    n = integer("n_elements", n_elements, 1, MAX_NUMEL)
    choice("quant_type", quant_type, ("nf4", "fp4"))
    blocksize = _pick("blocksize", blocksize, BLOCKSIZES)
    boolean("double_quant", double_quant)
    s = STORAGES[choice("storage", storage, STORAGES)]
    packed = cdiv(n, 2)
    if packed % s:
        raise ValueError(
            f"n_elements={n} with storage={storage!r}: the {packed} packed bytes must be a "
            f"multiple of {s} (bitsandbytes 0.50.2 cannot store it)"
        )
    blocks = cdiv(n, blocksize)
    if double_quant:
        stats = blocks + 4 + 4 * cdiv(blocks, _NESTED_BLOCK) + 4 * _CODE8
    else:
        stats = 4 * blocks
    return packed + 4 * _CODE4 + stats


def weight_bytes_int8(rows: int, cols: int) -> int:
    """Bytes of one LLM.int8() weight (``Int8Params._quantize``): int8 data and an fp32 scale per
    output row (``SCB``); ``CB`` is the data itself."""
    r = integer("rows", rows, 1, MAX_NUMEL)
    c = integer("cols", cols, 1, MAX_NUMEL)
    return r * c + 4 * r


def _pick(name: str, value: Any, options: tuple[int, ...]) -> int:
    """An integer (not a bool, not 2.0) among ``options``."""
    return choice(name, integer(name, value, min(options), max(options)), options)


# ---------------------------------------------------------------------------- the model
@dataclass(frozen=True)
class QuantBytes:
    """Weight bytes of a model, a layer or a stage: ``quantized`` (the quantized tensors with
    their quant state), ``kept`` (tensors left at ``dtype_16``) and their element counts."""

    quantized: int = 0
    kept: int = 0
    quantized_params: int = 0
    kept_params: int = 0

    @property
    def total(self) -> int:
        return self.quantized + self.kept

    def __add__(self, other: QuantBytes) -> QuantBytes:
        if not isinstance(other, QuantBytes):
            return NotImplemented
        return QuantBytes(
            self.quantized + other.quantized,
            self.kept + other.kept,
            self.quantized_params + other.quantized_params,
            self.kept_params + other.kept_params,
        )

    def scaled(self, k: int) -> QuantBytes:
        """``k`` copies (``k`` identical layers)."""
        k = integer("k", k, 0)
        return QuantBytes(
            self.quantized * k, self.kept * k, self.quantized_params * k, self.kept_params * k
        )


@dataclass(frozen=True)
class BnbTensor:
    """One parameter as Transformers builds it under bitsandbytes: ``count`` tensors of
    ``rows × cols`` (cols 1 for a vector); ``quantized`` when its module becomes a
    ``Linear4bit``/``Linear8bitLt``."""

    name: str
    rows: int
    cols: int
    count: int
    quantized: bool

    @property
    def numel(self) -> int:
        return self.rows * self.cols * self.count


def _family(spec: ModelSpec) -> str:
    instance("spec", spec, ModelSpec, "ModelSpec.preset(name)")
    if spec.family not in _KNOWN:
        raise ValueError(
            f"spec.family={spec.family!r}: which modules bitsandbytes quantizes is not modelled "
            "for this family"
        )
    return spec.family


@normalised_cache(maxsize=256)
def _layer(spec: ModelSpec, moe: bool) -> tuple[BnbTensor, ...]:
    fam = _family(spec)
    out: dict[str, BnbTensor] = {}
    fuse = {}
    if fam in _FUSED_QKV:
        fuse.update(dict.fromkeys(("attn.q.weight", "attn.k.weight", "attn.v.weight"), "attn.qkv"))
    if fam in _FUSED_GATE_UP:
        fuse.update(dict.fromkeys(("mlp.gate.weight", "mlp.up.weight"), "mlp.gate_up"))
    for t in layer_tensors(spec, moe):
        linear = (t.kind == "linear" and not t.expert) or t.name == "shared_expert_gate.weight"
        quantized = linear and fam not in _UNCONVERTED
        rows, cols, count = t.rows, t.cols, t.count
        if t.name.startswith("shared_experts.") and count > 1:  # one MLP of n · ef
            rows, cols = (rows, cols * count) if t.split == "row" else (rows * count, cols)
            count = 1
        name = fuse.get(t.name, t.name) if quantized else t.name
        if name in out:  # a fused projection: its rows add up
            rows += out[name].rows
        out[name] = BnbTensor(name, rows, cols, count, quantized)
    return tuple(out.values())


def bnb_tensors(spec: ModelSpec, layer: int) -> tuple[BnbTensor, ...]:
    """The parameters of decoder layer ``layer`` (0-based) as Transformers 5.23 builds them for
    bitsandbytes (module docstring: what is quantized, what is fused)."""
    _family(spec)
    i = integer("layer", layer, 0, spec.layers - 1)
    return _layer(spec, spec.is_moe_layer(i))


def _sum(tensors: Iterable[BnbTensor], quant: str, dq: bool, d16: int, storage: str) -> QuantBytes:
    q = k = qp = kp = 0
    for t in tensors:
        if t.quantized and quant != "none":
            n = t.rows * t.cols
            if quant == "int8":
                one = weight_bytes_int8(t.rows, t.cols)
            else:
                try:
                    one = weight_bytes_4bit(n, quant, 64, dq, storage)
                except ValueError as e:
                    raise ValueError(f"{t.name} ({t.rows} x {t.cols}): {e}") from None
            q += one * t.count
            qp += t.numel
        else:
            k += t.numel * d16
            kp += t.numel
    return QuantBytes(q, k, qp, kp)


def _options(quant: Any, double_quant: Any, dtype_16: Any, storage: Any) -> tuple:
    quant = choice("quant", quant, QUANTS)
    boolean("double_quant", double_quant)
    d16 = _pick("dtype_16", dtype_16, (2, 4))
    storage = choice("storage", storage, STORAGES)
    return quant, double_quant, d16, storage


def layer_weight_bytes(
    spec: ModelSpec,
    layer: int,
    quant: str = "nf4",
    double_quant: bool = True,
    dtype_16: int = 2,
    storage: str = "uint8",
) -> QuantBytes:
    """Weight bytes of decoder layer ``layer`` under Transformers 5.23 + bitsandbytes 0.50.2
    loading with ``BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=quant,
    bnb_4bit_use_double_quant=double_quant, bnb_4bit_quant_storage=storage)`` (``quant="int8"``:
    ``load_in_8bit=True``; ``"none"``: no quantization). ``dtype_16``: bytes of an element of the
    tensors left unquantized (2 for bf16/fp16, 4 for fp32), as loaded: ``Linear4bit.forward``
    later casts the bias of a quantized module to the compute dtype in place, which is not
    counted. Blocks of 64 (Transformers has no option for another size). Sum the layers of a
    pipeline stage, plus :func:`outer_weight_bytes`."""
    opts = _options(quant, double_quant, dtype_16, storage)
    return _sum(bnb_tensors(spec, layer), *opts)


def outer_weight_bytes(
    spec: ModelSpec,
    place: str,
    quant: str = "nf4",
    double_quant: bool = True,
    dtype_16: int = 2,
    storage: str = "uint8",
) -> QuantBytes:
    """The tensors outside the layers, never quantized (module docstring): on the ``"first"``
    stage the embedding, learned positions and BLOOM's embedding norm; on the ``"last"`` the
    final norm and the LM head (none of its own when tied)."""
    _family(spec)
    place = choice("place", place, ("first", "last"))
    opts = _options(quant, double_quant, dtype_16, storage)
    rows = [
        BnbTensor(t.name, t.rows, t.cols, t.count, False)
        for t in model_tensors(spec)
        if t.place == place and not t.name.startswith("mtp.")
    ]
    return _sum(rows, *opts)


def model_weight_bytes(
    spec: ModelSpec,
    quant: str = "nf4",
    double_quant: bool = True,
    dtype_16: int = 2,
    storage: str = "uint8",
) -> QuantBytes:
    """Weight bytes of the whole model (:func:`layer_weight_bytes` of every layer and
    :func:`outer_weight_bytes` of both ends): what ``from_pretrained(...,
    quantization_config=BitsAndBytesConfig(...))`` holds, quant states included."""
    _family(spec)
    opts = _options(quant, double_quant, dtype_16, storage)
    moe = spec.num_moe_layers
    total = _sum(_layer(spec, True), *opts).scaled(moe) if moe else QuantBytes()
    if spec.layers - moe:
        total += _sum(_layer(spec, False), *opts).scaled(spec.layers - moe)
    for place in ("first", "last"):
        total += outer_weight_bytes(spec, place, *opts)
    return total


def dequant_weight_bytes(
    n_elements: int,
    compute_itemsize: int = 2,
    *,
    double_quant: bool = True,
    dtype_16: int = 2,
) -> int:
    """The largest transient bitsandbytes 0.50.2 allocates to dequantize one 4-bit weight of
    ``n_elements`` (n) during a training forward and backward on CUDA (``autograd/_functions.py``
    ``MatMul4Bit``, ``functional.py`` ``dequantize_4bit``, ``backends/cuda/ops.py``).

    Forward: ``gemm_4bit`` runs a fused kernel (no transient) for at most 1536 tokens when the
    in-features are a multiple of 64, else ``_dequant_linear_fallback``: with double
    quantization two fp32 absmax vectors at once (``absmax_dq`` and ``absmax_dq + offset``,
    8·blocks B), then the weight in the compute dtype (n·``compute_itemsize``). Backward
    (always): ``F.dequantize_4bit`` builds the fp32 absmax (4·blocks B with double
    quantization) and the weight in the dtype it was loaded in (n·``dtype_16``); ``.to(grad
    dtype)`` then copies it when the compute dtype differs (the absmax is freed by then). The
    larger of the two; blocks of 64. ``MatMul4Bit`` saves only the packed weight (a reference)
    for backward, not its input. ``compute_itemsize``: ``bnb_4bit_compute_dtype``, which
    Transformers' ``BitsAndBytesConfig`` defaults to float32 (4); QLoRA recipes set bf16 (2)."""
    n = integer("n_elements", n_elements, 1, MAX_NUMEL)
    c = _pick("compute_itemsize", compute_itemsize, (2, 4))
    boolean("double_quant", double_quant)
    w = _pick("dtype_16", dtype_16, (2, 4))
    blocks = cdiv(n, 64)
    fwd = n * c + (8 * blocks if double_quant else 0)
    bwd = n * w + max(4 * blocks if double_quant else 0, n * c if c != w else 0)
    return max(fwd, bwd)


def dequant_transient_bytes(
    spec: ModelSpec,
    quant: str = "nf4",
    compute_itemsize: int = 2,
    *,
    double_quant: bool = True,
    dtype_16: int = 2,
) -> int:
    """:func:`dequant_weight_bytes` of the largest weight of ``spec`` that bitsandbytes
    quantizes (:func:`bnb_tensors`): the transient one 4-bit linear adds during a training step
    on CUDA. 0 for ``quant="none"``; ``"int8"`` is refused (LLM.int8()'s ``MatMul8bitLt``
    transients are not modelled)."""
    quant = choice("quant", quant, QUANTS)
    if quant == "int8":
        raise ValueError("quant='int8': LLM.int8()'s transients (MatMul8bitLt) are not modelled")
    _pick("compute_itemsize", compute_itemsize, (2, 4))
    boolean("double_quant", double_quant)
    _pick("dtype_16", dtype_16, (2, 4))
    _family(spec)
    if quant == "none":
        return 0
    moe = spec.num_moe_layers
    kinds = [True] * bool(moe) + [False] * bool(spec.layers - moe)
    sizes = [t.rows * t.cols for kind in kinds for t in _layer(spec, kind) if t.quantized]
    if not sizes:
        return 0
    return dequant_weight_bytes(
        max(sizes), compute_itemsize, double_quant=double_quant, dtype_16=dtype_16
    )


# ---------------------------------------------------------------------------- optimizers
def _numels(shapes: Any, name: str = "shapes") -> list[int]:
    if isinstance(shapes, str | bytes) or not isinstance(shapes, Sequence):
        raise ValueError(f"{name}={shapes!r:.60} must be a list of tensor sizes (elements)")
    return [integer(f"{name}[{i}]", n, 1, MAX_NUMEL) for i, n in enumerate(shapes)]


def bnb_optimizer_state_bytes(
    shapes: Sequence[int], optim: str = "adamw8bit", min_8bit_size: int = 4096
) -> int:
    """Optimizer-state bytes of bitsandbytes 0.50.2's ``AdamW8bit``, ``PagedAdamW8bit``,
    ``PagedAdamW`` (32-bit) or ``AdamW`` (32-bit) for parameters of ``shapes`` elements each,
    after the first step (``optim/optimizer.py`` ``Optimizer2State.init_state``; module
    docstring). Transformers' ``optim="adamw_bnb_8bit"``, ``"paged_adamw_8bit"``,
    ``"paged_adamw_32bit"`` build these with the default ``min_8bit_size``. Paged bytes are GPU
    bytes that can page out to host: :func:`bnb_paged_state_bytes`."""
    numels = _numels(shapes)
    eight, _ = BNB_OPTIMIZERS[choice("optim", optim, BNB_OPTIMIZERS)]
    least = integer("min_8bit_size", min_8bit_size, 0, MAX_NUMEL)
    total, any8 = 0, False
    for n in numels:
        if eight and n >= least:
            total += 2 * n + 8 * cdiv(n, _OPTIM_BLOCK)
            any8 = True
        else:
            total += 8 * n
    return total + (2 * 4 * _CODE8 if any8 else 0)


def bnb_paged_state_bytes(
    shapes: Sequence[int], optim: str = "paged_adamw8bit", min_8bit_size: int = 4096
) -> int:
    """The part of :func:`bnb_optimizer_state_bytes` in CUDA unified memory: a paged optimizer's
    ``state1``/``state2`` of each tensor of at least 10**5 elements (``get_state_buffer`` calls
    ``F.get_paged``); absmax vectors, maps and smaller tensors' states are ordinary GPU memory.
    They are allocated on the GPU and the driver may evict them to host under memory pressure.
    0 for a non-paged optimizer. On CPU bitsandbytes falls back to ordinary tensors."""
    numels = _numels(shapes)
    eight, paged = BNB_OPTIMIZERS[choice("optim", optim, BNB_OPTIMIZERS)]
    least = integer("min_8bit_size", min_8bit_size, 0, MAX_NUMEL)
    if not paged:
        return 0
    return sum((2 if eight and n >= least else 8) * n for n in numels if n >= _PAGED_MIN)


def galore_state_bytes(
    shapes: Sequence[tuple[int, int]],
    rank: int,
    *,
    other_numels: Sequence[int] = (),
    itemsize: int = 4,
    proj_type: str = "std",
) -> int:
    """Optimizer-state bytes of galore_torch 1.0's ``GaLoreAdamW`` after its first step: for
    each (m, n) parameter of the galore group the projector's ``ortho_matrix`` and Adam's
    ``exp_avg``/``exp_avg_sq`` on the projected gradient (``galore_projector.py``
    ``GaLoreProjector.project``, ``get_orthogonal_matrix``: SVD with ``full_matrices=False``,
    so the rank is at most min(m, n)), and two full moments for each parameter of
    ``other_numels`` (the groups without ``rank``). ``std``: m >= n projects on the right,
    P = Vh[:r] (r × n), moments m × r; m < n on the left, P = U[:, :r] (m × r), moments r × n
    (``reverse_std`` the other way round, ``right``/``left`` always one side, ``full`` both:
    P = (m × r, r × n), moments r × r). Everything is in the gradient's dtype (``itemsize``:
    4 for fp32 parameters, 2 for bf16: the projection is cast back). ``step`` is a Python int.
    Not counted: the fp32 SVD transients every ``update_proj_gap`` steps and the full-size
    back-projected update of each step. Refused: ``reverse_std`` with m < n and rank >= m
    (galore_torch's ``project_back`` multiplies mismatched shapes there)."""
    if isinstance(shapes, str | bytes) or not isinstance(shapes, Sequence):
        raise ValueError(f"shapes={shapes!r:.60} must be a list of (rows, cols) pairs")
    r = integer("rank", rank, 1, MAX_NUMEL)
    size = _pick("itemsize", itemsize, (2, 4))
    kind = choice("proj_type", proj_type, GALORE_PROJ_TYPES)
    total = 0
    for i, shape in enumerate(shapes):
        if not isinstance(shape, Sequence) or isinstance(shape, str | bytes) or len(shape) != 2:
            raise ValueError(
                f"shapes[{i}]={shape!r:.60} must be a (rows, cols) pair: GaLore projects 2-D "
                "parameters only"
            )
        m = integer(f"shapes[{i}][0]", shape[0], 1, MAX_NUMEL)
        n = integer(f"shapes[{i}][1]", shape[1], 1, MAX_NUMEL)
        k = min(r, m, n)
        if kind == "reverse_std" and m < n and k == m:
            raise ValueError(
                f"shapes[{i}]=({m}, {n}) with rank={r} and proj_type='reverse_std': the projected "
                "gradient is square and galore_torch 1.0's project_back fails on it"
            )
        side = {
            "std": "right" if m >= n else "left",
            "reverse_std": "left" if m >= n else "right",
        }.get(kind, kind)
        if side == "right":
            proj, moment = k * n, m * k
        elif side == "left":
            proj, moment = m * k, k * n
        else:
            proj, moment = m * k + k * n, k * k
        total += (proj + 2 * moment) * size
    for n in _numels(other_numels, "other_numels"):
        total += 2 * n * size
    return total


#: families whose 2-D weights GaLore's selection is modelled for: every projection a separate
#: ``nn.Linear`` inside ``self_attn`` or ``mlp`` (``""``: a preset written as one of them)
GALORE_FAMILIES = ("", "llama", "mistral", "qwen2", "qwen3", "granite")


def galore_groups(spec: ModelSpec) -> tuple[list[tuple[int, int]], list[int], list[int]]:
    """(one layer's GaLore shapes, one layer's other tensors, the tensors outside the layers)."""
    instance("spec", spec, ModelSpec, "ModelSpec.preset(name)")
    if spec.is_moe or spec.family not in GALORE_FAMILIES:
        what = "a mixture of experts (fused 3-D experts)" if spec.is_moe else repr(spec.family)
        raise ValueError(
            f"spec: GaLore's parameter groups are not modelled for {what}; modelled families: "
            f"{', '.join(f or 'presets' for f in GALORE_FAMILIES)}"
        )
    shapes: list[tuple[int, int]] = []
    other: list[int] = []
    for t in layer_tensors(spec, False):
        if t.kind == "linear" and t.cols > 1:
            shapes += [(t.rows, t.cols)] * t.count
        else:
            other += [t.rows * t.cols] * t.count
    outer = [t.rows * t.cols for t in model_tensors(spec) for _ in range(t.count)]
    return shapes, other, outer


def galore_state_total(
    spec: ModelSpec, rank: int, *, itemsize: int = 2, proj_type: str = "std"
) -> int:
    """Optimizer-state bytes of galore_torch 1.0's ``GaLoreAdamW`` for the whole model
    (:func:`parmem.quant.galore_state_bytes`), with the parameter groups of GaLore's own
    training script (``torchrun_main.py``: every ``nn.Linear`` whose module name contains
    ``attn`` or ``mlp`` is projected at ``rank``; the embedding, the norms and the LM head keep
    two full moments). ``itemsize``: the gradients' bytes (2 for a bf16 model). Refused: a
    mixture of experts and the families outside :data:`GALORE_FAMILIES` (fused or ``Conv1D``
    projections)."""
    shapes, other, outer = galore_groups(spec)
    layer = galore_state_bytes(
        shapes, rank, other_numels=other, itemsize=itemsize, proj_type=proj_type
    )
    ends = galore_state_bytes([], rank, other_numels=outer, itemsize=itemsize, proj_type=proj_type)
    return spec.layers * layer + ends
