"""A planned layout as a DeepSpeed launch: the ``ds_config.json`` DeepSpeed 0.19.8 reads, and the
command that starts it.

DeepSpeed alone shards data parallelism (ZeRO-1/2/3), shards experts (its ``expert_parallel``
section, AutoEP) and splits sequences the Ulysses way (``sequence_parallel_size``); it has no
Megatron-style tensor parallelism with sequence parallelism and no pipeline schedule for an
unmodified model. So:

* ``t = p = 1``: plain DeepSpeed, ``deepspeed train.py --deepspeed_config ds_config.json``
  (``train.py`` is your training script, calling ``deepspeed.initialize``);
* ``t > 1`` or ``p > 1``: DeepSpeed cannot express the layout by itself. The recipe is
  Megatron-DeepSpeed (github.com/deepspeedai/Megatron-DeepSpeed, commit
  :data:`MEGATRON_DEEPSPEED_COMMIT`): its ``pretrain_gpt.py`` with tensor- and pipeline-parallel
  flags, and the same JSON, whose batch sizes DeepSpeed checks against the data-parallel size
  Megatron's groups give it, ``d = N / (t·p·cp)``.

The JSON's batch sizes satisfy DeepSpeed's own check, ``train_batch_size =
train_micro_batch_size_per_gpu · gradient_accumulation_steps · d``, with the plan's ``b``
and ``m``: DeepSpeed then runs micro-batches of ``b`` and ``m`` accumulation steps.
Context parallelism is Ulysses in DeepSpeed (an all-to-all over heads, not a K/V ring): the
nearest form, said in a note.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from .megatron import model_args
from .recipe import Recipe

if TYPE_CHECKING:
    from ...config import ParallelConfig, TrainingSetup
    from ..result import Candidate, Plan

__all__ = ["DEEPSPEED_VERSION", "MEGATRON_DEEPSPEED_COMMIT", "TARGET", "config", "deepspeed"]

#: The DeepSpeed release the JSON is written for (the tests load it with that release's
#: ``DeepSpeedConfig``).
DEEPSPEED_VERSION = "0.19.8"
#: The Megatron-DeepSpeed commit whose flags the t > 1 or p > 1 recipes use (2025-07-16).
MEGATRON_DEEPSPEED_COMMIT = "4efb479d5317ce9b86096b9d8e3e8030b0b5263b"
#: What :func:`deepspeed` recipes name as their target.
TARGET = (
    f"DeepSpeed {DEEPSPEED_VERSION} (ds_config.json); with t > 1 or p > 1, Megatron-DeepSpeed "
    f"commit {MEGATRON_DEEPSPEED_COMMIT[:10]} (2025-07-16)"
)

#: DeepSpeed's AutoEP presets (``deepspeed.module_inject.auto_ep_presets``) by model family.
_AUTOEP_PRESETS = {"mixtral": "mixtral", "qwen3": "qwen3_moe", "deepseek-v3": "deepseek_v3"}


def _autoep_preset(name: str) -> str | None:
    for prefix, preset in _AUTOEP_PRESETS.items():
        if name.lower().startswith(prefix):
            return preset
    return None


def config(plan: Plan, c: Candidate) -> dict[str, object]:
    """The ``ds_config.json`` of candidate ``c`` of ``plan`` as a dict."""
    st, par = c.setup, c.parallel
    cfg: dict[str, object] = {
        "train_batch_size": plan.global_batch,
        "train_micro_batch_size_per_gpu": st.micro_batch,
        "gradient_accumulation_steps": st.num_microbatches,
        "gradient_clipping": 1.0,
    }
    if st.precision in ("bf16-mixed", "bf16"):
        cfg["bf16"] = {"enabled": True}
    elif st.precision == "fp16-mixed":
        cfg["fp16"] = {"enabled": True}
    zero: dict[str, object] = {"stage": par.zero, "overlap_comm": True}
    if par.zero >= 2:
        zero["contiguous_gradients"] = True
    cfg["zero_optimization"] = zero
    plain = par.tp == 1 and par.pp == 1
    if plain and par.cp > 1:
        cfg["sequence_parallel_size"] = par.cp
    if par.ep > 1 and plain:
        section: dict[str, object] = {"enabled": True, "autoep_size": par.ep}
        preset = _autoep_preset(plan.spec.name)
        if preset:
            section["preset_model"] = preset
        cfg["expert_parallel"] = section
    if st.recompute != "none" and not plain:
        cfg["activation_checkpointing"] = {
            "partition_activations": par.sp,
            "contiguous_memory_optimization": False,
            "cpu_checkpointing": False,
        }
    return cfg


def _launcher(plan: Plan) -> tuple[str, ...]:
    cl = plan.cluster
    out = ["deepspeed", "--num_gpus", str(cl.gpus_per_node)]
    if cl.nodes > 1:
        out += ["--num_nodes", str(cl.nodes), "--hostfile", "hostfile"]
    return tuple(out)


def _megatron_deepspeed_args(plan: Plan, par: ParallelConfig, st: TrainingSetup) -> list[str]:
    """Megatron-DeepSpeed's flags for the layout (its own names: ``--zero-stage``,
    ``--ds-sequence-parallel-size``, ``--moe-expert-parallel-size``)."""
    spec = plan.spec
    args = [a for a in model_args(spec, plan.seq_len) if a != "--group-query-attention"]
    args = _rename_for_megatron_deepspeed(args)
    args += [
        "--tensor-model-parallel-size", str(par.tp),
        "--pipeline-model-parallel-size", str(par.pp),
        "--micro-batch-size", str(st.micro_batch),
        "--global-batch-size", str(plan.global_batch),
        "--zero-stage", str(par.zero),
    ]  # fmt: skip
    if par.pp == 1:
        args.append("--no-pipeline-parallel")
    if par.sp:
        args.append("--sequence-parallel")
    if par.cp > 1:
        args += ["--ds-sequence-parallel-size", str(par.cp)]
    if par.ep > 1:
        args += ["--moe-expert-parallel-size", str(par.ep)]
    if par.vpp > 1:  # the deepspeed profile refuses it too; Megatron-DeepSpeed's flag exists
        # only for Megatron's own schedule, which --deepspeed replaces with the PipelineEngine
        raise ValueError(
            f"vpp={par.vpp}: DeepSpeed's PipelineEngine (runtime/pipe/engine.py) runs one chunk per "
            "stage; a recipe with interleaved stages would not run them"
        )
    if st.recompute == "full":
        args += ["--recompute-granularity", "full", "--recompute-method", "uniform"]
        args.append("--deepspeed-activation-checkpointing")
    elif st.recompute == "selective":
        args += ["--recompute-granularity", "selective"]
    if st.precision in ("bf16-mixed", "bf16"):
        args.append("--bf16")
    elif st.precision == "fp16-mixed":
        args.append("--fp16")
    args += ["--deepspeed", "--deepspeed_config", "ds_config.json"]
    return args


def _rename_for_megatron_deepspeed(args: list[str]) -> list[str]:
    """Megatron-LM's model flags in Megatron-DeepSpeed's spelling."""
    rename = {
        "--num-query-groups": "--num-key-value-heads",
        "--moe-router-topk": "--topk",
        "--num-experts": "--num-experts",
        "--rotary-base": "--rotary-position-embeddings-theta",
    }
    out: list[str] = []
    skip = 0
    for i, a in enumerate(args):
        if skip:
            skip -= 1
            continue
        if a == "--position-embedding-type":
            out.append("--use-rotary-position-embeddings")
            skip = 1
        elif a in ("--moe-ffn-hidden-size", "--moe-token-dispatcher-type"):
            skip = 1
        elif a == "--normalization":
            out += ["--normalization", args[i + 1].lower()]
            skip = 1
        else:
            out.append(rename.get(a, a))
    return out


def _notes(plan: Plan, par: ParallelConfig, st: TrainingSetup, plain: bool) -> list[str]:
    notes = []
    if not plain:
        notes.append(
            f"DeepSpeed {DEEPSPEED_VERSION} alone cannot run t={par.tp}, p={par.pp} on an "
            "unmodified model: this is Megatron-DeepSpeed's pretrain_gpt.py with the DeepSpeed "
            "JSON (its flags are checked against that commit's parser, not run)"
        )
    else:
        notes.append(
            "train.py is your script: model, data and deepspeed.initialize(config='ds_config.json')"
        )
        if st.recompute != "none":
            notes.append(
                f"{st.recompute} recomputation is in your model code (deepspeed.checkpointing "
                "or torch.utils.checkpoint per layer): DeepSpeed's JSON has no switch for it"
            )
        if par.zero == 3:
            # runtime/zero/partition_parameters.py: zero.Init partitions each parameter as its
            # module is built; without it every rank first holds the whole model
            notes.append(
                "ZeRO-3: build the model inside deepspeed.zero.Init(config_dict_or_path="
                "'ds_config.json') (with the Trainer, create HfDeepSpeedConfig before "
                "from_pretrained), else every rank materialises the whole model before it is "
                "sharded"
            )
    if par.cp > 1:
        notes.append(
            f"cp={par.cp}: DeepSpeed splits sequences the Ulysses way (all-to-all over heads, "
            f"heads must divide by {par.cp}), not a K/V ring; the nearest form"
        )
    if par.ep > 1 and plain and _autoep_preset(plan.spec.name) is None:
        notes.append(
            "AutoEP has no preset for this model: add moe_layer_pattern, expert_pattern and "
            "router_pattern to the expert_parallel section"
        )
    return notes


def deepspeed(plan: Plan, c: Candidate) -> Recipe:
    """A DeepSpeed launch recipe (``ds_config.json`` and the command) for candidate ``c`` of
    ``plan``."""
    par, st = c.parallel, c.setup
    plain = par.tp == 1 and par.pp == 1
    text = json.dumps(config(plan, c), indent=2)
    if plain:
        program: tuple[str, ...] = ("train.py",)
        args = ["--deepspeed", "--deepspeed_config", "ds_config.json"]
    else:
        program = ("pretrain_gpt.py",)
        args = _megatron_deepspeed_args(plan, par, st)
    return Recipe(
        engine="deepspeed",
        target=TARGET,
        title=f"parmem plan: {plan.spec.name} on {plan.cluster}: {c.label()}",
        launcher=_launcher(plan),
        program=program,
        args=tuple(args),
        files=(("ds_config.json", text + "\n"),),
        notes=tuple(_notes(plan, par, st, plain)),
    )
