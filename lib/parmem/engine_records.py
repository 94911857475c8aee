"""Recorded engine runs: what each engine's own training step held, per rank, beside the estimate.

``make engines`` (``scripts/record_engine_runs.py``) runs each engine's own code on CPU gloo
ranks with tiny shapes of real architectures and writes one JSON file per engine to
``data/engine_runs/``. This module reads them and sets every measured number beside
:func:`parmem.estimate` for the same model, layout and setup, so the test suite holds each
recorded row against the library without running the engines again.

A record (one rank of one case) holds:

* ``case``, ``engine`` (the parmem profile), ``versions`` (torch and the engine's packages),
  ``date``, ``world_size``, ``rank`` and ``stage`` (the pipeline stage the rank holds);
* ``model``: the :class:`~parmem.model.ModelSpec` fields of the tiny model; ``parallel`` and
  ``setup``: the :class:`~parmem.config.ParallelConfig` and :class:`~parmem.config.TrainingSetup`
  fields (``engine`` included, ``device`` given separately: the runs are on CPU);
* ``measured``: bytes per category. Each category names the estimate's field it is held against
  (:data:`CATEGORIES`);
* ``named``: per category, the names of the differences (:data:`DIFFERENCES`) that the estimate
  does not contain and the run does; each is a function of the record, so the comparison is
  ``measured == estimate + sum(differences)``, exactly;
* ``peak`` (optional): ``torch.distributed._tools.mem_tracker.MemTracker``'s peak per category,
  reported, not compared (a CPU run's temporaries are not a GPU's);
* ``notes``: what the CPU run changed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parmem._data import DATA_DIRS

__all__ = [
    "CATEGORIES",
    "DIFFERENCES",
    "Difference",
    "RecordRow",
    "load_records",
    "predicted",
    "compare_record",
    "record_rows",
    "records_table",
    "records_summary",
    "hf_table_saved_bytes",
]

#: folder of the recorded runs, one ``<engine>.json`` per engine (next to the package in a
#: wheel, else the repository's ``data/``)
RECORDS_DIR: Path = next(
    (d / "engine_runs" for d in DATA_DIRS if (d / "engine_runs").is_dir()),
    DATA_DIRS[-1] / "engine_runs",
)

#: measured category -> the expression of the estimate's stage it is held against
CATEGORIES: dict[str, str] = {
    "params": "params",
    "grads": "grads",
    "optimizer": "optimizer",
    "optimizer_step": "optimizer_step",
    "saved": "activations + logits",
    "activations": "activations",
    "comm_buffers": "comm_buffers",
}


@dataclass(frozen=True)
class Difference:
    """A difference between an engine run and the estimate, named and computed.

    ``gpu``: whether a GPU run has it too (``False``: an artefact of the CPU run, which the
    profile rightly leaves out); ``doc``: what it is and where it comes from; ``bytes``: its size
    for a record."""

    doc: str
    gpu: bool
    bytes: Callable[[dict], int]


def _param_tensors(rec: dict) -> int:
    return int(rec["facts"]["param_tensors"])


def _deepspeed_gathered(rec: dict) -> int:
    """DeepSpeed ZeRO-3's whole gathered model minus the profile's 4 x the largest module, for a
    model whose partitioned parameters fit DeepSpeed's default stage3_prefetch_bucket_size."""
    f = rec["facts"]
    partitioned = f["num_params"] - f["persistent_numel"]
    if partitioned > 5 * 10**7:
        raise ValueError(
            "deepspeed-zero3-gathered-params holds only up to 5e7 partitioned elements"
        )
    return 2 * partitioned - 4 * f["largest_module_params"]


