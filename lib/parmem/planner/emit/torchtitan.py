"""A planned layout as a torchtitan 0.3.0 launch: ``torchrun -m torchtitan.train --module M
--config C`` followed by command-line overrides, the only form 0.3.0 reads.

torchtitan 0.3.0 builds its job config from a ``config_registry`` function (``--module``,
``--config``) and command-line overrides (``--section.field value``, parsed by tyro); the TOML
files of earlier releases (``--job.config_file``) are gone, and activation checkpointing is a
sub-command (``activation_checkpoint:full``, ``:selective``, ``:none``), written last.

How the plan maps onto its settings:

* batch: ``training.local_batch_size`` is what one data-parallel rank processes per gradient
  accumulation step; ``global_batch_size / (local_batch_size · d)`` accumulation steps follow.
  Without pipeline parallelism the recipe sets ``local_batch_size = b``, so the engine runs
  micro-batches of ``b`` and ``m`` accumulation steps. With pipeline parallelism the local batch
  is cut into ``local_batch_size / pipeline_parallel_microbatch_size`` pipeline micro-batches:
  the recipe sets ``local_batch_size = b·m`` and a micro-batch of ``b``, so one pipeline
  schedule runs the plan's ``m`` micro-batches (and one accumulation step).
* pipeline split: torchtitan counts the embedding and the output as one layer each
  (``pipeline_parallel_first/last_stage_less_layers = 1``) unless told otherwise; the recipe sets
  both to 0, so its split of ``L`` layers over ``p·v`` stages (the extra layers on the first
  stages) is the plan's; with ``v > 1`` it also sets ``pipeline_parallel_layers_per_stage =
  L/(p·v)``.
* ZeRO: ZeRO-0 is ``data_parallel_replicate_degree = d``; ZeRO-3 is FSDP
  (``data_parallel_shard_degree = d``, resharding after forward); ZeRO-1/2 have no exact form:
  the nearest is FSDP that keeps the parameters gathered between forward and backward
  (``fsdp_reshard_after_forward = never``), said in a note.
* CUDA graphs (on by default in 0.3.0) reject pipeline parallelism and expert parallelism with
  the default token dispatcher: the recipe passes ``--training.disable_cuda_graphs`` then.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

from .recipe import Recipe, torchrun

if TYPE_CHECKING:
    from ...config import ParallelConfig, TrainingSetup
    from ...model import ModelSpec
    from ..result import Candidate, Plan

__all__ = ["TARGET", "TORCHTITAN_VERSION", "model_config", "torchtitan"]

#: The torchtitan release the recipes are written for (the tests parse them with its
#: ``ConfigManager``).
TORCHTITAN_VERSION = "0.3.0"
#: What :func:`torchtitan` recipes name as their target.
TARGET = f"torchtitan {TORCHTITAN_VERSION} (python -m torchtitan.train, command-line overrides)"

_HF = "transformers_modeling_backend"


def _configs() -> dict[str, tuple[str, str]]:
    """parmem model preset -> torchtitan 0.3.0 ``(--module, --config)`` of the models it builds
    itself: the ``fsdp2`` profile's ``[engines.fsdp2.native]`` (one home: the profile's default
    ``loss_chunks`` applies to exactly these)."""
    from ...engines import engine

    return {k: tuple(v.split("/", 1)) for k, v in engine("fsdp2").native}  # type: ignore[misc]


def model_config(spec: ModelSpec) -> tuple[list[str], list[str]]:
    """``--module``/``--config`` (and ``--hf_model``) for ``spec``, and notes: a torchtitan model
    of that name, else torchtitan's Hugging Face backend with the model's Hugging Face id, else
    that backend with a placeholder id to replace."""
    configs = _configs()
    if spec.name in configs:
        module, config = configs[spec.name]
        return ["--module", module, "--config", config], []
    config = f"{_HF}_full_moe" if spec.is_moe else f"{_HF}_full"
    # a Hugging Face id (ASCII letters, digits, ``-_.``; not starting with ``-`` or ``.``, which
    # the launcher would read as an option or a hidden path)
    found = re.search(
        r"Hugging Face ([A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)", spec.source, re.ASCII
    )
    notes = [f"torchtitan {TORCHTITAN_VERSION} has no {spec.name} model: the recipe uses its "
             "Hugging Face transformers backend"]  # fmt: skip
    hf = found.group(1) if found else "YOUR/HF-MODEL-ID"
    if not found:
        notes.append(f"set --hf_model to a Hugging Face model of {spec.name}'s shape")
    return ["--module", _HF, "--config", config, "--hf_model", hf], notes


def _data_parallel(par: ParallelConfig) -> tuple[list[str], list[str]]:
    notes = []
    if par.zero == 0 and par.ep == 1:
        replicate, shard, reshard = par.dp, 1, None
        if par.cp > 1:
            notes.append(
                "torchtitan always shards the weights over the cp ranks (FSDP over dp_shard·cp): "
                "ZeRO-0 with context parallelism has no exact form"
            )
    elif par.zero == 0:  # EP borrows ranks from dp_shard·cp·tp: shard over e, replicate the rest
        shard = par.ep // math.gcd(par.ep, par.cp * par.tp)
        replicate, reshard = par.dp // shard, None
        notes.append(
            f"torchtitan's expert parallelism borrows ranks from FSDP: ZeRO-0 with e={par.ep} "
            f"becomes HSDP ({replicate} replicas x {shard} shards), the nearest valid form"
        )
    else:
        replicate, shard = 1, par.dp
        reshard = "always" if par.zero == 3 else "never"
        if par.zero in (1, 2):
            notes.append(
                f"torchtitan has no ZeRO-{par.zero}: FSDP keeping parameters gathered between "
                "forward and backward (fsdp_reshard_after_forward never) is the nearest form"
            )
    args = [
        "--parallelism.data_parallel_replicate_degree", str(replicate),
        "--parallelism.data_parallel_shard_degree", str(shard),
    ]  # fmt: skip
    if reshard:
        args += ["--parallelism.fsdp_reshard_after_forward", reshard]
    return args, notes


def _pipeline(par: ParallelConfig, st: TrainingSetup, layers: int) -> list[str]:
    if par.pp == 1:
        return []
    # ZB-V is torch.distributed.pipelining's ScheduleZBVZeroBubble: two stages per rank in a V
    # (pipeline_parallel.py maps rank r to stages r and 2p - 1 - r)
    name = {"zbv": "ZBVZeroBubble", "interleaved": "Interleaved1F1B"}.get(st.schedule, "1F1B")
    args = [
        "--parallelism.pipeline_parallel_degree", str(par.pp),
        "--parallelism.pipeline_parallel_schedule", name,
        "--parallelism.pipeline_parallel_microbatch_size", str(st.micro_batch),
        "--parallelism.pipeline_parallel_first_stage_less_layers", "0",
        "--parallelism.pipeline_parallel_last_stage_less_layers", "0",
    ]  # fmt: skip
    if par.vpp > 1:
        args += [
            "--parallelism.pipeline_parallel_layers_per_stage",
            str(layers // (par.pp * par.vpp)),
        ]
    return args


def _model_parallel(par: ParallelConfig) -> list[str]:
    args = ["--parallelism.tensor_parallel_degree", str(par.tp)]
    if par.tp > 1 and not par.sp:
        args.append("--parallelism.no_enable_sequence_parallel")
    if par.cp > 1:
        args += ["--parallelism.context_parallel_degree", str(par.cp)]
    if par.ep > 1:
        args += ["--parallelism.expert_parallel_degree", str(par.ep)]
    return args


def _training(plan: Plan, par: ParallelConfig, st: TrainingSetup) -> list[str]:
    local = st.micro_batch * (st.num_microbatches if par.pp > 1 else 1)
    args = [
        "--training.local_batch_size", str(local),
        "--training.global_batch_size", str(plan.global_batch),
        "--training.seq_len", str(plan.seq_len),
    ]  # fmt: skip
    if st.precision == "bf16":
        args += ["--training.dtype", "bfloat16"]
    if par.pp > 1 or par.ep > 1:
        args.append("--training.disable_cuda_graphs")
    if st.optimizer == "adamw-bf16":
        # AdamW's moments in bf16 (components/optimizer/optimizer.py, implementation)
        args += ["--optimizer.implementation", "fused_opt_states_bf16"]
    return args


def _loss(spec: ModelSpec, st: TrainingSetup) -> list[str]:
    """``--loss.num_chunks`` where the plan's ``loss_chunks`` is not the config's own (8 for the
    models torchtitan builds itself, whose configs wrap the loss in ``ChunkedLossWrapper``); a
    loss over the whole micro-batch for such a model has no command-line form."""
    from ...engines import engine

    prof = engine("fsdp2")
    default, n = (
        prof.default_loss_chunks(spec.name),
        prof.loss_chunks_for(spec.name, st.loss_chunks),
    )
    if n == default:
        return []
    if n == 0:
        raise ValueError(
            f"loss_chunks=0 for {spec.name}: torchtitan {TORCHTITAN_VERSION}'s config wraps its "
            f"loss in ChunkedLossWrapper ({default} chunks) and no command-line override "
            "computes it whole; plan with loss_chunks=None (its default) or a chunk count"
        )
    return ["--loss.num_chunks", str(n)]


def torchtitan(plan: Plan, c: Candidate) -> Recipe:
    """A torchtitan 0.3.0 launch recipe for candidate ``c`` of ``plan``."""
    par, st, spec = c.parallel, c.setup, plan.spec
    args, notes = model_config(spec)
    dp_args, more = _data_parallel(par)
    notes += more
    args += dp_args + _model_parallel(par) + _pipeline(par, st, spec.layers)
    args += _training(plan, par, st)
    if st.tp_comm_overlap and par.tp > 1:
        # async TP, as the plan's time assumed (TrainingSetup.tp_comm_overlap); 0.3.0 runs it
        # under torch.compile only (CompileConfig.__post_init__)
        args += ["--compile.enable", "--compile.enable_async_tensor_parallel"]
        notes.append("async TP compiles the model (torch.compile): the plan's time does not "
                     "model compiled kernels' speed")  # fmt: skip
    args += _loss(spec, st)
    args.append(f"activation_checkpoint:{st.recompute}")
    if st.precision == "fp16-mixed":
        notes.append("torchtitan trains in bf16 or fp32, not fp16: the recipe uses bf16-mixed")
    return Recipe(
        engine="torchtitan",
        target=TARGET,
        title=f"parmem plan: {spec.name} on {plan.cluster}: {c.label()}",
        launcher=torchrun(plan.cluster),
        program=("-m", "torchtitan.train"),
        args=tuple(args),
        notes=tuple(notes),
    )
