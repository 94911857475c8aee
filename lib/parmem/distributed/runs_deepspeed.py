"""DeepSpeed's own training step on CPU gloo ranks, what every rank held, beside the ``deepspeed``
profile (``scripts/record_engine_runs.py --engine deepspeed``; the records are read by
:mod:`parmem.engine_records`).

Each case builds a tiny Transformers 5.23 model (``LlamaForCausalLM`` or ``MixtralForCausalLM``
from a tiny config), hands it to ``deepspeed.initialize`` (DeepSpeed 0.19.8) with a ZeRO config,
bf16 and DeepSpeed's ``AdamW`` (its ``FusedAdam``, as on a GPU), and runs two training steps
(``engine(...)``, ``engine.backward``, ``engine.step``) on two ranks; the second step is
measured (the first one records ZeRO-3's module trace, after which prefetching applies).

The engine runs unchanged on CPU: ``DS_ACCELERATOR=cpu`` (set in the worker before DeepSpeed is
imported) selects DeepSpeed's CPU accelerator, whose communication backend falls back to gloo
when oneCCL's bindings are absent (``accelerator/cpu_accelerator.py``); ``deepspeed.
init_distributed`` finds the default process group the pool already initialised and uses it.

What is measured, and where: DeepSpeed frees its 16-bit gradients inside its own ``step()``
(``free_grad_in_param_list``, ``zero_grad``) and makes the fp32 gradient partition only for the
optimizer step, so "after the step" holds neither. The worker therefore takes a snapshot of what
the engine holds at each of these points of the measured step, and records per category the
largest value (``facts["points"]`` keeps every snapshot):

* entry of ``reduce_gradients`` (ZeRO-1: every ``param.grad`` as autograd left it, before the
  reduction), of ``independent_gradient_partition_epilogue`` (ZeRO-1/2) and of ZeRO-3's
  ``__reduce_and_partition_ipg_grads``;
* after ``engine.backward``, at the entry of the ZeRO optimizer's ``step``, at the entry of the
  wrapped base optimizer's ``step`` (the fp32 gradient partition exists) and after the ZeRO
  ``step`` returns (before the engine's ``zero_grad``);
* ZeRO-3: after every ``fetch_sub_module`` and before every ``release_sub_module`` of the
  parameter coordinator (the gathered parameters at their largest).

Each snapshot counts every storage once (:func:`parmem.measure.storage_key_and_bytes`) and maps
the engine's own buffers to the categories of :data:`parmem.engine_records.CATEGORIES`:

* ``params``: the storages behind the module's parameters. ZeRO-1/2: the flat 16-bit group
  ``bit16_groups_flat`` every parameter is a view of (2 bytes x the aligned group). ZeRO-3: the
  partitions ``param.ds_tensor`` (views of the flat ``lp_param_buffer``) and the full 16-bit copy
  of every persistent parameter (``ds_persist``: at most
  ``stage3_param_persistence_threshold`` elements), which stays gathered;
* ``grads``: 16-bit gradients outside the reduction bucket: ``param.grad`` (ZeRO-1 before its
  reduction), ``averaged_gradients`` and ``grads_in_partition`` (ZeRO-1/2: the whole of every
  parameter that overlaps this rank's partition), ZeRO-3's ``grad_partitions_flat_buffer``;
* ``optimizer``: the fp32 master partition (``single_partition_of_fp32_groups``, ZeRO-3's
  ``fp32_partitioned_groups_flat``) and the base optimizer's state (``exp_avg``,
  ``exp_avg_sq``; ``FusedAdam`` keeps its step count as a Python int);
* ``optimizer_step``: the ``.grad`` of the fp32 master partition (made in ``step()``, dropped
  after the group's update);
* ``comm_buffers``: the reduction buckets ``ipg_buckets[dtype].buffer`` (``reduce_bucket_size``
  16-bit elements; ZeRO-1/2 allocate it in the backward, ZeRO-3 at start-up) and, at ZeRO-3, the
  gathered 16-bit parameters of non-persistent parameters.

Other tensors the ZeRO optimizer holds (the global gradient norm, the overflow flags: a few
bytes) are listed in ``facts["other_bytes"]``, counted in no category.

Cases (two ranks, tiny shapes chosen so that every tensor divides evenly: no flat-buffer
padding): ZeRO-1, ZeRO-2, ZeRO-3 on Llama, ZeRO-3 on Mixtral. ZeRO-3 sets
``stage3_param_persistence_threshold`` to 1024 elements: DeepSpeed's default (1e5) would keep
every tensor of a model this small gathered, while on a real model (h = 4096) it keeps the norm
vectors and the MoE routers, and partitions the matrices; 1024 does the same here (norms of 64,
routers of 4 x 64, the smallest matrix 32 x 64). Everything else is DeepSpeed's default
(``overlap_comm`` off at ZeRO-1/2 and on at ZeRO-3, ``contiguous_gradients``,
``reduce_bucket_size`` 5e8, ``stage3_prefetch_bucket_size``, ``stage3_max_live_parameters``,
``stage3_max_reuse_distance``).

Named differences (:data:`parmem.engine_records.DIFFERENCES`), all real on a GPU too:

* ``deepspeed-straddling-grads`` (ZeRO-2 ``grads``): ``grads_in_partition`` holds the whole
  16-bit gradient of every parameter that overlaps this rank's slice of the flat group, not
  just the slice (``copy_grads_in_partition``, stage_1_and_2.py); the extra is 2 bytes x
  (elements of those parameters - partition size), recorded from the parameter order;
* (modelled since: the ZeRO-3 gradients.) The engine keeps a persistent 16-bit gradient
  partition (``grad_partitions_flat_buffer``, 2 bytes x Ψ/d) and makes the fp32 gradient
  (4 bytes x Ψ/d) only inside ``step()``, one sub-group at a time; DeepSpeed's estimator
  (``estimate_zero3_model_states_mem_needs``) counts fp32 gradients throughout and no 16-bit
  ones. These runs showed the engine's way, and the deepspeed profile now counts it
  (``data/engines.toml``: 16-bit ``grads`` at every stage, the ZeRO-3 fp32 ``grad_partition``
  in the step only, at most ``sub_group_size`` elements);
* ``deepspeed-zero3-persistent-params`` (ZeRO-3 ``params``): the full 16-bit copy of the
  persistent parameters;
* ``deepspeed-zero3-gathered-params`` (ZeRO-3 ``comm_buffers``): in the measured step's
  forward the coordinator prefetches the whole model (it is below
  ``stage3_prefetch_bucket_size``) and releases nothing (every module is used again within
  ``stage3_max_reuse_distance``), so all non-persistent parameters are gathered at once
  (``facts["gathered_peak"]``: the communication buffers there, bucket included, and where),
  beside the profile's 4 x the largest module (DeepSpeed's estimator). On a real model the
  peak is bounded by these windows instead; the profile keeps the estimator's figure.
"""