#: name -> :class:`Difference`; a record's ``named`` lists the ones it has, per category
DIFFERENCES: dict[str, Difference] = {
    "adamw-step-counters": Difference(
        "torch.optim.AdamW keeps a 0-d fp32 ``step`` tensor per parameter tensor it updates "
        "(on CUDA with capturable=False it is a CPU tensor, so no GPU memory)",
        gpu=False,
        bytes=lambda rec: 4 * _param_tensors(rec),
    ),
    # DeepSpeed 0.19.8 (parmem.distributed.runs_deepspeed): ``facts`` holds the sizes read here
    "deepspeed-straddling-grads": Difference(
        "DeepSpeed ZeRO-2 (runtime/zero/stage_1_and_2.py copy_grads_in_partition): "
        "``grads_in_partition`` holds the whole 16-bit gradient of every parameter that overlaps "
        "this rank's slice of the flat group, not only the slice: 2 bytes x (elements of those "
        "parameters - partition size); depends on the parameter order, which the profile does "
        "not know",
        gpu=True,
        bytes=lambda rec: (
            2 * (rec["facts"]["params_in_partition_numel"] - rec["facts"]["partition_numel"])
        ),
    ),
    "deepspeed-zero3-persistent-params": Difference(
        "DeepSpeed ZeRO-3 (runtime/zero/parameter_offload.py mark_persistent_parameters): a "
        "parameter of at most stage3_param_persistence_threshold elements stays gathered "
        "beside its partition: 2 bytes x its elements (norm vectors, MoE routers)",
        gpu=True,
        bytes=lambda rec: 2 * rec["facts"]["persistent_numel"],
    ),
    "deepspeed-zero3-gathered-params": Difference(
        "DeepSpeed ZeRO-3 (runtime/zero/partitioned_param_coordinator.py): once the first step "
        "has recorded the module trace, the forward prefetches up to stage3_prefetch_bucket_size "
        "(5e7) elements ahead and releases nothing that is used again within "
        "stage3_max_reuse_distance (1e9), so a model of at most 5e7 partitioned elements is "
        "gathered whole: 2 bytes x its non-persistent parameters, where the profile counts 4 x "
        "the largest module (DeepSpeed's estimator)",
        gpu=True,
        bytes=_deepspeed_gathered,
    ),
    # Transformers 5.23 Trainer (parmem.distributed.runs_hf)
    "adamw-fused-step-counters": Difference(
        "the Trainer's default optimizer, adamw_torch_fused, is torch.optim.AdamW(fused=True), "
        "which keeps each parameter tensor's ``step`` as a 0-d fp32 tensor on the parameter's "
        "device (torch/optim/adam.py _init_group: capturable or fused), so on a GPU in GPU "
        "memory: 4 bytes per parameter tensor; the estimate counts parameters, not tensors",
        gpu=True,
        bytes=lambda rec: 4 * _param_tensors(rec),
    ),
    "trainer-loss-divisor": Difference(
        "the Trainer passes ``num_items_in_batch`` (the labels other than -100, summed over the "
        "ranks: a 0-d fp32 tensor, trainer.py _get_num_items_in_batch) to the model, whose "
        "ForCausalLMLoss sums the cross-entropy and divides by it (loss/loss_utils.py "
        "fixed_cross_entropy); the division keeps the divisor: 4 bytes for the one micro-batch "
        "held without a pipeline, which the hf profile's last-stage table (measured on a "
        "forward without the Trainer) leaves out",
        gpu=True,
        bytes=lambda rec: 4,
    ),
    # torchtitan 0.3.0 (parmem.distributed.runs_fsdp2): ``facts`` holds the counts read here
    "cpu-rmsnorm": Difference(
        "nn.RMSNorm on CPU (torchtitan's blocks, Megatron-Core's local spec) runs the composite "
        "F.rms_norm, which keeps an fp32 copy of its input and the fp32 normalised tensor, where "
        "CUDA's fused kernel keeps the 16-bit input only: the [devices.cpu] minus [devices.cuda] "
        "rmsin and rmsmid of data/engines.toml (4 + 4 - 2 = 6 bytes in bf16) per normalised "
        "element (facts: rmsnorm_elements, every RMSNorm input of the forward on this rank)",
        gpu=False,
        bytes=lambda rec: _cpu_rmsnorm_per_element() * int(rec["facts"]["rmsnorm_elements"]),
    ),
    # a reader's own model measured by parmem measure (parmem.measure_model): a record there is
    # {"model", "parallel", "setup", "device"} of the Transformers layers the step ran
    "cpu-kernels": Difference(
        "saved tensors whose element size depends on the device's kernels ([devices.cpu] vs "
        "[devices.cuda] of data/engines.toml: dropout masks in the activation dtype, LayerNorm "
        "statistics in the input dtype, nn.RMSNorm's fp32 copy and normalised tensor on CPU); "
        "the hf profile's own tables evaluated on the record's device minus 'cuda'",
        gpu=False,
        bytes=lambda rec: (
            hf_table_saved_bytes(rec, rec.get("device", "cpu")) - hf_table_saved_bytes(rec, "cuda")
        ),
    ),
    "shifted-labels-padding": Difference(
        "Transformers' ForCausalLMLoss pads the labels by one and keeps "
        "labels[..., 1:].contiguous() for cross_entropy (transformers/loss/loss_utils.py); at "
        "micro-batch 1 that slice is already contiguous, so the kept int64 storage is the "
        "padded (1, s + 1) tensor: 8 bytes more than the hf profile's s x b int64 'shifted "
        "labels'. The same code runs on a GPU; the profile's table has no entry for it",
        gpu=True,
        bytes=lambda rec: 8 if rec["setup"].get("micro_batch", 1) == 1 else 0,
    ),
    "repeat-kv-view": Difference(
        "eager attention with one key/value head at micro-batch 1: repeat_kv expands the head "
        "(a view), and torch.matmul folds (1, a) into its batch dimension as a view too, so the "
        "two matmuls keep key and value at one head's width, not repeated to the a query heads "
        "the hf profile's 'k, v (repeat_kv)' entry counts (transformers "
        "models/llama/modeling_llama.py repeat_kv, eager_attention_forward): "
        "-2 x act x (a - 1) x head_dim x s bytes per layer. The same code runs on a GPU; a "
        "shrink that leaves one key/value head where the model has more makes it",
        gpu=True,
        bytes=lambda rec: _repeat_kv_view(rec),
    ),
    "torchtitan-tp-embedding-mask": Difference(
        "under TP torchtitan's vocab-parallel Embedding (models/common/embedding.py forward) "
        "returns ``out * mask.unsqueeze(-1).to(out.dtype)``, and the multiply keeps the (b, s, "
        "1) in-range mask in the activation dtype: 2 bytes per token of the micro-batch on the "
        "first stage, which the fsdp2 first-stage table cannot list (its conditions have no "
        "TP)",
        gpu=True,
        bytes=lambda rec: 2 * rec["setup"]["seq_len"] * rec["setup"].get("micro_batch", 1),
    ),
    "loss-parallel-no-total-weight": Difference(
        "under TP torchtitan's vocab-parallel cross-entropy (components/loss.py "
        "_LossParallelCrossEntropy) keeps its fp32 log-probabilities and int64 labels but no "
        "0-d total weight, which the fsdp2 last-stage table lists for F.cross_entropy: 4 "
        "bytes fewer",
        gpu=True,
        bytes=lambda rec: -4,
    ),
    "tp-collective-output-not-measured": Difference(
        "the estimate's TP collective output (one bf16 s x b x h tensor, parmem.layout "
        "tp_output_bytes) is in comm_buffers, but the record measures FSDP2's buffers only "
        "(under torchtitan's sequence parallelism the all-gather output is the tensor the "
        "matmul keeps, counted in saved): the term is subtracted, not compared",
        gpu=False,
        bytes=lambda rec: (
            -2
            * rec["setup"]["seq_len"]
            * rec["setup"].get("micro_batch", 1)
            * rec["model"]["hidden"]
        ),
    ),
    "pipelining-recv-buffers": Difference(
        "torch.distributed.pipelining's PipelineStage preallocates a receive buffer per "
        "micro-batch (stage.py _setup_forward_recv_info, _create_grad_recv_info): m "
        "activation buffers on every stage but the first, m gradient buffers on every stage "
        "but the last, each one boundary tensor (bf16 s x b x h, divided by t under SP), and "
        "sends its outputs without a buffer; the estimate counts one send and one receive "
        "buffer: (m x directions - 2) boundary tensors",
        gpu=True,
        bytes=lambda rec: _pipelining_recv_extra(rec),
    ),
    # Megatron-Core (parmem.distributed.runs_megatron_core: each function's doc is its source)
    "megatron-cpu-unfused-softmax": Difference(
        "CPU artefact: with masked_softmax_fusion off (the fused causal softmax is a CUDA "
        "extension) each layer keeps fp32 probabilities (4 b a/t s^2) and a bool causal mask "
        "(s^2) beside the bf16 probabilities",
        gpu=False,
        bytes=lambda rec: cpu_unfused_softmax_bytes(rec),
    ),
    "megatron-ce-target-mask": Difference(
        "vocab_parallel_cross_entropy keeps a bool target mask, 1 byte per token; the profile "
        "has no dtype symbol of 1 byte on every device",
        gpu=True,
        bytes=lambda rec: ce_target_mask_bytes(rec),
    ),
    "megatron-vocab-parallel-input-mask": Difference(
        "VocabParallelEmbedding with t > 1 keeps a bool mask of the ids outside its shard, 1 "
        "byte per token; the profile has no t > 1 condition nor a 1-byte dtype symbol",
        gpu=True,
        bytes=lambda rec: vocab_input_mask_bytes(rec),
    ),
    "megatron-moe-routed-tokens": Difference(
        "dropless MoE routing sends a data-dependent number of (token, expert) pairs to this "
        "rank's experts (facts routed_tokens); the profile counts the balanced s b k",
        gpu=True,
        bytes=lambda rec: moe_routed_tokens_bytes(rec),
    ),
    "megatron-distopt-param-padding": Difference(
        "the distributed optimizer's bf16 param_data buffer pads each parameter to 64 "
        "elements and each bucket to lcm(d, 128) (param_and_grad_buffer.py)",
        gpu=True,
        bytes=lambda rec: distopt_param_padding_bytes(rec),
    ),
    "megatron-distopt-grad-padding": Difference(
        "the same padding in the fp32 grad_data buffer",
        gpu=True,
        bytes=lambda rec: distopt_grad_padding_bytes(rec),
    ),
    "megatron-distopt-shard-split": Difference(
        "the distributed optimizer gives each rank the parameter elements inside its 1/d of "
        "the padded buffer, not ceil(P/d): 12 bytes per element of the difference",
        gpu=True,
        bytes=lambda rec: distopt_shard_split_bytes(rec),
    ),
}


