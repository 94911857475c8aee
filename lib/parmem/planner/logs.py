"""Training logs read back: the seconds per step, and the settings, that a reader's own
Megatron-LM log, torchtitan log or PyTorch profiler trace holds, for ``parmem calibrate``
(issue 29) to fit the per-cluster parameters to.

:func:`read_log` reads the text, :func:`read_log_file` a file (a gzipped trace is unzipped); both
return a :class:`StepLog`. The format is recognised from the text itself (:data:`FORMATS`).
Standard library only: no torch.

Megatron-LM
-----------
``training_log`` (NVIDIA/Megatron-LM, ``megatron/training/training.py``) prints one line every
``--log-interval`` iterations, on the last rank only (``print_rank_last``,
``megatron/training/utils/common_utils.py``)::

     [2024-04-06 02:58:23] iteration       30/     100 | consumed samples:         3840 | elapsed time per iteration (ms): 5571.1 | throughput per GPU (TFLOP/s/GPU): 234.4 | learning rate: 6.000000E-06 | global batch size:   128 | lm loss: 1.924535E+00 | ...

The timestamp came in March 2024 (commit f427c6f, "Log datetimes in each training log line";
with microseconds since January 2026, c40b6ea, which also logs the first iteration whatever the
interval, ``is_first_iteration``), the TFLOP/s field with ``--log-throughput`` in November 2023
(2748e7c); older versions and forks (epfLLM's Megatron-LLM) print the line without either.
"elapsed time per iteration (ms)" is the ``interval-time`` timer divided by the iterations
advanced or skipped since the last line: the mean over the log interval. "throughput per GPU" is
``num_floating_point_operations`` of the batch over that time and ``args.world_size``. The line's
"global batch size" is the batch of that iteration (it changes under ``--rampup-batch-size``).

The arguments: ``_print_args`` (``megatron/training/arguments.py``) prints, on rank 0,
``------------------------ arguments ------------------------``, then one line per argument,
sorted by name: two spaces, the name, a space, 48 minus the name's length dots, a space and
``str(value)``; then ``-------------------- end of arguments ---------------------``. A line of
exactly that shape is read wherever it stands (the count of dots makes it unmistakable; a later
line overwrites an earlier one, as a restarted job prints its arguments again); its value is
read with :func:`ast.literal_eval` (True, False, None, ints, floats, lists) or else kept as text
("most_recent", "torch.bfloat16", a path). ``validate_args``' line "using world size: 16,
data-parallel size: 4, context-parallel size: 1 tensor-model-parallel size: 4,
pipeline-model-parallel size: 1" (same file) fills ``world_size``, ``data_parallel_size``,
``context_parallel_size``, ``tensor_model_parallel_size`` and ``pipeline_model_parallel_size``
where the block does not.

torchtitan
----------
``MetricsProcessor.log`` (pytorch/torchtitan, ``torchtitan/components/metrics.py``) logs at
step 1 and every ``metrics.log_freq`` steps (``should_log``) through the handler that
``init_logger`` (``torchtitan/tools/logging.py``) formats as ``[titan] %(asctime)s - %(name)s -
%(levelname)s - %(message)s``::

    [titan] 2026-05-18 16:04:47,456 - root - INFO - step: 15  loss:  3.10680  grad_norm:  0.8587  memory:  9.46GiB(64.99%)  tps: 7,334  tflops: 0.53  mfu: 0.17%

each field in an ANSI colour (``torchtitan/tools/utils.py``, ``Color``) unless
``disable_color_printing``; "mfu: N/A" under quantization; until November 2024 torchtitan
(``train.py``) printed ``wps`` where ``tps`` stands now, and until February 2025 no tflops.
Every rank runs the logging (the trainer calls it on all of them, right after the loss's
all-reduce), so a log of all ranks holds each step once per rank: the first line of each step
is kept. ``torchrun --tee`` puts
``[rank0]:`` before each line (``torch/distributed/elastic/multiprocessing/tail_log.py``,
``TailLog``); colour codes and such prefixes are ignored.

``tps`` is ``ntokens_since_last_log / (time_delta * parallel_dims.non_data_parallel_size)``:
the tokens of every batch this rank loaded since the last log (``labels.numel()``, summed in
``Trainer.batch_generator``, ``torchtitan/trainer.py``), over the ``time.perf_counter()`` seconds
since the last log, over ``non_data_parallel_size`` = cp·tp·pp (``ParallelDims``,
``torchtitan/distributed/parallel_dims.py``). Each rank of a tp·cp·pp group loads the same batch,
so tps is the job's tokens per second divided by its number of GPUs, averaged over the log
interval: tokens per second per GPU. ``tflops`` is ``num_flops_per_token * tps / 1e12``, per GPU.

torchtitan prints no step time (its "end_to_end(s)" goes to TensorBoard and W&B only), so a
step's seconds are the difference of the timestamps of consecutive logged steps over the
difference of their step numbers. That includes the logging itself and whatever else the loop
did in between (a checkpoint, a validation), and the timestamps are to the millisecond. The first
logged step, a step whose line or whose predecessor's line has no timestamp, and a step whose
number does not grow get NaN; when no kept step has seconds, ``step_time`` is NaN and only
``tokens_per_s_per_gpu`` is known.

Settings read (where the log has them): "Building device mesh with parallelism: pp=1,
dp_replicate=1, dp_shard=2, cp=1, tp=1, ep=1" (``ParallelDims.build_mesh``; before December
2025 "Building 2-D device mesh with ['dp_shard', 'tp'], [4, 2]"), keyed by torchtitan's names;
"Model llama3 8B size: 8,030,261,248 total parameters" (``model``, ``flavor``,
``total_parameters``) and "Peak FLOPS used for computing MFU: 9.890e+14" (``peak_flops``), both
``Trainer.__init__``; the numbers of "Trainer is initialized with local batch size 2, global
batch size 16, gradient accumulation steps 1, sequence length 8192, total steps 1000 (warmup
200)" (or "... 16384 tokens per DP rank, 131072 tokens per train step, ..., maximum context
length 8192 ...", or, until March 2025, "Trainer initialized. Training starts at step 1, with
local batch size ...") as ``local_batch_size``, ``global_batch_size``,
``gradient_accumulation_steps``, ``seq_len``, ``max_context_length``, ``steps``,
``warmup_steps``, ``tokens_per_dp_rank`` and ``tokens_per_train_step``. The JSON of
``debug.print_config`` ("Running with configs: ...") is not read.

Profiler traces
---------------
``torch.profiler.profile`` wraps each step in ``record_function("ProfilerStep#N")``, N its step
count (``torch/profiler/profiler.py``, ``profile.start`` and ``profile.step``; torchtitan sets
it to the training step, ``torchtitan/tools/profiler.py``). ``export_chrome_trace`` writes the
Chrome trace format, ``{"traceEvents": [...]}``, each range an event with ``"ph": "X"`` and
``"ts"`` and ``"dur"`` in microseconds; ``tensorboard_trace_handler(use_gzip=True)`` writes
``*.pt.trace.json.gz``. Kineto files the CPU range under the category ``user_annotation`` and
copies it onto each GPU stream as ``gpu_user_annotation`` (pytorch/kineto,
``libkineto/src/ActivityType.cpp``): the CPU range, the wall time from one ``step()`` to the next,
is the step's seconds; the GPU copies, which span only that stream's kernels, are left out. The
steps are ordered by N. ``distributedInfo`` (``_KinetoProfile._get_distributed_info``) gives the
settings ``backend``, ``rank`` and ``world_size``.

Warm-up
-------
The first steps of a job are slow: CUDA and NCCL set up their contexts and communicators,
``torch.compile`` compiles, the caching allocator grows, the optimizer's states are created on
its first step. torchtitan's PR 3935 log shows it: step 1 at 619 tokens/s, steps 2 to 5 at some
87,000. By default a :class:`StepLog` leaves out

* the first logged entry of a Megatron-LM or torchtitan log: it averages over an interval that
  starts with the job (Megatron's first interval holds iteration 1; torchtitan's first ``tps``
  counts from the ``MetricsProcessor``'s creation in ``Trainer.__init__``, before the model is
  sharded, initialised and compiled) or, on a resumed
  job, with the restart, and torchtitan has no previous timestamp to time it by. A profiler
  trace keeps its first step: ``torch.profiler.schedule`` already discards its own warm-up steps;
* every entry whose iteration (step, N) is at most :data:`WARMUP_ITERATIONS`: Megatron-LM's own
  regression tests time a run by the median iteration time over a window that starts at
  iteration 5 (``tests/functional_tests/python_test_utils/common.py``, ``pipeline``).

``warmup=N`` leaves out the first N logged entries instead, and nothing else (``warmup=0`` keeps
all). A log left with no step raises ValueError.
"""