from __future__ import annotations

import gc
import os
import time
from typing import Any

__all__ = ["ENGINE", "CASES", "TINY", "PERSISTENCE_THRESHOLD", "record", "tiny_config"]

#: the parmem profile these runs are held against
ENGINE = "deepspeed"

#: ``stage3_param_persistence_threshold`` of the ZeRO-3 cases (elements; see the module doc)
PERSISTENCE_THRESHOLD = 1024

_SEQ, _MB, _VOCAB, _STEPS = 32, 1, 256, 2

#: the tiny configs: hidden 64, 4 query heads and 2 key/value heads of 16, FFN 80, 2 layers,
#: vocabulary 256, untied embeddings; Mixtral with 4 experts, top-2
TINY: dict[str, dict[str, Any]] = {
    "llama": dict(
        hidden_size=64,
        intermediate_size=80,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_hidden_layers=2,
        vocab_size=_VOCAB,
    ),
    "mixtral": dict(
        hidden_size=64,
        intermediate_size=80,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_hidden_layers=2,
        vocab_size=_VOCAB,
        num_local_experts=4,
        num_experts_per_tok=2,
    ),
}

#: case -> (world size, keyword arguments of :func:`record`)
CASES: dict[str, tuple[int, dict]] = {
    "llama-zero1": (2, dict(family="llama", zero=1)),
    "llama-zero2": (2, dict(family="llama", zero=2)),
    "llama-zero3": (2, dict(family="llama", zero=3)),
    "mixtral-zero3": (2, dict(family="mixtral", zero=3)),
}