def hf_table_saved_bytes(rec: dict, device: str) -> int:
    """The bytes the ``hf`` profile's tables say one micro-batch keeps on ``device`` for the
    record's model, layout and setup: every layer's table, plus the tensors the stage, the first
    and the last stage keep (one pipeline stage, as :func:`parmem.estimate` sums them)."""
    from parmem.activations import saved_tensor_bytes
    from parmem.config import ParallelConfig, TrainingSetup
    from parmem.layout import layout
    from parmem.model import ModelSpec

    spec, setup = ModelSpec(**rec["model"]), TrainingSetup(**rec["setup"])
    lay = layout(spec, ParallelConfig(**rec["parallel"]), setup)
    parts = saved_tensor_bytes(
        spec,
        setup.seq_len,
        setup.micro_batch,
        places=("layer", "stage", "first", "last"),
        flash=lay.flash,
        dropout=lay.dropout,
        act_bytes=lay.act_bytes,
        engine="hf",
        device=device,
        autocast=setup.precision == "bf16-autocast",
    )
    layer, rest = (sum(n for _, n in p) for p in (parts[0], parts[1] + parts[2] + parts[3]))
    return spec.layers * layer + rest


def _repeat_kv_view(rec: dict) -> int:
    from parmem.config import ParallelConfig, TrainingSetup
    from parmem.layout import layout
    from parmem.model import ModelSpec

    spec, setup = ModelSpec(**rec["model"]), TrainingSetup(**rec["setup"])
    lay = layout(spec, ParallelConfig(**rec["parallel"]), setup)
    if setup.micro_batch != 1 or lay.flash or not spec.kv_heads == 1 < spec.heads:
        return 0
    per_layer = 2 * lay.act_bytes * (spec.heads - 1) * spec.head_dim * setup.seq_len
    return -spec.layers * per_layer