from __future__ import annotations

import ast
import gzip
import json
import math
import os
import re
import statistics
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

__all__ = ["FORMATS", "WARMUP_ITERATIONS", "StepLog", "read_log", "read_log_file"]

#: the formats :func:`read_log` recognises, in the order it tries them
FORMATS = ("megatron", "torchtitan", "profiler")
#: entries whose iteration is at most this are warm-up under the default rule (Megatron-LM's
#: regression tests time from iteration 5 on)
WARMUP_ITERATIONS = 4

_LOOKED_FOR = (
    "Megatron-LM's 'iteration N/M | ... elapsed time per iteration (ms): X' lines, torchtitan's "
    "'step: N  loss: ...' lines, or a PyTorch profiler Chrome trace (JSON with "
    "'ProfilerStep#N' events)"
)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# torchrun's tee prefix ("[rank0]:", "[default0]:"), or several
_RANK_PREFIX = re.compile(r"^(?:\[[A-Za-z_]*\d+\]:)+")

_MEGATRON_STEP = re.compile(r"\biteration\s+(\d+)/\s*\d+\s*\|(.*)")
_MEGATRON_FIELDS = {
    "ms": re.compile(r"elapsed time per iteration \(ms\):\s*([^\s|]+)"),
    "tflops": re.compile(r"throughput per GPU \(TFLOP/s/GPU\):\s*([^\s|]+)"),
    "batch": re.compile(r"global batch size:\s*(\d+)"),
}
_MEGATRON_MARKS = re.compile(r"-+ arguments -+|elapsed time per iteration \(ms\)|using world size:")
_ARG_LINE = re.compile(r"^  ([A-Za-z_]\w*) (\.*)(?: (.*))?$")
_ARG_WIDTH = 48
_WORLD_LINE = re.compile(
    r"(world|data-parallel|context-parallel|tensor-model-parallel|pipeline-model-parallel)"
    r" size: (\d+)"
)