def tiny_config(family: str):
    """The Transformers config of ``family`` (:data:`TINY`), without a KV cache."""
    import transformers

    cls = {"llama": transformers.LlamaConfig, "mixtral": transformers.MixtralConfig}[family]
    return cls(**TINY[family], use_cache=False, tie_word_embeddings=False)


def _ds_config(zero: int) -> dict:
    zc: dict[str, Any] = {"stage": zero}
    if zero == 3:
        zc["stage3_param_persistence_threshold"] = PERSISTENCE_THRESHOLD
    return {
        "train_micro_batch_size_per_gpu": _MB,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "zero_optimization": zc,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.0}},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def _tensors(obj) -> list:
    """The tensors in ``obj``: a tensor, or a list/tuple/dict of them (nested), or an object
    with ``flat_partition``/``grad_buffers`` (stage_1_and_2.GradPartitionBufferGroup)."""
    import torch

    if obj is None:
        return []
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _tensors(v)]
    out = []
    for name in ("flat_partition", "grad_buffers", "buffer"):
        if hasattr(obj, name):
            out += _tensors(getattr(obj, name))
    return out


def _add(into: dict, tensors) -> None:
    from parmem.measure import storage_key_and_bytes

    for t in tensors:
        if t is None or t.device.type == "meta":
            continue
        key, n = storage_key_and_bytes(t)
        if n:
            into[key] = n


def _children(obj) -> list:
    """What :func:`_walk` descends into: a dict's keys and values, a sequence's items, the
    attributes of a DeepSpeed or torch object (not of a module: its parameters are walked
    apart)."""
    import torch

    if isinstance(obj, dict):
        return [x for kv in list(obj.items()) for x in kv]
    if isinstance(obj, (list, tuple, set)):
        return list(obj)
    if isinstance(obj, type) or isinstance(obj, torch.nn.Module) or not hasattr(obj, "__dict__"):
        return []
    if type(obj).__module__.split(".")[0] in ("deepspeed", "torch"):
        return list(vars(obj).values())
    return []


def _walk(obj, out: dict, depth: int, seen: set) -> None:
    """Every tensor storage reachable from ``obj`` through DeepSpeed/torch objects, lists and
    dicts (``depth`` levels); a tensor's ``.grad`` and ``.ds_tensor`` too."""
    import torch

    if depth < 0 or id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        extra = [getattr(obj, a, None) for a in ("grad", "ds_tensor")]
        _add(out, [obj] + [t for t in extra if isinstance(t, torch.Tensor)])
        return
    for child in _children(obj):
        _walk(child, out, depth - 1, seen)


def _snapshot(engine, zero: int, walk: bool = True) -> dict[str, Any]:
    """Bytes per category that the engine holds now (module doc), each storage once."""
    opt = engine.optimizer
    params = [p for p in engine.module.parameters()]
    comm: dict = {}
    for bucket in opt.ipg_buckets.values():
        _add(comm, _tensors(bucket.buffer))
    cats: dict[str, dict] = {c: {} for c in ("params", "grads", "optimizer", "optimizer_step")}
    if zero == 3:
        _add(cats["params"], [p.ds_tensor for p in params])
        gathered: dict = {}
        for p in params:
            if p.data.numel():
                _add(cats["params"] if p.ds_persist else gathered, [p.data])
        for k, n in gathered.items():
            comm.setdefault(k, n)
        masters = list(opt.fp32_partitioned_groups_flat)
        grads16 = [opt.grad_partitions_flat_buffer]
    else:
        _add(cats["params"], [p.data for p in params])
        masters = list(opt.single_partition_of_fp32_groups)
        grads16 = _tensors(opt.averaged_gradients) + _tensors(opt.grads_in_partition)
    g16: dict = {}
    _add(g16, [p.grad for p in params] + grads16)
    cats["grads"] = {k: n for k, n in g16.items() if k not in comm}
    _add(cats["optimizer"], masters + _tensors(opt.optimizer.state))
    _add(cats["optimizer_step"], [m.grad for m in masters])
    cats["comm_buffers"] = comm
    counted: dict = {}
    for d in cats.values():
        counted.update(d)
    reach: dict = {}
    if walk:
        _walk(opt, reach, 6, set())
    other = {k: n for k, n in reach.items() if k not in counted}
    out: dict[str, Any] = {c: sum(d.values()) for c, d in cats.items()}
    out["other"] = sum(other.values())
    return out