def _cpu_rmsnorm_per_element(act_bytes: int = 2) -> int:
    """Bytes an RMSNorm keeps per normalised element on CPU beyond what it keeps on CUDA."""
    from parmem.engines import activation_itemsizes

    cpu, cuda = (activation_itemsizes(d, act_bytes, 0) for d in ("cpu", "cuda"))
    return cpu["rmsin"] - cuda["rmsin"] + cpu["rmsmid"] - cuda["rmsmid"]


def _pipelining_recv_extra(rec: dict) -> int:
    par, st = rec["parallel"], rec["setup"]
    pp, stage = par.get("pp", 1), rec.get("stage", 0)
    directions = (stage > 0) + (stage < pp - 1)
    boundary = 2 * st["seq_len"] * st.get("micro_batch", 1) * rec["model"]["hidden"]
    if par.get("sp") and par.get("tp", 1) > 1:
        boundary //= par["tp"]
    return (st.get("num_microbatches", 1) * directions - 2) * boundary


def _files(directory: Path | None = None) -> list[Path]:
    d = RECORDS_DIR if directory is None else Path(directory)
    return sorted(d.glob("*.json")) if d.is_dir() else []


def load_records(directory: Path | None = None) -> list[dict]:
    """Every recorded rank of every case, in file order (``data/engine_runs/*.json``)."""
    out: list[dict] = []
    for f in _files(directory):
        data = json.loads(f.read_text(encoding="utf-8"))
        for rec in data["records"]:
            rec.setdefault("file", f.name)
            out.append(rec)
    return out