_TITAN_STEP = re.compile(r"(?<!validate )\bstep:\s*(\d+)\s+loss:")
_TITAN_FIELDS = {
    "tps": re.compile(r"\b[tw]ps:\s*([\d,]+(?:\.\d+)?)"),
    "tflops": re.compile(r"\btflops:\s*([\d,]+(?:\.\d+)?)"),
}
_TIMESTAMP = re.compile(r"(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}),(\d{3})")
_TITAN_MARKS = re.compile(r"\[titan\]")
_TITAN_MESH = re.compile(r"Building device mesh with parallelism: (.*)")
_TITAN_OLD_MESH = re.compile(r"Building \d+-D device mesh with (\[.*?\]), (\[.*?\])")
_TITAN_MODEL = re.compile(r"Model (\S+) (\S+) size: ([\d,]+) total parameters")
_TITAN_PEAK = re.compile(r"Peak FLOPS used for computing MFU: ([0-9.eE+-]+)")
_TITAN_COUNTS = {
    "local_batch_size": r"local batch size:? (\d+)",
    "global_batch_size": r"global batch size:? (\d+)",
    "gradient_accumulation_steps": r"gradient accumulation steps (\d+)",
    "seq_len": r"sequence length:? (\d+)",
    "max_context_length": r"maximum context length (\d+)",
    "steps": r"total steps:? (\d+)",
    "warmup_steps": r"\(warmup (\d+)\)",
    "tokens_per_dp_rank": r"(\d+) tokens per DP rank",
    "tokens_per_train_step": r"(\d+) tokens per train step",
}

_PROFILER_STEP = re.compile(r"ProfilerStep#(\d+)")


