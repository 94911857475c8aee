"""torchtitan 0.3.0's own FSDP2 training step on CPU gloo ranks, recorded for ``fsdp2``.

The runner of ``scripts/record_engine_runs.py --engine fsdp2``
(:mod:`parmem.engine_records` describes a record). Every case builds a model torchtitan ships
from its own config registry, parallelizes it with the model's own ``parallelize_fn`` (and,
under pipeline parallelism, torchtitan's ``pipeline_llm`` with its pipeline schedule), builds the
AdamW of torchtitan's optimizer container and takes one step:

* ``llama3-fsdp``: Llama 3 ``debugmodel``, FSDP2 over 2 ranks (dp_shard 2);
* ``llama3-fsdp-tp``: the same on a 2 x 2 mesh, dp_shard 2 x tp 2 with torchtitan's sequence
  parallelism and vocab-parallel loss (its defaults);
* ``llama3-fsdp-pp``: the same on a 2 x 2 mesh, pp 2 x dp_shard 2, torchtitan's default
  schedule (1F1B) over 4 micro-batches, with torchtitan's default ``reshard_after_forward``
  policy, which is ``False`` under PP;
* ``dsv3-moe-fsdp``: DeepSeek-V3 ``debugmodel`` (MLA, 8 routed experts top-3, 2 shared experts,
  one dense layer first), FSDP2 over 2 ranks, expert parallelism 1; held against the model
  states and buffers alone (``states_only``), since the fsdp2 activation table refuses MLA.

Per rank at the end of the step (after ``optimizer.step()``): parameter, gradient and optimizer
bytes (:func:`parmem.measure.state_bytes`); FSDP2's buffers (``comm_buffers``, below); and,
without PP, the tensors the micro-batch's forward and loss keep for backward (``saved``;
:class:`parmem.measure.SavedTensorsMeter`, parameters and FSDP's unsharded weights excluded).

``comm_buffers`` without PP is the profile's ZeRO-3 working set measured piece by piece through
FSDP2's custom-collective hooks (:func:`parmem.distributed.engine_runs.record_comms`): twice the
largest all-gather output of a block (the current and the prefetched block's bf16 weights; the
factor 2 is the profile's, a synchronous CPU run cannot show the prefetch) plus the largest
reduce-scatter input of a block (its fp32 gradients). Under PP it is measured whole: every
unsharded bf16 weight and fp32 accumulated gradient of the stage when the schedule calls
``perform_reduce_grad`` (after the last micro-batch's backward), plus the stage's receive
buffers. The facts keep each piece.

What a CPU run changes (besides what :mod:`parmem.distributed.engine_runs` names for torchtitan:
``device_type`` cpu, ``spmd_backend="partial_dtensor"``, torchtitan's
``ScaledDotProductAttention`` for ``FlexAttention``, summed reduce-scatters, no activation
checkpointing): the loss is torchtitan's own ``CrossEntropyLoss`` without the
``ChunkedLossWrapper`` its registries wrap it in (held against the profile's whole loss,
``loss_chunks`` 0; :func:`chunked_loss_peak_bytes` measures the wrapper itself); no
gradient clipping (it allocates temporaries only); ``nn.RMSNorm`` keeps what its CPU composite
keeps (the named difference ``cpu-rmsnorm``); and the pipeline schedule is stepped
with the whole batch, as torch 2.13's ``PipelineScheduleSingle.step`` takes it.
"""

from __future__ import annotations

import types
from typing import Any

from parmem.distributed.engine_runs import (
    datasets_stub,
    quiet,
    record_comms,
    torchtitan_spec,
    triton_stub,
)

__all__ = ["ENGINE", "CASES", "record", "dsv3_spec", "FAMILIES", "chunked_loss_peak_bytes"]

#: the parmem profile these runs are held against
ENGINE = "fsdp2"

#: the torchtitan model families a case may build
FAMILIES = ("llama3", "deepseek_v3")

_COMMON = dict(seq_len=64, micro_batch=2)
#: case -> (world size, keyword arguments of :func:`record`)
CASES: dict[str, tuple[int, dict[str, Any]]] = {
    "llama3-fsdp": (2, dict(family="llama3", dp=2, **_COMMON)),
    "llama3-fsdp-tp": (4, dict(family="llama3", dp=2, tp=2, **_COMMON)),
    "llama3-fsdp-pp": (
        4,
        dict(family="llama3", dp=2, pp=2, seq_len=64, micro_batch=1, microbatches=4),
    ),
    "dsv3-moe-fsdp": (2, dict(family="deepseek_v3", dp=2, **_COMMON)),
}