def predicted(rec: dict) -> dict[str, int]:
    """The estimate's bytes for the record's rank, per :data:`CATEGORIES` name. A record whose
    model the profile's activation table refuses (``"states_only": true``: multi-latent attention
    under ``fsdp2``) is held against the model states and buffers alone
    (:func:`parmem.estimate.model_states_and_buffers`); its activation categories are absent."""
    from parmem.config import ParallelConfig, TrainingSetup
    from parmem.estimate import estimate, model_states_and_buffers
    from parmem.model import ModelSpec

    spec = ModelSpec(**rec["model"])
    par = ParallelConfig(**rec["parallel"])
    setup = TrainingSetup(**rec["setup"])
    kw: dict[str, Any] = {}
    if rec.get("layers_per_stage"):
        kw["layers_per_stage"] = rec["layers_per_stage"]
    stage = rec.get("stage", 0)
    env: dict[str, int]
    if rec.get("states_only"):
        env = model_states_and_buffers(spec, par, setup, **kw)[stage]
    else:
        st = estimate(spec, par, setup, **kw).stages[stage]
        names = ("params", "grads", "optimizer", "optimizer_step", "activations", "logits",
                 "comm_buffers")  # fmt: skip
        env = {f: getattr(st, f) for f in names}
    out = {}
    for name, expr in CATEGORIES.items():
        terms = [t.strip() for t in expr.split("+")]
        if all(t in env for t in terms):
            out[name] = sum(env[t] for t in terms)
    return out


@dataclass(frozen=True)
class RecordRow:
    """One category of one recorded rank beside the estimate."""

    case: str
    engine: str
    rank: int
    category: str
    measured: int
    estimate: int
    named: tuple[str, ...]
    modelled: int  # the estimate plus the named differences

    @property
    def equal(self) -> bool:
        return self.measured == self.modelled

    @property
    def named_bytes(self) -> int:
        return self.modelled - self.estimate


def compare_record(rec: dict) -> list[RecordRow]:
    """One :class:`RecordRow` per measured category of ``rec``. Raises ``ValueError`` for a
    category or a difference this module does not know."""
    pred = predicted(rec)
    rows = []
    for cat, value in rec["measured"].items():
        if cat not in CATEGORIES:
            raise ValueError(f"measured: category {cat!r} is not one of {sorted(CATEGORIES)}")
        if cat not in pred:
            raise ValueError(f"measured: category {cat!r} is not compared for a states_only record")
        names = tuple(rec.get("named", {}).get(cat, ()))
        for n in names:
            if n not in DIFFERENCES:
                raise ValueError(f"named: difference {n!r} is not one of {sorted(DIFFERENCES)}")
        extra = sum(DIFFERENCES[n].bytes(rec) for n in names)
        rows.append(
            RecordRow(
                rec["case"],
                rec["engine"],
                rec["rank"],
                cat,
                int(value),
                pred[cat],
                names,
                pred[cat] + extra,
            )
        )
    return rows