@dataclass(frozen=True)
class StepLog:
    """What a training log says of its steps; :func:`read_log` makes one (the module docstring
    says where each number comes from).

    ``steps`` are (iteration, seconds per step) as read, in the log's order, one per iteration
    (NaN seconds where the log gives none); ``kept`` the iterations the warm-up rule keeps;
    ``step_time`` the median seconds per step over them (NaN when none has seconds);
    ``tokens_per_s_per_gpu`` torchtitan's tps and ``reported_tflops`` the log's own TFLOP/s per
    GPU, each the median over the kept entries that print it, else None; ``settings`` the
    arguments and configuration the log prints; ``global_batch`` sequences per step where the
    log says so (Megatron-LM's line, of the last kept entry, else its ``global_batch_size``
    argument; torchtitan's "global batch size").
    """

    format: str
    name: str
    steps: tuple[tuple[int, float], ...]
    kept: tuple[int, ...]
    step_time: float
    tokens_per_s_per_gpu: float | None
    reported_tflops: float | None
    settings: dict[str, Any] = field(hash=False)
    global_batch: int | None


@dataclass(frozen=True)
class _Entry:
    iteration: int
    seconds: float
    tokens_per_s: float | None = None
    tflops: float | None = None
    batch: int | None = None


def read_log(text: str, name: str = "<text>", *, warmup: int | None = None) -> StepLog:
    """The steps of a Megatron-LM log, a torchtitan log or a profiler trace (JSON text), the
    format recognised from the text; ``name`` names it in errors. ``warmup=None`` applies the
    default warm-up rule (the module docstring), ``warmup=N`` leaves out the first N logged
    entries instead.

    Raises ValueError for text in no known format (naming the formats looked for), a log with no
    step, and one the warm-up rule leaves without a step.
    """
    if not isinstance(text, str):
        raise ValueError(f"text={type(text).__name__}: a log must be a str")
    if not isinstance(name, str):
        raise ValueError(f"name={name!r}: must be a str")
    if warmup is not None and (
        isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0
    ):
        raise ValueError(f"warmup={warmup!r}: must be None or a whole number >= 0")
    fmt, entries, settings = _parse(text, name)
    if not entries:
        raise ValueError(f"{name}: a {fmt} log with no step in it (looked for {_LOOKED_FOR})")
    return _summary(fmt, name, entries, settings, warmup)


def read_log_file(path: str | os.PathLike[str], *, warmup: int | None = None) -> StepLog:
    """:func:`read_log` of a file: a text log, or a profiler trace as ``.json`` or gzipped
    (``.json.gz``, recognised by its bytes, not its name)."""
    p = Path(path)
    data = p.read_bytes()
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as e:
            raise ValueError(f"{p}: a gzip file that does not unzip ({e})") from e
    return read_log(data.decode("utf-8", errors="replace"), str(p), warmup=warmup)


def _parse(text: str, name: str) -> tuple[str, list[_Entry], dict[str, Any]]:
    """(format, entries, settings) of a log's text."""
    trace = _json_trace(text)
    if trace is not None:
        if isinstance(trace, dict) and not isinstance(trace.get("traceEvents"), list):
            raise ValueError(f"{name}: JSON without 'traceEvents': looked for {_LOOKED_FOR}")
        return "profiler", _profiler_entries(trace), _profiler_settings(trace)
    lines = [_clean(line) for line in text.splitlines()]
    fmt = _detect(lines, name)
    if fmt == "megatron":
        return fmt, _megatron_entries(lines), _megatron_settings(lines)
    return fmt, _titan_entries(lines), _titan_settings(lines)


def _clean(line: str) -> str:
    """A line without colour codes and torchrun's rank prefixes."""
    return _RANK_PREFIX.sub("", _ANSI.sub("", line).rstrip("\r"))


def _detect(lines: list[str], name: str) -> str:
    """'megatron' or 'torchtitan': the format whose step lines the log has, else whose other
    marks it has; ValueError when neither."""
    if any(_megatron_step(line) for line in lines):
        return "megatron"
    if any(_TITAN_STEP.search(line) for line in lines):
        return "torchtitan"
    if any(_MEGATRON_MARKS.search(line) or _arg(line) for line in lines):
        return "megatron"
    if any(_TITAN_MARKS.search(line) for line in lines):
        return "torchtitan"
    raise ValueError(f"{name}: not a log of a known format: looked for {_LOOKED_FOR}")