def _spec(family: str, model):
    from parmem.model import ModelSpec

    cfg = model.config.to_dict()
    spec = ModelSpec.from_hf_config(cfg, name=f"tiny-{family}")
    built = sum(getattr(p, "ds_numel", 0) or p.numel() for p in model.parameters())
    if spec.num_params() != built:
        raise AssertionError(f"ModelSpec counts {spec.num_params()} parameters, model has {built}")
    return spec


def _wrap(obj, name: str, before=None, after=None) -> None:
    f = getattr(obj, name, None)
    if f is None:
        return

    def wrapped(*a, **k):
        if before:
            before()
        r = f(*a, **k)
        if after:
            after()
        return r

    setattr(obj, name, wrapped)


#: ZeRO stage -> category -> the differences the records name (parmem.engine_records)
_NAMED: dict[int, dict[str, list[str]]] = {
    1: {},
    2: {"grads": ["deepspeed-straddling-grads"]},
    3: {
        "params": ["deepspeed-zero3-persistent-params"],
        "comm_buffers": ["deepspeed-zero3-gathered-params"],
    },
}
_MEASURED = ("params", "grads", "optimizer", "optimizer_step", "comm_buffers")


class _Meter:
    """The snapshots of one step (module doc): wraps the ZeRO optimizer's methods, the base
    optimizer's ``step`` and, at ZeRO-3, the parameter coordinator's fetch and release."""

    def __init__(self, engine, zero: int):
        self.engine, self.zero = engine, zero
        self.on, self.phase = False, ""
        self.points: dict[str, dict] = {}
        self.peak: dict[str, Any] = {"gathered": 0}
        opt = engine.optimizer
        for name in ("reduce_gradients", "independent_gradient_partition_epilogue"):
            _wrap(opt, name, before=self.snap(f"{name} entry"))
        _wrap(
            opt,
            "_DeepSpeedZeroOptimizer_Stage3__reduce_and_partition_ipg_grads",
            before=self.snap("reduce_and_partition_ipg_grads entry"),
        )
        _wrap(opt, "step", before=self.snap("zero step entry"), after=self.snap("zero step exit"))
        _wrap(opt.optimizer, "step", before=self.snap("base optimizer step entry"))
        if zero == 3:
            coord = opt.parameter_offload.get_param_coordinator()
            _wrap(coord, "fetch_sub_module", after=self.gathered("after fetch_sub_module"))
            _wrap(coord, "release_sub_module", before=self.gathered("before release_sub_module"))

    def snap(self, tag: str):
        def f():
            if self.on:
                self.points[tag] = _snapshot(self.engine, self.zero)

        return f

    def gathered(self, where: str):
        def f():
            if self.on:
                s = _snapshot(self.engine, self.zero, walk=False)
                if s["comm_buffers"] > self.peak["gathered"]:
                    self.peak.update(gathered=s["comm_buffers"], at=where, phase=self.phase)

        return f

    def measured(self) -> dict[str, int]:
        out = {c: max(p[c] for p in self.points.values()) for c in _MEASURED}
        out["comm_buffers"] = max(out["comm_buffers"], self.peak["gathered"])
        return out


def _import_deepspeed():
    """DeepSpeed on its CPU accelerator, on the pool's default process group."""
    import torch.distributed as dist

    os.environ["DS_ACCELERATOR"] = "cpu"
    rank, world = dist.get_rank(), dist.get_world_size()
    for k, v in (("RANK", rank), ("LOCAL_RANK", rank), ("WORLD_SIZE", world)):
        os.environ.setdefault(k, str(v))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().device_name() != "cpu":
        raise RuntimeError(f"DeepSpeed picked accelerator {get_accelerator().device_name()!r}")
    deepspeed.init_distributed(dist_backend="gloo")
    return deepspeed, get_accelerator()


