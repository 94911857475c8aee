"""A planned layout as settings for a real engine: Megatron-LM command-line arguments, a DeepSpeed
config JSON, a torchtitan TOML job-config fragment. :meth:`parmem.planner.Plan.emit` calls these.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config import ParallelConfig, TrainingSetup
    from .result import Candidate, Plan

__all__ = ["EMITTERS", "ENGINES", "deepspeed", "megatron", "torchtitan"]


def _megatron_parallel(par: ParallelConfig) -> tuple[list[str], list[str]]:
    """Megatron-LM's parallel sizes, SP and ZeRO flags, and notes on them."""
    notes = []
    args = [f"--tensor-model-parallel-size {par.tp}", f"--pipeline-model-parallel-size {par.pp}"]
    if par.cp > 1:
        args.append(f"--context-parallel-size {par.cp}")
    if par.ep > 1:
        args.append(f"--expert-model-parallel-size {par.ep}")
    if par.sp:
        args.append("--sequence-parallel")
    if par.zero == 1:
        args.append("--use-distributed-optimizer")
    elif par.zero >= 2:  # Megatron-FSDP: optim_grads = ZeRO-2, optim_grads_params = ZeRO-3
        notes.append(
            "# ZeRO-2/3 in Megatron-LM is Megatron-FSDP (recent versions; it also "
            "wants --ckpt-format fsdp_dtensor)"
        )
        strategy = "optim_grads" if par.zero == 2 else "optim_grads_params"
        args += [
            "--use-megatron-fsdp",
            f"--data-parallel-sharding-strategy {strategy}",
            "--use-distributed-optimizer",
        ]
    if par.dp * par.cp > 1:
        args.append("--overlap-grad-reduce")
        if par.zero >= 1:
            args.append("--overlap-param-gather")
    return args, notes


def _megatron_recompute(recompute: str) -> list[str]:
    if recompute == "full":
        return [
            "--recompute-granularity full",
            "--recompute-method uniform",
            "--recompute-num-layers 1",
        ]
    if recompute == "selective":
        return ["--recompute-granularity selective"]
    return []


def _megatron_precision(st: TrainingSetup) -> list[str]:
    return {"bf16-mixed": ["--bf16"], "fp16-mixed": ["--fp16"]}.get(st.precision, [])


def megatron(plan: Plan, c: Candidate) -> str:
    """Megatron-LM command-line arguments for candidate ``c`` of ``plan``."""
    par, st, spec = c.parallel, c.setup, plan.spec
    args, notes = _megatron_parallel(par)
    notes.insert(0, f"# parmem plan: {spec.name} on {plan.cluster}: {c.label()}")
    args += _megatron_recompute(st.recompute)
    if par.vpp > 1:
        args.append(f"--num-layers-per-virtual-pipeline-stage {c.layers_per_stage[0] // par.vpp}")
    if len(set(c.layers_per_stage)) > 1:
        notes.append(
            f"# uneven pipeline split {list(c.layers_per_stage)}: Megatron-LM sets only "
            "the first and last stage sizes (--decoder-first-pipeline-num-layers, "
            "--decoder-last-pipeline-num-layers)"
        )
    args += [
        f"--micro-batch-size {st.micro_batch}",
        f"--global-batch-size {plan.global_batch}",
        f"--seq-length {plan.seq_len}",
    ]
    args += _megatron_precision(st)
    return "\n".join(notes) + "\n" + " \\\n".join(args)


def deepspeed(plan: Plan, c: Candidate) -> str:
    """A DeepSpeed config JSON for candidate ``c`` of ``plan`` (the tensor and pipeline sizes are
    launcher arguments)."""
    st, par = c.setup, c.parallel
    cfg: dict[str, int | dict[str, bool | int]] = {
        "train_batch_size": plan.global_batch,
        "train_micro_batch_size_per_gpu": st.micro_batch,
        "gradient_accumulation_steps": st.num_microbatches,
    }
    if st.precision == "bf16-mixed":
        cfg["bf16"] = {"enabled": True}
    elif st.precision == "fp16-mixed":
        cfg["fp16"] = {"enabled": True}
    cfg["zero_optimization"] = {"stage": par.zero, "overlap_comm": True}
    if st.recompute != "none":
        cfg["activation_checkpointing"] = {
            "partition_activations": par.sp,
            "contiguous_memory_optimization": False,
            "cpu_checkpointing": False,
        }
    return json.dumps(cfg, indent=2)


def torchtitan(plan: Plan, c: Candidate) -> str:
    """A torchtitan TOML job-config fragment for candidate ``c`` of ``plan``."""
    par, st = c.parallel, c.setup
    lines = [
        f"# parmem plan: {plan.spec.name} on {plan.cluster}: {c.label()}",
        "# key names follow torchtitan's JobConfig; check them against your version",
        "[parallelism]",
    ]
    if par.zero == 0:
        lines += [f"data_parallel_replicate_degree = {par.dp}", "data_parallel_shard_degree = 1"]
    else:
        lines += ["data_parallel_replicate_degree = 1", f"data_parallel_shard_degree = {par.dp}"]
        if par.zero in (1, 2):
            lines += [
                "# torchtitan shards with FSDP2; keeping parameters gathered between "
                "forward and backward",
                "# is the closest it has to ZeRO-1/2",
                'fsdp_reshard_after_forward = "never"',
            ]
    lines.append(f"tensor_parallel_degree = {par.tp}")
    if par.tp > 1 and not par.sp:
        lines.append("# torchtitan's tensor parallelism always shards norms over the sequence (SP)")
    lines.append(f"pipeline_parallel_degree = {par.pp}")
    if par.pp > 1:
        sched = "Interleaved1F1B" if par.vpp > 1 else "1F1B"
        lines += [
            f'pipeline_parallel_schedule = "{sched}"',
            f"pipeline_parallel_microbatch_size = {st.micro_batch}",
        ]
        if par.vpp > 1:
            lines.append(f"pipeline_parallel_layers_per_stage = {c.layers_per_stage[0] // par.vpp}")
    lines.append(f"context_parallel_degree = {par.cp}")
    if par.ep > 1:
        lines.append(f"expert_parallel_degree = {par.ep}")
    lines += [
        "",
        "[training]",
        f"local_batch_size = {plan.global_batch // par.dp}",
        f"global_batch_size = {plan.global_batch}",
        f"seq_len = {plan.seq_len}",
        "",
        "[activation_checkpoint]",
        f'mode = "{st.recompute}"',
    ]
    if st.recompute == "selective":
        lines.append('selective_ac_option = "op"')
    return "\n".join(lines) + "\n"


#: Engine name -> the function that writes its settings.
EMITTERS: dict[str, Callable[[Plan, Candidate], str]] = {
    "megatron": megatron,
    "deepspeed": deepspeed,
    "torchtitan": torchtitan,
}

#: Engines :meth:`parmem.planner.Plan.emit` writes flags for.
ENGINES = tuple(EMITTERS)