def _number(text: str) -> float:
    """A printed number ("10,050", "5444.9", "nan"); NaN when it is not one."""
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return math.nan


def _first_per_iteration(entries: Iterable[_Entry]) -> list[_Entry]:
    seen: set[int] = set()
    out = []
    for e in entries:
        if e.iteration not in seen:
            seen.add(e.iteration)
            out.append(e)
    return out


# ---- Megatron-LM -------------------------------------------------------------------------


def _megatron_step(line: str) -> _Entry | None:
    m = _MEGATRON_STEP.search(line)
    if not m:
        return None
    fields = {k: p.search(m[2]) for k, p in _MEGATRON_FIELDS.items()}
    ms, tflops, batch = fields["ms"], fields["tflops"], fields["batch"]
    if ms is None:
        return None
    return _Entry(
        int(m[1]),
        _number(ms[1]) / 1000.0,
        tflops=_number(tflops[1]) if tflops else None,
        batch=int(batch[1]) if batch else None,
    )


def _megatron_entries(lines: list[str]) -> list[_Entry]:
    return _first_per_iteration(e for e in map(_megatron_step, lines) if e is not None)


def _arg(line: str) -> tuple[str, Any] | None:
    """(name, value) of one line of Megatron-LM's arguments block, or None."""
    m = _ARG_LINE.match(line)
    if not m or len(m[2]) != max(_ARG_WIDTH - len(m[1]), 0):
        return None
    return m[1], _value(m[3] or "")


def _value(text: str) -> Any:
    """A printed argument: True/False/None, an int, a float or a list, else the text."""
    s = text.strip()
    if s in ("inf", "-inf", "nan"):
        return float(s)
    try:
        v = ast.literal_eval(s)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return s
    if isinstance(v, tuple):
        return list(v)
    if v is None or isinstance(v, (bool, int, float, list)):
        return v
    return s


def _megatron_settings(lines: list[str]) -> dict[str, Any]:
    settings: dict[str, Any] = {}
    sizes: dict[str, Any] = {}
    for line in lines:
        arg = _arg(line)
        if arg is not None:
            settings[arg[0]] = arg[1]
        elif "using world size:" in line:
            for kind, size in _WORLD_LINE.findall(line):
                sizes[kind.replace("-", "_") + "_size"] = int(size)
    for key, size in sizes.items():
        settings.setdefault(key, size)
    return settings


# ---- torchtitan --------------------------------------------------------------------------


def _timestamp(line: str) -> datetime | None:
    m = _TIMESTAMP.search(line)
    if not m:
        return None
    try:
        t = datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S")
    except ValueError:
        return None
    return t.replace(microsecond=int(m[2]) * 1000)


def _titan_lines(lines: list[str]) -> Iterator[tuple[int, datetime | None, str]]:
    """(step, timestamp, line) of each step line, the first line of each step only."""
    seen: set[int] = set()
    for line in lines:
        m = _TITAN_STEP.search(line)
        if m and int(m[1]) not in seen:
            seen.add(int(m[1]))
            yield int(m[1]), _timestamp(line[: m.start()]), line[m.end() :]


def _titan_entries(lines: list[str]) -> list[_Entry]:
    out = []
    previous: tuple[int, datetime | None] | None = None
    for step, when, rest in _titan_lines(lines):
        seconds = math.nan
        if previous is not None and when is not None and previous[1] is not None:
            if step > previous[0]:
                seconds = (when - previous[1]).total_seconds() / (step - previous[0])
        tps, tflops = (_TITAN_FIELDS[k].search(rest) for k in ("tps", "tflops"))
        out.append(
            _Entry(
                step,
                seconds,
                tokens_per_s=_number(tps[1]) if tps else None,
                tflops=_number(tflops[1]) if tflops else None,
            )
        )
        previous = (step, when)
    return out