def dsv3_spec(layers: int = 6):
    """The :class:`~parmem.model.ModelSpec` of torchtitan's DeepSeek-V3 ``debugmodel``
    (models/deepseek_v3/__init__.py ``_debugmodel``: dim 256, 16 heads, MLA with q_lora_rank 0,
    kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128; one dense
    layer of ffn 1024, then MoE layers of 8 routed experts (top 3, expert ffn 256) and 2 shared
    experts; vocabulary 2048, untied, RMSNorm, SwiGLU, no dropout)."""
    from parmem.model import ModelSpec

    return ModelSpec(
        name="torchtitan-deepseek-v3-debugmodel",
        vocab_size=2048,
        hidden=256,
        layers=layers,
        heads=16,
        head_dim=192,  # qk_nope_head_dim + qk_rope_head_dim (parmem's MLA convention)
        ffn_hidden=1024,
        ffn_kind="swiglu",
        norm="rmsnorm",
        position="rotary",
        max_positions=16384,
        num_experts=8,
        top_k=3,
        expert_ffn_hidden=256,
        shared_experts=2,
        first_dense_layers=1,
        q_lora_rank=0,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        v_head_dim=128,
        dropout=0.0,
        source="torchtitan 0.3.0 models/deepseek_v3/__init__.py _debugmodel",
    )


def _titan(family: str) -> types.SimpleNamespace:
    """torchtitan's config registry of ``family``, its losses, ``ParallelDims``, ``pipeline_llm``
    and attention classes, imported under the placeholders of
    :mod:`parmem.distributed.engine_runs`."""
    with triton_stub(), datasets_stub():
        import torchtitan.distributed.parallel_dims as parallel_dims  # type: ignore[import-untyped]
        from torchtitan.components.loss import CrossEntropyLoss  # type: ignore[import-untyped]
        from torchtitan.distributed import utils as dist_utils
        from torchtitan.distributed.pipeline_parallel import (  # type: ignore[import-untyped]
            pipeline_llm,
        )
        from torchtitan.models.common.attention import (  # type: ignore[import-untyped]
            ScaledDotProductAttention,
        )

        if family == "llama3":
            from torchtitan.models.llama3 import config_registry  # type: ignore[import-untyped]

            make = config_registry.llama3_debugmodel
        else:
            from torchtitan.models.deepseek_v3 import (  # type: ignore[import-untyped]
                config_registry,
            )

            make = config_registry.deepseek_v3_debugmodel
    return types.SimpleNamespace(
        make=make,
        CrossEntropyLoss=CrossEntropyLoss,
        parallel_dims=parallel_dims,
        dist_utils=dist_utils,
        pipeline_llm=pipeline_llm,
        SDPA=ScaledDotProductAttention,
    )


class _Unsharded:
    """The bytes FSDP2 holds unsharded for the modules of ``parts``: the storage of every
    parameter's all-gather output (its unsharded bf16 weight) and of its fp32 accumulated
    gradient (kept between micro-batches when gradient sync is off)."""

    def __init__(self, parts) -> None:
        from torch.distributed.fsdp import FSDPModule

        found: dict[int, Any] = {}  # fully_shard([norm, lm_head]): one state, two modules
        for part in parts:
            for m in part.modules():
                if isinstance(m, FSDPModule):
                    for group in m._get_fsdp_state()._fsdp_param_groups:
                        found.update((id(p), p) for p in group.fsdp_params)
        self.params = list(found.values())

    def bytes(self) -> tuple[int, int]:
        weights = grads = 0
        for p in self.params:
            for t in getattr(p, "all_gather_outputs", ()) or ():
                weights += t.untyped_storage().nbytes()
            g = getattr(p, "unsharded_accumulated_grad", None)
            if g is not None:
                grads += g.untyped_storage().nbytes()
        return weights, grads


