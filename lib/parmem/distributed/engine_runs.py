"""The engines' own code, measured beside the engine profiles of :mod:`parmem.engines`.

* :func:`hf_layer`: one decoder layer of a Transformers model (the cases of :data:`HF_TINY`:
  Llama, Mistral, Qwen2, Qwen3, Mixtral, GPT-2, Gemma, Gemma 2, Gemma 3, Qwen2-MoE, Qwen3-MoE,
  Granite, Starcoder2; transformers 5.23.0) built from a tiny config, run forward as the Trainer
  runs it (``train()``, ``use_cache=False``), in bf16 or fp32, with eager or SDPA attention, or
  fp32 weights under bf16 autocast. The bytes it keeps for backward
  (:class:`parmem.measure.SavedTensorsMeter`, parameters excluded) beside the ``hf`` profile's
  ``layer`` and ``stage`` tables on device ``"cpu"`` (:func:`parmem.activations.layer_terms`):
  the layer is the model's only one, so it is also the one that keeps the rotary cos and sin
  every layer shares. :func:`hf_model`: a whole two-layer model computing its loss, beside the
  ``layer``, ``stage``, ``first`` and ``last`` tables and the fp32 log-probabilities.
* :func:`demo_torchtitan` (a :class:`parmem.distributed.Pool` worker): torchtitan 0.3.0's Llama 3
  ``debugmodel`` parallelized by torchtitan's own ``parallelize_llama`` (FSDP2 ``fully_shard``
  per block, bf16 parameters for compute, fp32 reduction) on the pool's ranks, one AdamW step
  built by torchtitan's optimizer container. Per rank: parameter, gradient and optimizer bytes
  (:func:`parmem.measure.state_bytes`), the largest all-gather output and reduce-scatter input
  of a block (FSDP2's unsharded buffers, recorded through ``FSDPModule.set_custom_all_gather`` /
  ``set_custom_reduce_scatter``) and one block's saved tensors, beside the ``fsdp2`` profile.

What a CPU run changes, each named (the profiles describe CUDA; the ``[devices.cpu]`` table of
``data/engines.toml`` holds the element sizes that differ):

* dropout masks are the activation dtype, LayerNorm statistics the input dtype, and
  ``nn.RMSNorm`` keeps an fp32 copy and an fp32 normalised tensor (the CPU composite);
* every case with attention dropout (GPT-2, ``+dropout``) is run with SDPA at dropout 0: CPU SDPA
  has no fused kernel with dropout, and its math fallback upcasts to fp32, which no GPU run does
  (on CUDA the flash kernel regenerates the dropout mask, so the profile keeps no
  attention-dropout tensor under SDPA either way);
* torchtitan: ``device_type`` is set to ``"cpu"`` (torchtitan assumes an accelerator);
  ``parallelism.spmd_backend="partial_dtensor"`` (the default ``"spmd_types"`` needs annotations
  this torch build's ``fully_shard`` does not read); torchtitan's ``ScaledDotProductAttention``
  replaces ``FlexAttention`` (no CPU backward; both keep Q, K, V, the output and the fp32
  log-sum-exp); every FSDP module sums its reduce-scatter without a pre-multiplied divisor
  (``set_force_sum_reduction_for_comms``: gloo has no ``PREMUL_SUM``; torchtitan sets the
  divide factor to 1, so the gradients are the same); no activation checkpointing (torchtitan's
  default selective AC keeps its tensors in a cache the saved-tensor hooks do not see; model
  states do not depend on it); the loss is a plain cross-entropy on the logits.

Model states measured differ from the profile by one named term: AdamW's ``step`` counters,
one 0-d fp32 tensor per parameter tensor (as in :mod:`parmem.distributed.zero`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import types
from collections.abc import Iterator
from typing import Any

from parmem._check import choice, integer

__all__ = [
    "HF_FAMILIES",
    "HF_TINY",
    "HF_CASES",
    "HF_EAGER_ONLY",
    "hf_layer",
    "hf_model",
    "hf_spec",
    "during_forward",
    "record_comms",
    "quiet",
    "triton_stub",
    "datasets_stub",
    "torchtitan_modules",
    "torchtitan_spec",
    "demo_torchtitan",
    "torchtitan_step",
]

_GQA = dict(
    hidden_size=64, intermediate_size=80, num_attention_heads=4, num_key_value_heads=2, head_dim=24
)
_EXPERTS = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=40)
#: Tiny configs of the Transformers families checked against the ``hf`` profile: every width
#: distinct (h = 64, query heads x head_dim = 96, key/value heads x head_dim = 48, f = 80, expert
#: f = 40, shared expert 120, and for GPT-2 f = 4h), so that no two terms can stand in for each
#: other. A key is a case: the ``model_type``, and after a ``+`` what the case sets beyond the
#: family's defaults (``qwen3_moe+norm_topk_prob``; ``+dropout``: attention dropout 0.1).
HF_TINY: dict[str, dict[str, Any]] = {
    "llama": dict(_GQA),
    "llama+dropout": dict(_GQA, attention_dropout=0.1),
    "mistral": dict(_GQA, num_key_value_heads=1),
    "qwen2": dict(
        hidden_size=64, intermediate_size=80, num_attention_heads=4, num_key_value_heads=2
    ),
    "qwen3": dict(_GQA),
    "mixtral": dict(_GQA, num_local_experts=4, num_experts_per_tok=2),
    "gpt2": dict(n_embd=64, n_head=4, n_positions=256, bos_token_id=0, eos_token_id=0),
    # GemmaRMSNorm, GeGLU (gelu_pytorch_tanh), the sqrt(h) embedding scale
    "gemma": dict(_GQA),
    # + four norms per layer, attention logit soft-capping (50.0) and final logit soft-capping
    # (30.0), Transformers' defaults; Gemma 2 has no SDPA attention (eager only)
    "gemma2": dict(_GQA),
    "gemma2+dropout": dict(_GQA, attention_dropout=0.1),
    # + q/k norms, local and global layers with their own rotary tables (every 2nd layer
    # global here, so that a two-layer model has both)
    "gemma3_text": dict(_GQA, sliding_window_pattern=2),
    # a shared expert of 120 behind a sigmoid gate; norm_topk_prob false (the default)
    "qwen2_moe": dict(_GQA, **_EXPERTS, shared_expert_intermediate_size=120),
    "qwen3_moe": dict(_GQA, **_EXPERTS),
    "qwen3_moe+norm_topk_prob": dict(_GQA, **_EXPERTS, norm_topk_prob=True),
    # Llama's layer with Granite's scalar multipliers (Python floats: nothing kept)
    "granite": dict(_GQA),
    # LayerNorm with biases, a GeLU MLP with biases, rotary positions; no dropout (the profile
    # refuses Starcoder2 with dropout)
    "starcoder2": dict(_GQA),
}
#: every case of :data:`HF_TINY`
HF_CASES: tuple[str, ...] = tuple(HF_TINY)
#: cases whose family has no SDPA attention in Transformers 5.23 (``_supports_sdpa = False``):
#: the profile refuses ``flash_attention=True`` for them
HF_EAGER_ONLY: tuple[str, ...] = tuple(c for c in HF_TINY if c.startswith("gemma2"))
#: the cases that run with both eager and SDPA attention
HF_FAMILIES: tuple[str, ...] = tuple(c for c in HF_CASES if c not in HF_EAGER_ONLY)
_DTYPES = ("bf16", "fp32")
_ATTN = ("eager", "sdpa")
_VOCAB = 256
#: the dropout keys a case may set (zeroed under SDPA, see the module doc)
_DROPOUT_KEYS = ("attention_dropout", "attn_pdrop")


def _hf_config(case: str, attn: str, layers: int = 1):
    import transformers

    family = case.split("+")[0]
    kw = dict(HF_TINY[case], vocab_size=_VOCAB, use_cache=False)
    kw["n_layer" if family == "gpt2" else "num_hidden_layers"] = layers
    if attn == "sdpa":
        for k in _DROPOUT_KEYS:  # CPU SDPA with dropout falls back to fp32 math (module doc)
            if k in kw or family == "gpt2":
                kw[k] = 0.0
    return transformers.AutoConfig.for_model(family, **kw)


def hf_spec(family: str, attn: str = "sdpa", layers: int = 1):
    """The :class:`~parmem.model.ModelSpec` :func:`parmem.ModelSpec.from_hf_config` reads from
    the tiny config of case ``family`` (``layers`` layers)."""
    from parmem.model import ModelSpec

    choice("family", family, HF_CASES)
    choice("attn", attn, _ATTN)
    cfg = _hf_config(family, attn, layers).to_dict()
    return ModelSpec.from_hf_config(cfg, name=f"tiny-{family}")


def _hf_model(case: str, dtype: str, attn: str, layers: int, seed: int, autocast: bool):
    import torch
    import transformers

    choice("family", case, HF_CASES)
    choice("dtype", dtype, _DTYPES)
    choice("attn", attn, _ATTN)
    if autocast and dtype != "fp32":
        raise ValueError("autocast=True runs fp32 weights under bf16 autocast: needs dtype='fp32'")
    torch.manual_seed(seed)
    cfg = _hf_config(case, attn, layers)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=attn)
    return model.to(torch.bfloat16 if dtype == "bf16" else torch.float32).train()


def _forward(model, ids, labels: bool, autocast: bool):
    """The Trainer's forward: the loss when ``labels``, else the logits' sum; under
    ``torch.autocast("cpu", dtype=torch.bfloat16)`` when ``autocast`` (Accelerate's
    ``mixed_precision="bf16"`` wraps the model's forward the same way)."""
    import torch

    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = model(input_ids=ids, labels=ids if labels else None, use_cache=False)
    return out.loss if labels else out.logits.float().sum()


def _predict(spec, seq_len: int, micro_batch: int, attn: str, act: int, device: str, **kw):
    """The ``hf`` profile's bytes of each table on ``device``."""
    from parmem.activations import layer_terms

    return {
        p: sum(
            x.bytes
            for x in layer_terms(
                spec,
                seq_len,
                micro_batch,
                flash=attn == "sdpa",
                act_bytes=act,
                engine="hf",
                device=device,
                place=p,
                **kw,
            )
        )
        for p in ("layer", "stage", "first", "last")
    }


def hf_layer(
    family: str = "llama",
    dtype: str = "bf16",
    attn: str = "sdpa",
    seq_len: int = 24,
    micro_batch: int = 3,
    seed: int = 0,
    autocast: bool = False,
) -> dict:
    """Bytes one Transformers decoder layer of case ``family`` (a key of :data:`HF_TINY`) keeps
    for backward, measured, beside the ``hf`` profile on device ``"cpu"``.

    Returns ``measured`` (distinct storages saved inside the layer's forward, parameters
    excluded), ``predicted`` (the profile's ``layer`` plus ``stage`` tables), ``layer`` and
    ``stage`` (those two parts), ``cuda`` (what the profile predicts for the same layer on a GPU:
    1-byte masks, fp32 LayerNorm statistics) and ``records`` ((bytes, dtype, shape) of every
    saved storage, in the order the forward saved them). ``autocast=True`` (with ``dtype="fp32"``)
    runs the fp32 model under bf16 autocast; ``predicted`` is then the profile's
    ``precision="bf16-autocast"`` accounting.
    """
    import torch

    from parmem.measure import SavedTensorsMeter

    integer("seq_len", seq_len, 1, 4096)
    integer("micro_batch", micro_batch, 1, 64)
    model = _hf_model(family, dtype, attn, 1, seed, autocast)
    body = model.transformer if family == "gpt2" else model.model
    layer = body.h[0] if family == "gpt2" else body.layers[0]
    meter = SavedTensorsMeter(exclude=model.parameters())
    with during_forward(layer, meter):
        ids = torch.randint(0, _VOCAB, (micro_batch, seq_len))
        _forward(model, ids, False, autocast).backward()
    spec = hf_spec(family, attn)
    act = 2 if dtype == "bf16" or autocast else 4
    kw = {"autocast": True} if autocast else {}
    parts = _predict(spec, seq_len, micro_batch, attn, act, "cpu", **kw)
    cuda = _predict(spec, seq_len, micro_batch, attn, act, "cuda", **kw)
    return {
        "family": family,
        "dtype": dtype,
        "attn": attn,
        "measured": meter.bytes,
        "predicted": parts["layer"] + parts["stage"],
        "layer": parts["layer"],
        "stage": parts["stage"],
        "cuda": cuda["layer"] + cuda["stage"],
        "records": meter.records,
    }


def hf_model(
    family: str = "llama",
    dtype: str = "bf16",
    attn: str = "sdpa",
    layers: int = 2,
    seq_len: int = 24,
    micro_batch: int = 3,
    seed: int = 0,
) -> dict:
    """Bytes a whole tiny Transformers causal LM of case ``family`` keeps for backward when its
    forward computes the loss (``labels`` given, as the Trainer runs it), measured, beside the
    ``hf`` profile on device ``"cpu"``: ``layers`` x the ``layer`` table, plus ``stage``,
    ``first`` and ``last``, plus the fp32 log-probabilities the cross-entropy keeps (4·s·b·V,
    the estimate's ``logits``). Returns ``measured``, ``predicted``, the parts and ``records``."""
    import torch

    from parmem.measure import SavedTensorsMeter

    integer("layers", layers, 1, 8)
    model = _hf_model(family, dtype, attn, layers, seed, False)
    ids = torch.randint(0, _VOCAB, (micro_batch, seq_len))
    with SavedTensorsMeter(exclude=model.parameters()) as meter:
        loss = _forward(model, ids, True, False)
    loss.backward()
    spec = hf_spec(family, attn, layers)
    parts = _predict(spec, seq_len, micro_batch, attn, 2 if dtype == "bf16" else 4, "cpu")
    logits = 4 * seq_len * micro_batch * spec.vocab_size
    predicted = layers * parts["layer"] + parts["stage"] + parts["first"] + parts["last"]
    return {
        "family": family,
        "dtype": dtype,
        "attn": attn,
        "measured": meter.bytes,
        "predicted": predicted + logits,
        **parts,
        "logits": logits,
        "records": meter.records,
    }


# ---------------------------------------------------------------------------- torchtitan
class _Any:
    """A placeholder that accepts any call, attribute or decoration."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return _Any()

    def __getattr__(self, name: str) -> Any:
        return _Any()


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (_Any,), {})


_TRITON = ("triton", "triton.language", "triton.runtime", "triton.runtime.jit")


@contextlib.contextmanager
def _placeholders(names: tuple[str, ...], stub: bool) -> Iterator[None]:
    """With ``stub``: placeholder modules for ``names`` (a package first, then its submodules)
    in ``sys.modules`` during the ``with`` block only; afterwards an import finds the real ones."""
    if stub:
        for n in names:
            mod = _StubModule(n)
            mod.__path__ = []
            sys.modules[n] = mod
            parent, _, child = n.rpartition(".")
            if parent:
                setattr(sys.modules[parent], child, mod)
    try:
        yield
    finally:
        if stub:
            for n in names:
                sys.modules.pop(n, None)


@contextlib.contextmanager
def during_forward(module: Any, ctx: Any) -> Iterator[Any]:
    """Enter the context ``ctx`` (a saved-tensors meter) for the span of each forward of
    ``module`` only: a forward pre-hook enters it, a forward hook leaves it; the hooks are
    removed on leaving the ``with`` block."""

    def enter(*_: Any) -> None:  # a pre-hook's return value would replace the module's input
        ctx.__enter__()

    handles = [
        module.register_forward_pre_hook(enter),
        module.register_forward_hook(lambda *a: ctx.__exit__(None, None, None)),
    ]
    try:
        yield ctx
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def triton_stub() -> Iterator[None]:
    """Import torchtitan where ``triton`` is not installed (the CPU build of PyTorch): its model
    modules import triton for GPU kernels they do not use on CPU. Placeholders stand in for
    triton during the ``with`` block only, after PyTorch's own optional triton imports ran."""
    stub = importlib.util.find_spec("triton") is None
    if stub:
        import torch._dynamo  # noqa: F401
        import torch._inductor.compile_fx  # noqa: F401
        import torch.distributed.pipelining  # noqa: F401
        import torch.utils.flop_counter  # noqa: F401
    with _placeholders(_TRITON, stub):
        yield


#: what torchtitan's Llama 3 config registry imports from Hugging Face ``datasets`` (for its data
#: loaders, which a one-step run with its own tokens never builds)
_DATASETS = ("datasets", "datasets.distributed")


@contextlib.contextmanager
def datasets_stub() -> Iterator[None]:
    """Placeholders for Hugging Face ``datasets`` during the ``with`` block, unless it is already
    imported: torchtitan's config registry imports its data loaders, and ``datasets`` (with
    pandas and pyarrow) costs about a second of CPU in every rank that imports it, for a run that
    loads no data. Afterwards ``import datasets`` finds the real package."""
    with _placeholders(_DATASETS, _DATASETS[0] not in sys.modules):
        yield


def torchtitan_modules() -> types.SimpleNamespace:
    """torchtitan 0.3.0's Llama 3 config registry, ``parallelize_llama``, ``ParallelDims``,
    attention classes and distributed utilities, imported under :func:`triton_stub` and
    :func:`datasets_stub`."""
    with triton_stub(), datasets_stub():
        import torchtitan.distributed.parallel_dims as parallel_dims  # type: ignore[import-untyped]
        from torchtitan.distributed import utils as dist_utils
        from torchtitan.models.common.attention import (  # type: ignore[import-untyped]
            ScaledDotProductAttention,
        )
        from torchtitan.models.llama3 import (  # type: ignore[import-untyped]
            config_registry,
            parallelize_llama,
        )
    return types.SimpleNamespace(
        registry=config_registry,
        parallelize_llama=parallelize_llama,
        parallel_dims=parallel_dims,
        ParallelDims=parallel_dims.ParallelDims,
        dist_utils=dist_utils,
        SDPA=ScaledDotProductAttention,
    )


def torchtitan_spec(layers: int = 6):
    """The :class:`~parmem.model.ModelSpec` of torchtitan's Llama 3 ``debugmodel`` (its
    ``_debugmodel``: dim 256, 16 heads, ffn 768 = compute_ffn_hidden_dim(256, multiple_of=256),
    vocabulary 2048, untied, RMSNorm, SwiGLU, no dropout)."""
    from parmem.model import ModelSpec

    return ModelSpec(
        name="torchtitan-llama3-debugmodel",
        vocab_size=2048,
        hidden=256,
        layers=layers,
        heads=16,
        ffn_hidden=768,
        ffn_kind="swiglu",
        norm="rmsnorm",
        position="rotary",
        max_positions=131072,
        dropout=0.0,
        source="torchtitan 0.3.0 models/llama3/__init__.py _debugmodel",
    )


def _torchtitan_model(tt, seq_len: int):
    """torchtitan's debugmodel, parallelized by its own ``parallelize_llama`` over the pool's
    ranks as FSDP (dp_shard = world size), on CPU (the changes named in the module doc)."""
    import torch
    import torch.distributed as dist

    cfg = tt.registry.llama3_debugmodel()
    cfg.parallelism.spmd_backend = "partial_dtensor"
    cfg.training.seq_len = seq_len
    tt.dist_utils.set_spmd_backend(cfg.parallelism.spmd_backend)
    mc = cfg.model_spec.model
    for block in mc.layers:
        block.attention.inner_attention = tt.SDPA.Config()
    mc.update_from_config(config=cfg)
    with torch.device("meta"):
        model = mc.build()
    d = dist.get_world_size()
    tt.parallel_dims.device_type = "cpu"
    dims = tt.ParallelDims(
        dp_replicate=1,
        dp_shard=d,
        cp=1,
        tp=1,
        pp=1,
        ep=1,
        world_size=d,
        spmd_backend=cfg.parallelism.spmd_backend,
    )
    dims.build_mesh()
    model = tt.parallelize_llama(
        model,
        parallel_dims=dims,
        training=cfg.training,
        parallelism=cfg.parallelism,
        compile_config=cfg.compile,
        ac_config=None,
        dump_folder="/tmp",
    )
    return cfg, model


def record_comms(model, force_sum: bool = True) -> dict[str, list[tuple[int, str]]]:
    """Record every FSDP all-gather output and reduce-scatter input (bytes, dtype) per FSDP
    module, through FSDP2's public custom-collective hooks (FSDP2's default collectives,
    unchanged). ``force_sum``: reduce-scatter as a sum without a pre-multiplied divisor (gloo has
    no ``PREMUL_SUM``; torchtitan sets the divide factor to 1, so the gradients are the same)."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import (
        DefaultAllGather,
        DefaultReduceScatter,
    )

    seen: dict[str, list[tuple[int, str]]] = {}

    def note(key: str, out) -> None:
        seen.setdefault(key, []).append((out.numel() * out.element_size(), str(out.dtype)))

    class AllGather(DefaultAllGather):
        def __init__(self, key: str) -> None:
            self.key = key

        def allocate(self, size, *, dtype, device):
            out = super().allocate(size, dtype=dtype, device=device)
            note(self.key, out)
            return out

    class ReduceScatter(DefaultReduceScatter):
        def __init__(self, key: str) -> None:
            self.key = key

        def allocate(self, size, *, dtype, device):
            out = super().allocate(size, dtype=dtype, device=device)
            note(self.key, out)
            return out

    for name, m in model.named_modules():
        if isinstance(m, FSDPModule):
            if force_sum:
                m.set_force_sum_reduction_for_comms(True)
            m.set_custom_all_gather(AllGather(f"all_gather:{name}"))
            m.set_custom_reduce_scatter(ReduceScatter(f"reduce_scatter:{name}"))
    return seen


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence torchtitan's root-logger warnings about options this run does not use (an
    initial checkpoint path) and DTensor's warning about random ops on a CPU mesh."""
    import logging
    import warnings

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        root.setLevel(level)


def demo_torchtitan(seq_len: int = 64, micro_batch: int = 2) -> dict:
    """One AdamW step of torchtitan's FSDP2-sharded Llama 3 debugmodel on this rank; the bytes
    it holds beside the ``fsdp2`` profile: see :func:`torchtitan_step`. Warnings about options
    the run does not use are silenced."""
    integer("seq_len", seq_len, 2, 4096)
    integer("micro_batch", micro_batch, 1, 64)
    with quiet():
        return torchtitan_step(seq_len, micro_batch)


def torchtitan_step(seq_len: int, micro_batch: int) -> dict:
    """One AdamW step of torchtitan's FSDP2-sharded Llama 3 debugmodel on this rank (inside a
    pool's worker), the bytes it holds beside the ``fsdp2`` profile (:func:`parmem.estimate`
    with d = world size, ZeRO-3). See the module doc for what a CPU run changes.

    Returns ``num_params``; measured ``params``, ``grads``, ``optimizer`` (this rank's shards),
    ``param_tensors``, ``all_gather`` and ``reduce_scatter`` (the largest buffer of one block,
    with its dtype), ``block_saved`` (one block's saved tensors, unsharded weights excluded);
    and the profile's ``est_params``, ``est_grads``, ``est_optimizer``, ``est_comm`` (the
    ZeRO-3 buffers: two blocks' bf16 weights and one block's fp32 gradients), ``est_layer``
    (one layer's bf16 parameters) and ``est_block_saved`` (the layer table on device cpu).
    """
    import torch
    import torch.distributed as dist

    from parmem import ParallelConfig, TrainingSetup, estimate
    from parmem.activations import layer_terms
    from parmem.measure import SavedTensorsMeter, state_bytes
    from parmem.sharding import stage_params

    tt = torchtitan_modules()
    cfg, model = _torchtitan_model(tt, seq_len)
    comms = record_comms(model)
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    model.train()
    opt = cfg.optimizer.build(model_parts=[model])
    box: dict[str, Any] = {}
    block = model.layers["0"]

    def enter(mod, *_):  # runs after FSDP's pre-forward: the block's weights are unsharded
        box["meter"] = SavedTensorsMeter(exclude=list(mod.parameters())).__enter__()

    hooks = [
        block.register_forward_pre_hook(enter),
        block.register_forward_hook(lambda *a: box["meter"].__exit__(None, None, None)),
    ]
    g = torch.Generator().manual_seed(dist.get_rank())
    tokens = torch.randint(0, 2048, (micro_batch, seq_len), generator=g)
    positions = torch.arange(seq_len).repeat(micro_batch, 1)
    logits = model(tokens, positions=positions)
    for h in hooks:
        h.remove()
    torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens.flatten()).backward()
    opt.step()
    measured = state_bytes(model, opt.optimizers[0])
    spec = torchtitan_spec(len(model.layers))
    est = estimate(
        spec,
        ParallelConfig(dp=dist.get_world_size(), zero=3),
        TrainingSetup(
            seq_len=seq_len, micro_batch=micro_batch, engine="fsdp2", flash_attention=True
        ),
    ).stages[0]
    blocks = [f"layers.{name}" for name in model.layers]
    ag = max(comms[f"all_gather:{b}"][0] for b in blocks)  # the forward all-gather
    rs = max(comms[f"reduce_scatter:{b}"][0] for b in blocks)  # the unsharded input
    saved = layer_terms(spec, seq_len, micro_batch, flash=True, engine="fsdp2", device="cpu")
    return {
        "num_params": sum(p.numel() for p in model.parameters()),
        "params": measured.params,
        "grads": measured.grads,
        "optimizer": measured.optimizer,
        "param_tensors": measured.detail["num_param_tensors"],
        "all_gather": ag[0],
        "all_gather_dtype": ag[1],
        "reduce_scatter": rs[0],
        "reduce_scatter_dtype": rs[1],
        "block_saved": box["meter"].bytes,
        "est_params": est.params,
        "est_grads": est.grads,
        "est_optimizer": est.optimizer,
        "est_comm": est.comm_buffers,
        "est_layer": 2 * sum(stage_params(spec, 1, 1, 1, False, False)),
        "est_block_saved": sum(x.bytes for x in saved),
    }