def record_rows(directory: Path | None = None) -> list[RecordRow]:
    """Every category of every recorded rank beside the estimate."""
    return [row for rec in load_records(directory) for row in compare_record(rec)]


def records_table(rows: list[RecordRow] | None = None) -> list[dict[str, Any]]:
    """The rows for display, one per category of each recorded rank: the engine, the case, the
    rank, the category, measured and estimated bytes, the named differences and their bytes,
    and whether the measurement equals the estimate plus them."""
    rows = record_rows() if rows is None else rows
    return [
        {
            "engine": r.engine,
            "case": r.case,
            "rank": r.rank,
            "category": r.category,
            "measured B": r.measured,
            "estimate B": r.estimate,
            "named B": r.named_bytes,
            "named": ", ".join(r.named) or "-",
            "equal": r.equal,
        }
        for r in rows
    ]


def records_summary(rows: list[RecordRow] | None = None) -> list[dict[str, Any]]:
    """One line per recorded case: the engine, the case, its ranks and rows, how many rows equal
    the estimate as it is, how many once their named differences are added, and those names."""
    rows = record_rows() if rows is None else rows
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        line = out.setdefault(
            (r.engine, r.case),
            {"engine": r.engine, "case": r.case, "ranks": set(), "rows": 0, "as estimated": 0,
             "with named": 0, "named": set()},
        )  # fmt: skip
        line["ranks"].add(r.rank)
        line["rows"] += 1
        line["as estimated"] += r.measured == r.estimate
        line["with named"] += r.equal
        line["named"].update(r.named)
    return [
        {**v, "ranks": len(v["ranks"]), "named": ", ".join(sorted(v["named"])) or "-"}
        for v in out.values()
    ]