def _recv_buffers(stage) -> tuple[int, int]:
    """The bytes of a pipeline stage's receive buffers (torch.distributed.pipelining
    preallocates one per micro-batch: activations from the previous stage, gradients from the
    next), and of the gradients autograd left in the activation buffers."""
    from parmem.measure import tensor_storage_bytes

    infos = [i for t in stage.args_recv_info.values() for i in t] + [
        i for t in stage.grad_recv_info.values() for i in t
    ]
    bufs = [i.buffer for i in infos if not i.is_root_arg and i.buffer is not None]
    return tensor_storage_bytes(bufs), tensor_storage_bytes(b.grad for b in bufs)


def _config(tt, family, seq_len, micro_batch, microbatches, dp, tp, pp, layers):
    cfg = tt.make()
    par = cfg.parallelism
    par.spmd_backend = "partial_dtensor"
    par.data_parallel_shard_degree = dp
    par.tensor_parallel_degree = tp
    par.pipeline_parallel_degree = pp
    par.pipeline_parallel_microbatch_size = micro_batch
    par.pipeline_parallel_schedule = "1F1B"
    cfg.training.seq_len = seq_len
    cfg.training.local_batch_size = micro_batch * microbatches
    # torchtitan's own cross-entropy, without the registry's ChunkedLossWrapper (module doc)
    cfg.loss = tt.CrossEntropyLoss.Config(global_vocab_size=2048)
    mc = cfg.model_spec.model
    if layers is not None:
        mc.layers = mc.layers[:layers]
    for block in mc.layers:
        block.attention.inner_attention = tt.SDPA.Config()
    tt.dist_utils.set_spmd_backend(par.spmd_backend)
    mc.update_from_config(config=cfg)
    return cfg


def _build(tt, cfg, dp, tp, pp):
    """Build the model on meta, parallelize it as torchtitan's Trainer does, and materialise
    it on CPU. Returns (model parts, pipeline schedule or None, stages, the loss)."""
    import torch
    import torch.distributed as dist

    mc = cfg.model_spec.model
    with torch.device("meta"):
        model = mc.build()
    tt.parallel_dims.device_type = "cpu"
    dims = tt.parallel_dims.ParallelDims(
        dp_replicate=1,
        dp_shard=dp,
        cp=1,
        tp=tp,
        pp=pp,
        ep=1,
        world_size=dist.get_world_size(),
        spmd_backend=cfg.parallelism.spmd_backend,
    )
    dims.build_mesh()
    loss_fn = cfg.loss.build(compile_config=cfg.compile)
    common = dict(
        parallel_dims=dims,
        training=cfg.training,
        parallelism=cfg.parallelism,
        compile_config=cfg.compile,
        ac_config=None,
        dump_folder="/tmp",
    )
    schedule = None
    if pp > 1:
        schedule, parts, _, _ = tt.pipeline_llm(
            model,
            device=torch.device("cpu"),
            model_config=mc,
            parallelize_fn=cfg.model_spec.parallelize_fn,
            loss_fn=loss_fn,
            **common,
        )
    else:
        parts = [cfg.model_spec.parallelize_fn(model, **common)]
    for m in parts:
        m.to_empty(device="cpu")
        with torch.no_grad():
            m.init_weights(buffer_device=None)
        m.train()
    return parts, schedule, dims, loss_fn


def _rmsnorm_counter(parts):
    """Forward hooks on every ``nn.RMSNorm``: the elements (on this rank) each normalised."""
    import torch

    box = {"elements": 0, "calls": 0}

    def hook(mod, args):
        x = args[0]
        x = x.to_local() if hasattr(x, "to_local") else x
        box["elements"] += x.numel()
        box["calls"] += 1

    handles = [
        m.register_forward_pre_hook(hook)
        for part in parts
        for m in part.modules()
        if isinstance(m, torch.nn.RMSNorm)
    ]
    return box, handles


def _unsharded_exclusions(parts, meter):
    """Hooks that exclude each FSDP module's unsharded weights from ``meter`` while the module's
    forward runs (FSDP registers them in the module between its pre- and post-forward): they
    are FSDP's buffers, not activations. The exclusion ends with the forward, since a storage
    FSDP frees afterwards may be reused by an activation at the same address."""
    from torch.distributed.fsdp import FSDPModule

    from parmem.measure import storage_key_and_bytes

    added: dict[int, set] = {}

    def pre(mod, *_):
        keys = {storage_key_and_bytes(p)[0] for p in mod.parameters()} - meter._exclude
        added[id(mod)] = keys
        meter._exclude |= keys

    def post(mod, *_):
        meter._exclude -= added.pop(id(mod), set())

    mods = [m for part in parts for m in part.modules() if isinstance(m, FSDPModule)]
    return [m.register_forward_pre_hook(pre) for m in mods] + [
        m.register_forward_hook(post) for m in mods
    ]