def _titan_mesh(line: str) -> dict[str, Any]:
    m = _TITAN_MESH.search(line)
    if m:
        return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m[1])}
    m = _TITAN_OLD_MESH.search(line)
    if m:
        try:
            names, sizes = ast.literal_eval(m[1]), ast.literal_eval(m[2])
        except (ValueError, SyntaxError):
            return {}
        if isinstance(names, list) and isinstance(sizes, list):
            return {str(k): v for k, v in zip(names, sizes, strict=False) if isinstance(v, int)}
    return {}


def _titan_settings(lines: list[str]) -> dict[str, Any]:
    settings: dict[str, Any] = {}
    for line in lines:
        settings.update(_titan_mesh(line))
        model = _TITAN_MODEL.search(line)
        if model:
            settings.update(model=model[1], flavor=model[2])
            settings["total_parameters"] = int(model[3].replace(",", ""))
        peak = _TITAN_PEAK.search(line)
        if peak:
            settings["peak_flops"] = _number(peak[1])
        if "Trainer is initialized with" in line or "Training starts at step" in line:
            for key, pattern in _TITAN_COUNTS.items():
                count = re.search(pattern, line)
                if count:
                    settings[key] = int(count[1])
    return settings


# ---- profiler traces ---------------------------------------------------------------------


def _json_trace(text: str) -> Any:
    """The parsed JSON when the text is a JSON object or list, else None."""
    head = text.lstrip()[:1]
    if head not in ("{", "["):
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _trace_events(trace: Any) -> list[Any]:
    events = trace.get("traceEvents") if isinstance(trace, dict) else trace
    return events if isinstance(events, list) else []


def _profiler_entries(trace: Any) -> list[_Entry]:
    """One entry per ProfilerStep#N, from its CPU-side range ("ph": "X", not a GPU copy)."""
    out = []
    for ev in _trace_events(trace):
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        m = _PROFILER_STEP.fullmatch(str(ev.get("name", "")))
        dur = ev.get("dur")
        if m is None or str(ev.get("cat", "")).startswith("gpu_"):
            continue
        if isinstance(dur, bool) or not isinstance(dur, (int, float)) or not dur >= 0:
            continue
        out.append(_Entry(int(m[1]), dur / 1e6))
    return sorted(_first_per_iteration(out), key=lambda e: e.iteration)


def _profiler_settings(trace: Any) -> dict[str, Any]:
    info = trace.get("distributedInfo") if isinstance(trace, dict) else None
    if not isinstance(info, dict):
        return {}
    return {k: info[k] for k in ("backend", "rank", "world_size") if k in info}


# ---- the summary -------------------------------------------------------------------------


def _kept(fmt: str, entries: list[_Entry], warmup: int | None) -> list[_Entry]:
    if warmup is not None:
        return entries[warmup:]
    skip_first = fmt != "profiler"
    return [
        e
        for i, e in enumerate(entries)
        if not (skip_first and i == 0) and e.iteration > WARMUP_ITERATIONS
    ]


def _median(values: Iterable[float | None]) -> float | None:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.median(finite) if finite else None


def _summary(
    fmt: str, name: str, entries: list[_Entry], settings: dict[str, Any], warmup: int | None
) -> StepLog:
    kept = _kept(fmt, entries, warmup)
    if not kept:
        rule = (
            f"the first {warmup} entries"
            if warmup is not None
            else f"the first entry and iterations <= {WARMUP_ITERATIONS}"
        )
        raise ValueError(
            f"{name}: the warm-up rule ({rule}) leaves none of the {len(entries)} logged "
            f"steps; pass warmup=0 to keep them all"
        )
    step_time = _median(e.seconds for e in kept)
    batches = [e.batch for e in kept if e.batch is not None]
    given = settings.get("global_batch_size")
    if batches:
        global_batch: int | None = batches[-1]
    elif isinstance(given, int) and not isinstance(given, bool):
        global_batch = given
    else:
        global_batch = None
    return StepLog(
        format=fmt,
        name=name,
        steps=tuple((e.iteration, e.seconds) for e in entries),
        kept=tuple(e.iteration for e in kept),
        step_time=math.nan if step_time is None else step_time,
        tokens_per_s_per_gpu=_median(e.tokens_per_s for e in kept),
        reported_tflops=_median(e.tflops for e in kept),
        settings=settings,
        global_batch=global_batch,
    )