def distopt_layout(numels: list[int], dp: int) -> tuple[int, list[tuple[int, int]]]:
    """The distributed optimizer's buffer for parameters of ``numels`` elements (in the order
    the model registers them; one bucket), over ``dp`` ranks: (padded buffer numel, each
    parameter's (start, end) in it). Megatron-Core 0.16.1 ``param_and_grad_buffer.py``
    ``_ParamAndGradBuffer.__init__``: parameters are placed in reverse order, each starting at a
    multiple of 64 elements (``_pad_start_of_param_if_needed``); the bucket's end is padded to a
    multiple of lcm(dp, 128) (``_pad_end_of_bucket_if_needed``, without
    ``pad_buckets_for_high_nccl_busbw``)."""
    start, ranges = 0, [(0, 0)] * len(numels)
    for i in reversed(range(len(numels))):
        start = -(-start // 64) * 64
        ranges[i] = (start, start + numels[i])
        start += numels[i]
    div = math.lcm(dp, 128)
    return -(-start // div) * div, ranges


def shard_numel(numel: int, ranges: list[tuple[int, int]], dp: int, rank: int) -> tuple[int, int]:
    """(elements of parameters in ``rank``'s 1/dp of the padded buffer, parameter tensors with
    elements there): what ``DistributedOptimizer`` gives that rank's fp32 masters and AdamW."""
    lo, hi = rank * numel // dp, (rank + 1) * numel // dp
    inside = [max(0, min(e, hi) - max(s, lo)) for s, e in ranges]
    return sum(inside), sum(1 for n in inside if n)


# ----------------------------------------------------------- Megatron-Core's named differences
# The byte functions of the Megatron-Core differences of :data:`DIFFERENCES`: functions of a
# record's model, layout, setup and facts (parmem.distributed.runs_megatron_core records them).
def _shape(rec: dict) -> tuple[Any, int, int, int]:
    from parmem.model import ModelSpec

    spec = ModelSpec(**rec["model"])
    st = rec["setup"]
    return spec, st["seq_len"] * st["micro_batch"], rec["parallel"]["tp"], 2


def rmsnorm_elements(rec: dict) -> int:
    """The elements this rank's RMSNorms normalise in one forward (the named difference
    ``cpu-rmsnorm`` keeps 6 bytes more of each on CPU): per token, two norms of h per layer and
    the final norm (every TP rank: no sequence parallelism), and with q/k norms the local query
    and key widths per layer."""
    spec, tokens, tp, _ = _shape(rec)
    width = (2 * spec.layers + 1) * spec.hidden
    if spec.qk_norm:
        hd = spec.head_dim or spec.hidden // spec.heads
        width += spec.layers * (spec.heads + (spec.kv_heads or spec.heads)) * hd // tp
    return tokens * width


def cpu_unfused_softmax_bytes(rec: dict) -> int:
    """CPU artefact: ``FusedScaleMaskSoftmax.forward_torch_softmax`` (``masked_softmax_fusion``
    off: the fused kernel is a CUDA extension) upcasts the scores to fp32, masks them in place
    with a fresh bool causal mask (``get_default_causal_mask``: s x s) and keeps the fp32
    probabilities (b x a/t x s x s), per layer, beside the bf16 probabilities the profile
    counts."""
    spec, _, tp, _ = _shape(rec)
    s, b = rec["setup"]["seq_len"], rec["setup"]["micro_batch"]
    return spec.layers * (4 * b * spec.heads // tp * s * s + s * s)


def ce_target_mask_bytes(rec: dict) -> int:
    """``_VocabParallelCrossEntropy`` keeps a bool target mask, 1 byte per token (the profile has
    no dtype symbol of 1 byte on every device)."""
    return _shape(rec)[1]


def vocab_input_mask_bytes(rec: dict) -> int:
    """``VocabParallelEmbedding`` with t > 1 keeps the bool mask of the token ids outside its
    vocabulary shard (for ``output_parallel[input_mask, :] = 0``), 1 byte per token."""
    _, tokens, tp, _ = _shape(rec)
    return tokens if tp > 1 else 0


def moe_routed_tokens_bytes(rec: dict) -> int:
    """Dropless routing: this rank's experts received ``facts["routed_tokens"]`` (token, expert)
    pairs per MoE layer, the profile counts the balanced s·b·k. Per pair the experts keep the
    int64 sorted index (8 bytes) and, in the activation dtype, the dispatched input (h), the
    fused SwiGLU input and fc2 input (3 expert f) and the permuted probability (1)."""
    spec, tokens, _, act = _shape(rec)
    per = 8 + act * (spec.hidden + 3 * spec.expert_ffn_hidden + 1)
    return sum((r - tokens * spec.top_k) * per for r in rec["facts"]["routed_tokens"])


def _buffers(rec: dict) -> list[tuple[list[int], int, int]]:
    """(parameter numels, data-parallel size, this rank's index) of each DDP buffer: the dense
    parameters over d, the experts over d/e."""
    f, par = rec["facts"], rec["parallel"]
    out = []
    for expert, dp, r in (
        (False, par["dp"], f["dp_rank"]),
        (True, par["dp"] // par["ep"], f["expert_dp_rank"]),
    ):
        nums = [
            n for n, e in zip(f["param_numels"], f["param_is_expert"], strict=True) if e == expert
        ]
        if nums:
            out.append((nums, dp, r))
    return out


def distopt_param_padding_bytes(rec: dict) -> int:
    """The distributed optimizer's bf16 ``param_data`` buffer holds the padding of
    :func:`distopt_layout` besides the weights (2 bytes per padded element)."""
    return 2 * sum(distopt_layout(n, dp)[0] - sum(n) for n, dp, _ in _buffers(rec))


def distopt_grad_padding_bytes(rec: dict) -> int:
    """The fp32 ``grad_data`` buffer's padding (4 bytes per padded element)."""
    return 4 * sum(distopt_layout(n, dp)[0] - sum(n) for n, dp, _ in _buffers(rec))


def distopt_shard_split_bytes(rec: dict) -> int:
    """The distributed optimizer gives each rank the parameters' elements inside its 1/d of the
    padded buffer (:func:`distopt_layout`), not ⌈P/d⌉: 12 bytes per element (fp32 master and
    AdamW's two fp32 moments; docs/user-guide/features/dist_optimizer.md)."""
    total = 0
    for n, dp, r in _buffers(rec):
        numel, ranges = distopt_layout(n, dp)
        total += shard_numel(numel, ranges, dp, r)[0] - -(-sum(n) // dp)
    return 12 * total