def record(
    case: str,
    family: str = "llama3",
    dp: int = 2,
    tp: int = 1,
    pp: int = 1,
    seq_len: int = 64,
    micro_batch: int = 2,
    microbatches: int = 1,
    layers: int | None = None,
) -> dict:
    """One torchtitan step of ``family`` on this rank's share of the (dp, tp, pp) mesh; the
    record of :mod:`parmem.engine_records` (warnings about unused options silenced)."""
    with quiet():
        return _record(case, family, dp, tp, pp, seq_len, micro_batch, microbatches, layers)


def _plain_step(rec, parts, loss_fn, tokens, labels, positions, family, dp, tp) -> None:
    """Forward, loss and backward without PP; the saved tensors of the micro-batch."""
    import torch

    from parmem.measure import SavedTensorsMeter

    facts, measured, named = rec["facts"], rec["measured"], rec["named"]
    model = parts[0]
    norms, handles = _rmsnorm_counter(parts)
    meter = SavedTensorsMeter(exclude=model.parameters())
    handles += _unsharded_exclusions(parts, meter)
    gvt = torch.tensor(labels.numel() * dp, dtype=torch.int64)
    with meter:
        pred = model(tokens, positions=positions)
        loss, _ = loss_fn(pred, labels, gvt)
    for h in handles:
        h.remove()
    del pred
    loss.backward()
    facts["rmsnorm_elements"] = norms["elements"]
    facts["rmsnorm_calls"] = norms["calls"]
    facts["saved_by_dtype"] = meter.by_dtype
    if family == "llama3":
        measured["saved"] = meter.bytes
        named["saved"] = ["cpu-rmsnorm"]
        if tp > 1:
            named["saved"] += ["torchtitan-tp-embedding-mask", "loss-parallel-no-total-weight"]
    else:  # MLA on CPU: SDPA's math fallback; kept as a fact only
        facts["saved_cpu_not_compared"] = meter.bytes
        rec["notes"].append(
            "saved tensors not compared: CPU SDPA has no fused kernel for MLA's query/key "
            "head dim 192 != value head dim 128 and runs the fp32 math fallback"
        )


def _pipeline_step(rec, parts, schedule, tokens, labels, seq_len, dp) -> int:
    """One step of the pipeline schedule; the stage's unsharded weights and gradients and its
    receive buffers when the schedule reduce-scatters. Returns the stage index."""
    import torch

    facts = rec["facts"]
    stage = schedule._stage
    unsharded = _Unsharded(parts)
    box: dict[str, Any] = {}
    reduce = stage.perform_reduce_grad

    def snapshot_then_reduce(*a, **k):
        box["unsharded"] = unsharded.bytes()
        box["recv"] = _recv_buffers(stage)
        return reduce(*a, **k)

    stage.perform_reduce_grad = snapshot_then_reduce
    gvt = torch.tensor(labels.numel() * dp, dtype=torch.int64)
    # torch 2.13's PipelineScheduleSingle.step takes the whole batch and splits it into
    # micro-batches (torchtitan 0.3.0's trainer passes pre-split arg_mbs/kwarg_mbs, which this
    # torch's step() would read as model keyword arguments)
    schedule.step(
        *((tokens,) if stage.is_first else ()),
        positions=torch.arange(seq_len).repeat(tokens.shape[0], 1),
        target=labels if stage.is_last else None,
        losses=[] if stage.is_last else None,
        loss_kwargs={"global_valid_tokens": gvt},
        return_outputs=False,
    )
    facts["stage_unsharded_weights"], facts["stage_unsharded_grads"] = box["unsharded"]
    facts["pp_recv_buffers"], facts["pp_recv_buffer_grads"] = box["recv"]
    facts["stage_modules"] = [n for n, _ in parts[0].named_children()]
    facts["stage_layers"] = list(parts[0].layers.keys())
    return stage.stage_index