def record(case: str, family: str = "llama", zero: int = 1) -> dict:
    """Pool worker: run case ``case`` on this rank and return its record
    (:mod:`parmem.engine_records` describes the fields)."""
    import torch
    import torch.distributed as dist
    import transformers

    deepspeed, accel = _import_deepspeed()
    rank, world = dist.get_rank(), dist.get_world_size()
    t0 = time.perf_counter()
    torch.manual_seed(0)
    cfg = tiny_config(family)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    spec = _spec(family, model)
    shapes = [(n, p.numel()) for n, p in model.named_parameters()]
    engine, opt, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=_ds_config(zero)
    )
    meter = _Meter(engine, zero)
    g = torch.Generator().manual_seed(1 + rank)
    losses = []
    for step in range(_STEPS):
        meter.on = step == _STEPS - 1
        ids = torch.randint(0, cfg.vocab_size, (_MB, _SEQ), generator=g)
        meter.phase = "forward"
        loss = engine(input_ids=ids, labels=ids).loss
        meter.phase = "backward"
        engine.backward(loss)
        meter.snap("after backward")()
        meter.phase = "step"
        engine.step()
        losses.append(float(loss.detach()))
    facts = _facts(engine, opt, zero, shapes)
    if zero == 3:
        facts["gathered_peak"] = {
            "comm_buffers": meter.peak["gathered"],
            "at": meter.peak.get("at"),
            "phase": meter.peak.get("phase"),
        }
    facts.update(
        points=meter.points,
        other_bytes=max(p["other"] for p in meter.points.values()),
        losses=losses,
        base_optimizer=type(opt.optimizer).__name__,
        zero_optimizer=type(opt).__name__,
        comm_backend=accel.communication_backend_name(),
        seconds=round(time.perf_counter() - t0, 1),
    )
    measured = meter.measured()
    engine.destroy()
    del engine, opt, model, meter
    gc.collect()
    notes = [
        "CPU run: DS_ACCELERATOR=cpu, DeepSpeed's CPU accelerator over gloo (no oneCCL)",
        "measured on the second of two steps; each category at its largest over the snapshot "
        "points (module doc of parmem.distributed.runs_deepspeed)",
    ]
    if zero == 3:
        notes.append(f"stage3_param_persistence_threshold={PERSISTENCE_THRESHOLD} (default 1e5)")
    return {
        "rank": rank,
        "stage": 0,
        "model": spec.to_dict(),
        "parallel": {"dp": world, "zero": zero},
        "setup": {
            "seq_len": _SEQ,
            "micro_batch": _MB,
            "precision": "bf16-mixed",
            "optimizer": "adamw",
            "engine": ENGINE,
        },
        "measured": measured,
        "named": _NAMED[zero],
        "facts": facts,
        "notes": notes,
    }


def _facts(engine, opt, zero: int, shapes) -> dict[str, Any]:
    """The sizes the records' differences and tests read: parameter tensors and elements, the
    flat partition, the elements of the parameters overlapping this rank's partition, the
    persistent parameters, the reduce bucket."""
    params = list(engine.module.parameters())
    facts: dict[str, Any] = {
        "param_tensors": len(params),
        "num_params": sum(n for _, n in shapes),
        "reduce_bucket_size": int(opt.reduce_bucket_size),
    }
    if zero == 3:
        facts["partition_numel"] = sum(p.partition_numel() for p in params)
        persist = [p for p in params if p.ds_persist]
        facts["persistent_tensors"] = len(persist)
        facts["persistent_numel"] = sum(p.ds_numel for p in persist)
        facts["largest_module_params"] = max(
            sum(p.ds_numel for p in m.parameters(recurse=False)) for m in engine.module.modules()
        )
    else:
        facts["partition_numel"] = int(sum(opt.partition_size))
        facts["flat_numel"] = int(sum(t.numel() for t in opt.bit16_groups_flat))
        facts["params_in_partition_numel"] = int(
            sum(p.numel() for g in opt.params_in_partition for p in g)
        )
    return facts