def _comm_record(rec, seen, pipelined: bool, tp: int) -> None:
    """FSDP2's buffers: the largest block all-gather output and reduce-scatter input, and the
    comm_buffers category (module doc)."""
    facts, measured, named = rec["facts"], rec["measured"], rec["named"]
    comms = {k: v for d in seen for k, v in d.items()}
    blocks = [k for k in comms if k.startswith("all_gather:layers.")]
    ag = max((comms[k][0] for k in blocks), default=(0, "none"))
    rs_keys = [k.replace("all_gather:", "reduce_scatter:") for k in blocks]
    rs = max((comms[k][0] for k in rs_keys if k in comms), default=(0, "none"))
    facts["block_all_gather"], facts["block_all_gather_dtype"] = ag
    facts["block_reduce_scatter"], facts["block_reduce_scatter_dtype"] = rs
    facts["comm_units"] = sorted(k.split(":", 1)[1] for k in comms if k.startswith("all_gather"))
    if not pipelined:
        # the current and the prefetched block's bf16 weights, one block's fp32 gradients
        measured["comm_buffers"] = 2 * ag[0] + rs[0]
        if tp > 1:
            named["comm_buffers"] = ["tp-collective-output-not-measured"]
    else:
        measured["comm_buffers"] = (
            facts["stage_unsharded_weights"]
            + facts["stage_unsharded_grads"]
            + facts["pp_recv_buffers"]
            + facts["pp_recv_buffer_grads"]
        )
        named["comm_buffers"] = ["pipelining-recv-buffers"]


def _record(case, family, dp, tp, pp, seq_len, micro_batch, microbatches, layers) -> dict:
    import torch
    import torch.distributed as dist

    from parmem.measure import state_bytes

    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    if dp * tp * pp != dist.get_world_size():
        raise ValueError(f"dp x tp x pp = {dp * tp * pp} != world size {dist.get_world_size()}")
    tt = _titan(family)
    cfg = _config(tt, family, seq_len, micro_batch, microbatches, dp, tp, pp, layers)
    parts, schedule, dims, loss_fn = _build(tt, cfg, dp, tp, pp)
    seen = [record_comms(m) for m in parts]
    opt = cfg.optimizer.build(model_parts=parts)
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(1000 + rank)
    tokens = torch.randint(0, 2048, (micro_batch * microbatches, seq_len), generator=g)
    labels = torch.randint(0, 2048, (micro_batch * microbatches, seq_len), generator=g)
    rec: dict[str, Any] = {
        "rank": rank,
        "stage": 0,
        "measured": {},
        "named": {"optimizer": ["adamw-step-counters"]},
        "facts": {},
        "notes": [
            "CPU gloo ranks; torchtitan ScaledDotProductAttention for FlexAttention; "
            "spmd_backend partial_dtensor; summed reduce-scatters (gloo has no PREMUL_SUM)",
            "loss: torchtitan CrossEntropyLoss without the registry's ChunkedLossWrapper; "
            "no activation checkpointing; no gradient clipping",
        ],
    }
    if family != "llama3":  # MLA: the fsdp2 activation table refuses it (estimate raises)
        rec["states_only"] = True
        rec["notes"].append(
            "states_only: parmem's fsdp2 activation table does not model multi-latent "
            "attention (refused by name), so the model states and buffers are compared alone"
        )
    facts = rec["facts"]
    if schedule is None:
        positions = torch.arange(seq_len).repeat(micro_batch, 1)
        _plain_step(rec, parts, loss_fn, tokens, labels, positions, family, dp, tp)
    else:
        rec["stage"] = _pipeline_step(rec, parts, schedule, tokens, labels, seq_len, dp)
    opt.step()
    st = state_bytes(torch.nn.ModuleList(parts), opt.optimizers[0])
    facts["param_tensors"] = st.detail["num_param_tensors"]
    facts["num_params_local"] = sum(
        (p.to_local() if hasattr(p, "to_local") else p).numel()
        for m in parts
        for p in m.parameters()
    )
    facts["num_params"] = sum(p.numel() for m in parts for p in m.parameters())
    rec["measured"].update(params=st.params, grads=st.grads, optimizer=st.optimizer)
    _comm_record(rec, seen, schedule is not None, tp)

    # the record's model: the whole model the ranks built, counted exactly
    n_layers = len(cfg.model_spec.model.layers)
    spec = torchtitan_spec(n_layers) if family == "llama3" else dsv3_spec(n_layers)
    whole = facts["num_params"]
    if pp > 1:
        whole = sum(_axis_values(facts["num_params"], dims, "pp"))
    facts["num_params_whole"] = whole
    if spec.num_params() != whole:
        raise AssertionError(f"{spec.name}: spec counts {spec.num_params():,}, built {whole:,}")
    setup = dict(
        engine=ENGINE,
        seq_len=seq_len,
        micro_batch=micro_batch,
        num_microbatches=microbatches,
        flash_attention=True,
        recompute="none",
    )
    if pp > 1:
        setup["schedule"] = "1f1b"
    rec.update(
        model=spec.to_dict(),
        parallel=dict(dp=dp, tp=tp, pp=pp, zero=3, sp=tp > 1),
        setup=setup,
    )
    return rec


def _axis_values(value: int, dims, axis: str) -> list[int]:
    """``value`` of every rank of this rank's ``axis`` sub-mesh (an all-gather)."""
    import torch
    import torch.distributed as dist

    group = dims.get_mesh(axis).get_group()
    out = [torch.zeros((), dtype=torch.int64) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, torch.tensor(value, dtype=torch.int64), group=group)
    return [int(x) for x in out]


def chunked_loss_peak_bytes(
    seq: int, vocab: int, hidden: int = 64, chunks: int = 8, batch: int = 1
) -> dict[str, int]:
    """The peak bytes of torchtitan 0.3.0's ``ChunkedLossWrapper`` (``components/loss.py``, the
    loss of its own Llama 3 configs) as its trainer runs it: a bias-free ``hidden`` → ``vocab``
    LM head under ``fully_shard`` with torchtitan's mixed-precision policy (fp32 parameters,
    bf16 compute, fp32 reduction: ``config/configs.py``, ``llama3/parallelize.py``) on this
    rank's process group, ``batch`` sequences of ``seq`` bf16 hidden states and ``chunks``
    chunks; its forward and the backward it runs itself, up to the loss it returns (whose
    backward hands the decoder the gathered gradient). Run it on a rank:
    ``Pool(world_size=1).run("parmem.distributed.runs_fsdp2:chunked_loss_peak_bytes", ...)``.

    Returns ``peak``, the peak of live tensor storages above those that exist before it runs
    (the hidden states, the labels, the head's sharded fp32 weight;
    :class:`parmem.traces.record_allocations`), and ``kept``, what is still live when it returns
    (the gradient it keeps for the decoder's backward, with the head's gradient).
    :func:`parmem.estimate.loss_pieces` and :func:`parmem.estimate.kept_logits` are held
    against them in ``tests/test_measure.py``."""
    from .._check import integer

    seq = integer("seq", seq, 1, 1 << 16)
    vocab = integer("vocab", vocab, 2, 1 << 20)
    hidden = integer("hidden", hidden, 1, 1 << 12)
    chunks = integer("chunks", chunks, 1, seq)
    batch = integer("batch", batch, 1, 1 << 10)
    if seq % chunks:
        raise ValueError(f"chunks={chunks} must divide seq={seq} (ChunkedLossWrapper's rule)")
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from ..traces import record_allocations

    if not dist.is_initialized():
        raise ValueError("chunked_loss_peak_bytes runs FSDP2: run it on a rank, "
                         "parmem.distributed.Pool(world_size=1)")  # fmt: skip
    with triton_stub(), datasets_stub():
        from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
    cfg = ChunkedLossWrapper.Config(
        num_chunks=chunks, loss_fn=CrossEntropyLoss.Config(global_vocab_size=vocab)
    )
    wrapper = ChunkedLossWrapper(cfg)
    gen = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(hidden, vocab, bias=False)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    fully_shard(head, mesh=mesh, mp_policy=mp)
    wrapper.set_lm_head(head)
    x = torch.randn(batch, seq, hidden, generator=gen).to(torch.bfloat16).requires_grad_()
    states = x * 1  # the decoder's output: a tensor of the autograd graph, not a leaf
    labels = torch.randint(0, vocab, (batch, seq), generator=gen)
    valid = torch.tensor(batch * seq)
    before = (x, states, labels, valid, *(p.to_local() for p in head.parameters()))
    held = sum(t.untyped_storage().nbytes() for t in before)
    with record_allocations(track=before) as rec:
        loss, _ = wrapper(states, labels, valid)
        kept = rec.live_bytes()
    return {"peak": rec.peak_bytes() - held, "kept": kept - held, "loss": loss.detach().item()}
