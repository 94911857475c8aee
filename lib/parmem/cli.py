"""The ``parmem`` command::

    parmem models
    parmem engines
    parmem estimate --model llama-2-7b --tp 4 --pp 2 --dp 8 --zero 1 --seq 4096 [--json]
        [--engine megatron-core] [--optimizer lion] [--offload optimizer] [--gpu h100-sxm]
    parmem fit seq --model llama-3-70b --tp 8 --pp 2 --sp --recompute full --gpu h100-sxm
    parmem fit gpus --model llama-3-70b --seq 4096 --engine megatron-core
    parmem kv --model llama-3-70b --seq 8192 --batch 16 --tp 8
    parmem serve-memory --model llama-2-7b --weights int4 --seq 4096 --batch 8
    parmem plan --model gpt3-175b --gpu a100-80gb --gpus-per-node 8 --nodes 96 \
        --global-batch 1536 --seq 2048 [--top 10] [--json] [--emit megatron|deepspeed|torchtitan]
    parmem measure --model llama-2-7b [--dp 2] [--layers 2] [--width-factor 16] [--seq-len 32]
        [--engine fsdp2 --zero 3] [--json]
    parmem measure --model llama-2-7b --dp 8 --seq 4096 --engine megatron-core \
        (--log train.log | --snapshot snapshot.pickle) [--gpu h100-sxm]
    parmem calibrate train.log --model mixtral-8x7b --gpu h100-sxm [--fit mfu] [--plan]

``--model`` takes a preset name or the path of a Hugging Face ``config.json`` (or its folder);
a preset wins over a folder of the same name unless the argument has a ``/`` or ends in
``.json``. Errors print one line to stderr, naming the flag, and exit with status 2.
``parmem plan`` and ``parmem fit`` exit with status 1 when no layout (no value) fits (the reason goes to stderr; with
``--json`` the plan still goes to stdout); ``parmem measure`` when a measured category is
left unexplained (measured != estimate + the named differences). Output piped into a command that stops reading
(``parmem plan ... | head``) ends quietly with status 141, as a killed-by-SIGPIPE tool does;
stdout closed (``>&-``) or not writable is one line and status 2. ``--json`` writes ``null``
for a number JSON cannot hold (inf, nan); characters the terminal's encoding lacks print as
backslash escapes.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._check import (
    MAX_BATCH,
    MAX_GPUS,
    MAX_LAYERS,
    MAX_SEQ_LEN,
    OneLineParser,
    run_guarded,
    short,
    strict_json,
    write_err,
    write_out,
)
from .bounds import bounds
from .config import (
    ADAPTERS,
    BASE_QUANTS,
    FP8_RECIPES,
    GRAD_DTYPES,
    LORA_TARGETS,
    OFFLOADS,
    OPTIMIZERS,
    PRECISIONS,
    RECOMPUTE,
    SCHEDULES,
    ParallelConfig,
    TrainingSetup,
    vpp_schedule,
)
from .engines import engine, engines
from .estimate import estimate
from .fit import BOUNDS, fewest_gpus, max_micro_batch, max_requests, max_seq_len
from .inference import KV_DTYPES, WEIGHT_DTYPES, kv_cache_bytes, kv_cache_bytes_per_token
from .inference import weight_bytes as _weight_bytes
from .model import ModelSpec, presets
from .planner.emit import PROFILES
from .units import GIB


def _model(name: str) -> ModelSpec:
    """``--model``: a preset name, else the path of a config.json or its folder (an error names
    the flag, also one the operating system raises: a name too long for a path)."""
    try:
        return _find_model(name)
    except (ValueError, OSError) as e:
        raise ValueError(f"--model {name!r:.80}: {short(e)}") from None


def _find_model(name: str) -> ModelSpec:
    """A preset wins over a file or folder of the same name unless ``name`` has a path separator
    or ends in ``.json``."""
    is_path = name.endswith(".json") or any(sep and sep in name for sep in ("/", os.sep, os.altsep))
    if not is_path and name.lower() in presets():
        return ModelSpec.preset(name)
    path = Path(name).expanduser()
    if is_path or path.exists():
        return ModelSpec.from_hf_config(path)
    return ModelSpec.preset(name)  # unknown: the message lists the presets


def _cmd_hf_families(args) -> int:
    """``parmem models --hf``: the Transformers families a config.json is read for, and the
    model_types refused with the reason (parmem.hfconfig, data/hf_families.toml)."""
    from .hfconfig import families, refused_families

    read, refused = families(), refused_families()
    if args.json:
        write_out(strict_json({"supported": read, "refused": refused}))
        return 0
    write_out(f"config.json families parmem reads ({len(read)}, by model_type):")
    for name, cls in read.items():
        write_out(f"  {name:<18} {cls}")
    write_out("refused (any other model_type is refused too):")
    for name, why in refused.items():
        write_out(f"  {name:<18} {why}")
    return 0


def _cmd_models(args) -> int:
    if getattr(args, "hf", False):
        return _cmd_hf_families(args)
    rows = []
    for n in presets():
        s = ModelSpec.preset(n)
        rows.append(
            {
                "name": n,
                "params": s.num_params(),
                "active_params": s.num_params(True),
                "layers": s.layers,
                "hidden": s.hidden,
                "heads": s.heads,
                "kv_heads": s.kv_heads,
                "vocab": s.vocab_size,
            }
        )
    if args.json:
        write_out(strict_json(rows))
        return 0
    write_out(f"{'name':<15} {'params':>18} {'L':>4} {'h':>6} {'a':>4} {'kv':>4} {'V':>7}")
    for r in rows:
        write_out(
            f"{r['name']:<15} {r['params']:>18,} {r['layers']:>4} {r['hidden']:>6} "
            f"{r['heads']:>4} {r['kv_heads']:>4} {r['vocab']:>7}"
        )
    return 0


def _cmd_engines(args) -> int:
    names = engines()
    if args.json:
        rows = [{"name": n, "title": t, "version": engine(n).version} for n, t in names.items()]
        write_out(strict_json(rows))
        return 0
    width = max(map(len, names))
    for n, title in names.items():
        write_out(f"{n:<{width}}  {title} ({engine(n).version})")
    return 0


def _parallel(args) -> ParallelConfig:
    """The layout flags shared by ``estimate`` and ``fit``."""
    return ParallelConfig(
        dp=args.dp,
        tp=args.tp,
        pp=args.pp,
        ep=args.ep,
        cp=args.cp,
        sp=args.sp,
        zero=args.zero,
        vpp=args.vpp,
    )


def _setup(args, seq: int) -> TrainingSetup:
    """The step flags shared by ``estimate`` and ``fit`` (``seq``: ``--seq``, or 1 when ``fit
    seq`` searches it)."""
    schedule = args.schedule or vpp_schedule(args.vpp)
    return TrainingSetup(
        seq_len=seq,
        micro_batch=args.micro_batch,
        num_microbatches=args.microbatches,
        precision=args.precision,
        optimizer=args.optimizer,
        recompute=args.recompute,
        schedule=schedule,
        flash_attention=args.flash,
        dropout=args.dropout,
        grad_buckets=args.grad_buckets,
        cuda_context=int(round(args.context_gib * GIB)),
        engine=args.engine,
        grad_dtype=args.grad_dtype,
        offload=args.offload,
        adapter=args.adapter,
        lora_rank=args.lora_rank,
        lora_targets=args.lora_targets,
        lora_dropout=args.lora_dropout,
        base_quant=args.base_quant,
        double_quant=args.double_quant,
        offload_activations=args.offload_activations,
        fp8=args.fp8,
        galore_rank=args.galore_rank,
        loss_chunks=args.loss_chunks,
    )


def _bound_options(args) -> dict:
    """``--measured-context-gib`` and ``--reserve-gib``: a reader's own measurements."""
    out = {}
    if args.measured_context_gib is not None:
        out["cuda_context"] = int(round(args.measured_context_gib * GIB))
    if args.reserve_gib is not None:
        out["reserve"] = int(round(args.reserve_gib * GIB))
    return out


def _cmd_estimate(args) -> int:
    spec = _model(args.model)
    lps = list(args.layers_per_stage) if args.layers_per_stage else None
    est = estimate(
        spec,
        _parallel(args),
        _setup(args, args.seq),
        layers_per_stage=lps,
        world_size=args.world_size,
        gpus_per_node=args.gpus_per_node,
    )
    if args.gpu is None:
        write_out(strict_json(est.to_dict()) if args.json else est)
        return 0
    band = bounds(est, args.gpu, **_bound_options(args))
    if args.json:
        write_out(strict_json({**est.to_dict(), "bounds": band.to_dict()}))
    else:
        write_out(f"{est}\n{band}")
    return 0


def _cmd_fit(args) -> int:
    spec = _model(args.model)
    opts = _bound_options(args)
    if args.quantity == "requests":
        if args.seq is None:
            raise ValueError("--seq is required: the length of every request")
        ans = max_requests(
            spec,
            args.seq,
            args.gpu,
            tp=args.tp,
            weight_dtype=args.weights,
            kv_dtype=args.kv_dtype,
            utilization=args.utilization,
        )
    elif args.quantity == "seq":
        ans = max_seq_len(
            spec, _parallel(args), _setup(args, 1), args.gpu, bound=args.bound, **opts
        )
    else:
        if args.seq is None:
            raise ValueError(f"--seq is required for fit {args.quantity}")
        if args.quantity == "micro-batch":
            ans = max_micro_batch(
                spec, _parallel(args), _setup(args, args.seq), args.gpu, bound=args.bound, **opts
            )
        else:
            ans = fewest_gpus(
                spec,
                _setup(args, args.seq),
                args.gpu,
                bound=args.bound,
                max_gpus=args.max_gpus,
                **opts,
            )
    write_out(strict_json(ans.to_dict()) if args.json else ans)
    return 0 if ans.fits else 1


def _cmd_kv(args) -> int:
    spec = _model(args.model)
    per_tok = kv_cache_bytes_per_token(spec, args.dtype, args.tp)
    total = kv_cache_bytes(spec, args.seq, args.batch, args.dtype, args.tp)
    if args.json:
        write_out(
            strict_json(
                {
                    "model": spec.name,
                    "bytes_per_token": per_tok,
                    "bytes": total,
                    "seq_len": args.seq,
                    "batch": args.batch,
                    "tp": args.tp,
                    "dtype": args.dtype,
                }
            )
        )
    else:
        write_out(
            f"{spec.name}: KV cache {per_tok:,} bytes/token per GPU ({per_tok / 2**10:.0f} KiB); "
            f"{args.batch} x {args.seq} tokens at tp={args.tp}: {total:,} bytes "
            f"= {total / GIB:.2f} GiB per GPU"
        )
    return 0


def _cmd_serve(args) -> int:
    spec = _model(args.model)
    w = _weight_bytes(spec, args.weights, tp=args.tp)
    kv = kv_cache_bytes(spec, args.seq, args.batch, args.kv_dtype, args.tp)
    out = {
        "model": spec.name,
        "weights_bytes_per_gpu": w,
        "kv_cache_bytes_per_gpu": kv,
        "total_bytes_per_gpu": w + kv,
    }
    if args.json:
        write_out(strict_json(out))
    else:
        write_out(
            f"{spec.name} at tp={args.tp}: weights ({args.weights}) {w / GIB:.2f} GiB + KV cache "
            f"({args.kv_dtype}, {args.batch} x {args.seq}) {kv / GIB:.2f} GiB = "
            f"{(w + kv) / GIB:.2f} GiB per GPU (GiB = 2**30 bytes; weights as the sharding table "
            "splits them, norms replicated)"
        )
    return 0


def _cmd_startup(args) -> int:
    from .serving import check_command, emit_command, startup

    spec = _model(args.model)
    gpu = args.gpu
    if args.log:
        return _serve_log(spec, args)
    r = startup(spec, gpu, **_serve_settings(args))
    if args.emit:
        cmd = emit_command(
            args.engine,
            args.model,
            tp=args.tp,
            pp=args.pp,
            max_model_len=r.max_model_len,
            utilization=args.utilization,
            quantization=args.quantization,
            kv_cache_dtype=args.kv_cache_dtype,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            dtype=args.dtype,
        )
        check_command(args.engine, cmd)
        write_out(cmd if r.starts else f"{cmd}\n# {r.verdict}")
        return 0 if r.starts else 1
    if args.json:
        from dataclasses import asdict

        write_out(strict_json({"model": spec.name, **asdict(r)}))
        return 0
    rows = [
        ("weights", r.weights),
        ("activation peak (profiled)", r.activation),
        ("non-torch memory", r.non_torch),
        ("KV cache", r.kv),
    ]
    lines = [
        f"{spec.name} on {args.engine} {args.gpu} tp={args.tp} pp={args.pp} "
        f"(per GPU, GiB = 2**30 bytes; budget {r.budget / GIB:.2f} of {r.total / GIB:.2f})"
    ]
    lines += [f"  {k:<28}{v / GIB:>9.2f}" for k, v in rows]
    lines += [f"  KV tokens {r.tokens:,}; longest request {r.longest:,} tokens", f"  {r.verdict}"]
    if r.starts:
        lines.append("  " + _latency_line(spec, args, r))
    write_out("\n".join(lines))
    return 0 if r.starts else 1


def _serve_settings(args) -> dict:
    """The keywords of :func:`parmem.serving.startup` that ``parmem serve``'s flags give."""
    return {
        "engine": args.engine,
        "tp": args.tp,
        "pp": args.pp,
        "quantization": args.quantization,
        "dtype": args.dtype,
        "kv_cache_dtype": args.kv_cache_dtype,
        "utilization": args.utilization,
        "max_model_len": args.max_model_len,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "max_num_seqs": args.max_num_seqs,
        "version": args.engine_version,
    }


def _serve_log(spec: ModelSpec, args) -> int:
    """``parmem serve --log FILE``: the reader's own startup log beside the prediction."""
    from .serving_log import compare_log

    try:
        text = Path(args.log).read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise ValueError(f"--log {args.log!r:.80}: {short(e)}") from None
    r, rows = compare_log(spec, text, args.gpu, **_serve_settings(args))
    lines = [
        f"{spec.name} on {r.engine}: the log beside parmem (GiB = 2**30 bytes)",
        f"  {'':<16}{'log':>12}{'parmem':>12}{'difference':>12}",
    ]
    for row in rows:
        fmt = "{:>12,}" if row["what"] == "KV tokens" else "{:>12.2f}"
        cells = "".join(fmt.format(row[k]) for k in ("log", "parmem", "difference"))
        lines.append(f"  {row['what']:<16}{cells}")
    lines.append(f"  parmem: {r.verdict}")
    write_out("\n".join(lines))
    return 0


def _latency_line(spec: ModelSpec, args, r) -> str:
    """TTFT and TPOT of ``--batch`` requests (``parmem.serving_latency``, a roofline whose
    kernel efficiencies are stated assumptions)."""
    from .serving_latency import serving_latency

    kv = "bf16" if args.kv_cache_dtype in ("auto", "bf16", "fp16") else args.kv_cache_dtype
    lat = serving_latency(
        spec,
        args.gpu,
        prompt=args.prompt,
        output=args.output,
        batch=args.batch,
        tp=args.tp,
        pp=args.pp,
        weights=r.weights,
        kv_dtype=kv,
    )
    return (
        f"roofline, {args.batch} requests of {args.prompt}+{args.output} tokens: TTFT "
        f"{1e3 * lat.ttft_s:.1f} ms, TPOT {1e3 * lat.tpot_s:.2f} ms, "
        f"{lat.tokens_per_s_per_gpu:,.0f} tokens/s per GPU"
    )


def _cmd_measure(args) -> int:
    """``parmem measure``: a step of the reader's shrunk model on CPU ranks beside the estimate
    (:mod:`parmem.measure_model`, :mod:`parmem.distributed.measure_step`); with ``--snapshot``
    or ``--log``, the reader's own GPU numbers beside the estimate of the model and layout."""
    from . import measure_model as mm

    if args.snapshot or args.log:
        return _measure_readings(args)
    spec = _model(args.model)
    par, setup = _parallel(args), _setup(args, args.seq or 32)
    mm.check_runnable(par, setup)
    if args.device == "cuda":
        _need_cuda(par.dp)
    sh = mm.shrink(
        mm.model_config(spec, args.model),
        width_factor=args.width_factor,
        layers=args.layers,
        vocab=args.vocab,
        experts=args.experts,
        dropout=args.dropout,
        name=spec.name,
    )
    kw = mm.step_args(sh, par, setup)
    from .distributed import Pool, RankError

    try:
        with Pool(world_size=par.dp, backend="nccl" if args.device == "cuda" else "gloo") as pool:
            results = pool.run("parmem.distributed.measure_step:step", timeout=900, **kw)
    except RankError as e:
        last = [x for x in e.traceback.strip().splitlines() if x.strip()][-1:]
        raise ValueError(f"rank {e.rank} failed: {''.join(last)}") from None
    rep = mm.report(sh, par, setup, results, args.device)
    write_out(strict_json(rep) if args.json else mm.format_report(rep))
    left = any(r["unexplained"] for d in rep["depths"] for rows in d["rows"] for r in rows)
    return 1 if left else 0


def _need_cuda(ranks: int) -> None:
    """``--device cuda`` needs torch with CUDA and one GPU per rank (NCCL)."""
    try:
        import torch
    except ImportError:
        raise ValueError("--device cuda: torch is not installed") from None
    if not torch.cuda.is_available():
        raise ValueError(
            "--device cuda: no CUDA device here (torch.cuda.is_available() is False); run it on "
            "a GPU machine, or measure on CPU ranks (the default)"
        )
    if torch.cuda.device_count() < ranks:
        raise ValueError(
            f"--device cuda: --dp {ranks} needs one GPU per rank, {torch.cuda.device_count()} here"
        )


def _measure_readings(args) -> int:
    """``parmem measure --snapshot FILE`` / ``--log FILE``: their numbers beside the estimate."""
    from . import measure_model as mm

    if args.seq is None:
        raise ValueError(
            "--seq is required with --snapshot or --log: the sequence length the run used"
        )
    spec = _model(args.model)
    est = estimate(spec, _parallel(args), _setup(args, args.seq))
    readings: list = []
    for flag, path in (("--snapshot", args.snapshot), ("--log", args.log)):
        if not path:
            continue
        try:
            raw = Path(path).expanduser().read_bytes()
        except OSError as e:
            raise ValueError(f"{flag} {path!r:.80}: {short(e)}") from None
        try:
            if flag == "--snapshot":
                readings += mm.read_snapshot(raw)
            else:
                readings += mm.read_log(raw.decode("utf-8", errors="replace"))
        except ValueError as e:
            raise ValueError(f"{flag} {path!r:.80}: {short(e)}") from None
    band = bounds(est, args.gpu, **_bound_options(args)) if args.gpu else None
    rows = mm.beside_estimate(est, readings, band)
    if args.json:
        write_out(strict_json({"estimate": est.to_dict(), "rows": rows}))
        return 0
    mib = 2**20
    lines = [est._title(), "the reader's numbers beside parmem (MiB = 2**20 bytes)"]
    lines.append(
        f"  {'reading':<46}{'stage':>6}{'value':>12}{'parmem':>12}{'difference':>12}  beside"
    )
    for r in rows:
        lines.append(
            f"  {r['who'] + ': ' + r['what']:<46}{r['stage']:>6}{r['reading'] / mib:>12.1f}"
            f"{r['parmem'] / mib:>12.1f}{r['difference'] / mib:>+12.1f}  {r['beside']}"
        )
    write_out("\n".join(lines))
    return 0


def _int(lo: int = 1, hi: int = MAX_GPUS) -> Callable[[str], int]:
    """An argparse type: an integer in ``lo..hi`` (argparse names the flag in the message)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r:.40} is not an integer") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{text:.40} must be an integer in {lo}..{hi}")
        return value

    return parse


def _real(lo: float, hi: float) -> Callable[[str], float]:
    """An argparse type: a finite number in ``lo..hi``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r:.40} is not a number") from None
        if not math.isfinite(value) or not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{text:.40} must be a number in {lo:g}..{hi:g}")
        return value

    return parse


def _ints(text: str) -> tuple[int, ...]:
    """An argparse type: integers in 0..MAX_GPUS separated by commas."""
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r:.40} must be integers separated by commas"
        ) from None
    if not all(0 <= v <= MAX_GPUS for v in values):
        raise argparse.ArgumentTypeError(f"{text:.40}: each value must be in 0..{MAX_GPUS}")
    return values


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(","))


def _cmd_plan(args) -> int:
    from .planner import Cluster, plan

    spec = _model(args.model)
    cluster = Cluster(gpu=args.gpu, gpus_per_node=args.gpus_per_node, nodes=args.nodes)
    opts = {}
    for name in ("tp", "pp", "cp", "ep", "zero", "recompute", "micro_batch", "vpp"):
        value = getattr(args, name)
        if value is not None:
            opts[name] = value
    opts.update(_assumptions(args))
    if args.no_sp:
        opts["sp"] = (False,)
    kw = dict(
        uneven_pp=args.uneven_pp,
        precision=args.precision,
        optimizer=args.optimizer,
        flash_attention=args.flash,
        dropout=False if args.no_dropout else None,
        engine=args.engine or (PROFILES[args.emit] if args.emit else "paper"),
        adapter=args.adapter,
        lora_rank=args.lora_rank,
        lora_targets=args.lora_targets,
        base_quant=args.base_quant,
        tp_comm_overlap=args.tp_comm_overlap,
        loss_chunks=args.loss_chunks,
        **opts,
    )
    result = plan(spec, cluster, args.global_batch, args.seq, top=args.top, **kw)
    if args.sensitivity and result.best is not None and not args.json:
        from .planner.sensitivity import SENSITIVITY_POOL, format_sensitivity, sensitivity

        pool = plan(spec, cluster, args.global_batch, args.seq,
                    top=max(args.top, SENSITIVITY_POOL), **kw)  # fmt: skip
        write_out(result)
        write_out(format_sensitivity(sensitivity(pool), len(pool.candidates)))
        return 0
    if args.json:
        write_out(strict_json(result.to_dict()))
    elif result.best is not None:
        write_out(result.emit(args.emit) if args.emit else result)
    if result.best is None:
        write_err(f"parmem: {result.message}")
        return 1
    return 0


#: The planner's assumption flags of ``plan`` and ``calibrate``: (flag, help, upper bound)
ASSUMPTION_FLAGS = (
    ("mfu", "busy fraction of peak FLOP/s", 1),
    ("headroom", "fraction of GPU memory kept free", 1),
    ("tp-overlap", "fraction of TP comm hidden", 1),
    ("dp-overlap", "fraction of the DP overlap window used (engine paper)", 1),
    ("dp-overlap-on", "the same, for engines whose recipe overlaps DP comm", 1),
    ("pp-overlap", "fraction of PP comm hidden", 1),
    ("ep-overlap", "fraction of EP all-to-all hidden", 1),
    ("mfu-ampere-scale", "engines' kernel efficiency on A100s, times --mfu", 2),
    ("mfu-hopper-scale", "engines' kernel efficiency on H100s and H200s, times --mfu", 2),
    ("attention-efficiency", "attention kernels' rate relative to the GEMMs'", 2),
)


def _assumption_flags(p: argparse.ArgumentParser) -> None:
    for flag, what, hi in ASSUMPTION_FLAGS:
        p.add_argument(
            f"--{flag}",
            type=_real(0, hi),
            default=None,
            help=f"{what}, 0..{hi} (default: parmem.planner.Assumptions)",
        )


def _assumptions(args: argparse.Namespace) -> dict[str, float]:
    """The assumption flags given (:data:`ASSUMPTION_FLAGS`), by their planner names."""
    out = {}
    for flag, _, _ in ASSUMPTION_FLAGS:
        value = getattr(args, flag.replace("-", "_"))
        if value is not None:
            out[flag.replace("-", "_")] = value
    return out


def _log_run(args: argparse.Namespace, path: str) -> Any:
    """``parmem calibrate``'s run from one training log and the layout flags."""
    from .planner.logs import read_log_file
    from .planner.own_runs import run_from_log

    if args.model is None:
        raise ValueError("--model is required with a training log: the model the run trained")
    if args.gpu is None:
        raise ValueError("--gpu is required with a training log: the GPUs the run used")
    try:
        log = read_log_file(path, warmup=args.warmup)
    except OSError as e:
        raise ValueError(f"{path}: {e.strerror or e}") from None
    return run_from_log(
        log, _model(args.model), args.gpu, gpus_per_node=args.gpus_per_node, nodes=args.nodes,
        engine=args.engine, t=args.tp, p=args.pp, cp=args.cp, e=args.ep, v=args.vpp,
        zero=args.zero, sp=args.sp, b=args.micro_batch, G=args.global_batch, s=args.seq,
        recompute=args.recompute,
    )  # fmt: skip


def _cmd_calibrate(args) -> int:
    """``parmem calibrate``: fit the planner's assumptions to the reader's measured steps."""
    from .planner import Cluster
    from .planner.own_runs import FITTABLE, calibrate, runs_from_toml

    if not args.logs and not args.runs:
        raise ValueError("give at least one training log, or --runs FILE.toml")
    names = tuple(dict.fromkeys(args.fit))
    for n in names:
        if n not in FITTABLE:
            raise ValueError(f"--fit {n!r}: choose from {', '.join(FITTABLE)}")
    runs = [_log_run(args, path) for path in args.logs]
    if args.runs:
        try:
            runs += runs_from_toml(args.runs)
        except OSError as e:
            raise ValueError(f"--runs {args.runs}: {e.strerror or e}") from None
    start: Any = _assumptions(args)  # AssumptionOptions: names checked by the parser
    result = calibrate(runs, fit=names, **start)
    if args.json:
        write_out(strict_json(result.to_dict()))
        return 0
    write_out(result)
    if args.plan:
        first = runs[0].run
        c = first.cluster
        replanned = result.plan(first.spec, Cluster(c.hardware, c.gpus_per_node, c.nodes),
                                first.parallel.dp * first.setup.micro_batch
                                * first.setup.num_microbatches,
                                first.setup.seq_len, top=args.top, engine=first.setup.engine)  # fmt: skip
        write_out("")
        write_out(replanned)
        if replanned.best is None:
            write_err(f"parmem: {replanned.message}")
            return 1
    return 0


def _calibrate_parser(sub: Any) -> None:
    p = sub.add_parser(
        "calibrate",
        help="fit the planner's time assumptions to your own training logs, then plan with them",
    )
    p.add_argument(
        "logs", nargs="*", help="training logs: Megatron-LM, torchtitan, a profiler trace (.json)"
    )
    p.add_argument("--runs", default=None, help="more runs, as rows of data/measured_runs.toml")
    p.add_argument("--model", default=None, help="preset name or path to a config.json")
    p.add_argument("--gpu", default=None, help="hardware preset of the run's GPUs")
    p.add_argument("--gpus-per-node", type=_int(1, 1024), default=8)
    p.add_argument(
        "--nodes", type=_int(), default=None, help="default: the log's world size / per node"
    )
    p.add_argument(
        "--engine",
        default=None,
        choices=tuple(engines()),
        help="engine profile (default: megatron-core for Megatron logs, fsdp2 for torchtitan)",
    )
    for flag, hi in (("tp", MAX_GPUS), ("pp", MAX_LAYERS), ("cp", MAX_GPUS), ("ep", MAX_GPUS),
                     ("vpp", MAX_LAYERS)):  # fmt: skip
        p.add_argument(f"--{flag}", type=_int(1, hi), default=None, help="if the log does not say")
    p.add_argument("--zero", type=_int(0, 3), default=None, choices=(0, 1, 2, 3))
    p.add_argument("--sp", action="store_true", default=None, help="sequence parallelism")
    p.add_argument("--micro-batch", type=_int(1, MAX_BATCH), default=None)
    p.add_argument("--global-batch", type=_int(1, MAX_BATCH), default=None, help="sequences")
    p.add_argument("--seq", type=_int(1, MAX_SEQ_LEN), default=None, help="sequence length s")
    p.add_argument("--recompute", default=None, choices=RECOMPUTE)
    p.add_argument(
        "--fit", type=_names, default=("mfu",), help="assumptions to fit, e.g. mfu,dp_overlap_on"
    )
    p.add_argument(
        "--warmup", type=_int(0, 10**6), default=None, help="logged steps to leave out first"
    )
    p.add_argument("--plan", action="store_true", help="then plan the run's cluster with the fit")
    p.add_argument("--top", type=_int(1, 10**6), default=5, help="layouts to list with --plan")
    p.add_argument("--json", action="store_true", help="the calibration as JSON")
    _assumption_flags(p)
    p.set_defaults(func=_cmd_calibrate)


def _loss_chunks_flag(p: argparse.ArgumentParser) -> None:
    """``--loss-chunks``: TrainingSetup.loss_chunks (default: the engine's for the model)."""
    p.add_argument(
        "--loss-chunks",
        type=_int(0, MAX_SEQ_LEN),
        default=None,
        help="sequence chunks of the loss (default: the engine's for the model; torchtitan "
        "chunks its own Llama 3 models' loss in 8; 0: the whole micro-batch at once)",
    )


def _flash_flags(p: argparse.ArgumentParser) -> None:
    """``--flash`` / ``--no-flash``; neither: the engine profile's own attention kernel."""
    flash = p.add_mutually_exclusive_group()
    flash.add_argument(
        "--flash",
        action="store_true",
        default=None,
        help="attention keeps no s x s matrix (default: the engine's kernel)",
    )
    flash.add_argument("--no-flash", dest="flash", action="store_false", help="it keeps it")


def _adapter_flags(p: argparse.ArgumentParser, step: bool = True) -> None:
    """The fine-tuning flags (``--engine hf``): LoRA or QLoRA adapters; with ``step`` (estimate
    and fit) also their dropout, double quantisation and activation offload."""
    p.add_argument(
        "--adapter", default="none", choices=ADAPTERS, help="LoRA or QLoRA (PEFT, --engine hf)"
    )
    p.add_argument("--lora-rank", type=_int(1, 65536), default=16, help="LoRA rank r")
    p.add_argument("--lora-targets", default="all-linear", choices=LORA_TARGETS)
    p.add_argument("--base-quant", default="nf4", choices=BASE_QUANTS, help="QLoRA's 4-bit format")
    if not step:
        return
    p.add_argument("--lora-dropout", action="store_true", help="LoRA dropout > 0 (keeps masks)")
    p.add_argument(
        "--no-double-quant",
        dest="double_quant",
        action="store_false",
        help="QLoRA without quantised block scales",
    )
    p.add_argument(
        "--fp8", default="none", choices=FP8_RECIPES, help="FP8 linear layers (--engine hf)"
    )
    p.add_argument(
        "--galore-rank", type=_int(1, 65536), default=128, help="--optimizer galore-adamw's rank"
    )
    _loss_chunks_flag(p)
    p.add_argument(
        "--offload-activations",
        action="store_true",
        help="every saved tensor to the host (torch save_on_cpu)",
    )


def _step_flags(p: argparse.ArgumentParser, seq_required: bool) -> None:
    """The model, layout and step flags of ``estimate`` and ``fit``."""
    p.add_argument("--model", required=True, help="preset name or path to a config.json")
    for flag, default in (("dp", 1), ("tp", 1), ("pp", 1), ("ep", 1), ("cp", 1)):
        p.add_argument(f"--{flag}", type=_int(), default=default)
    p.add_argument(
        "--vpp",
        type=_int(1, MAX_LAYERS),
        default=None,
        help="model chunks per rank v (default 1; 2 with --schedule zbv, its V of two chunks)",
    )
    p.add_argument("--sp", action="store_true", help="sequence parallelism (needs --tp >= 2)")
    p.add_argument("--zero", type=_int(0, 3), default=0, choices=(0, 1, 2, 3))
    p.add_argument(
        "--seq", type=_int(1, MAX_SEQ_LEN), required=seq_required, help="sequence length s"
    )
    p.add_argument("--micro-batch", type=_int(1, MAX_BATCH), default=1, help="micro-batch size b")
    p.add_argument(
        "--microbatches", type=_int(1, MAX_BATCH), default=1, help="micro-batches per step m"
    )
    p.add_argument("--precision", default="bf16-mixed", choices=tuple(PRECISIONS))
    p.add_argument("--optimizer", default="adamw", choices=tuple(OPTIMIZERS))
    p.add_argument("--recompute", default="none", choices=RECOMPUTE)
    p.add_argument("--schedule", default=None, choices=SCHEDULES)
    _flash_flags(p)
    drop = p.add_mutually_exclusive_group()
    drop.add_argument(
        "--dropout",
        dest="dropout",
        action="store_const",
        const=True,
        default=None,
        help="keep dropout masks (default: the model's own dropout)",
    )
    drop.add_argument("--no-dropout", dest="dropout", action="store_const", const=False)
    p.add_argument(
        "--grad-buckets",
        default=None,
        choices=("view", "copy"),
        help="DDP buckets (default: the engine's)",
    )
    p.add_argument(
        "--engine", default="paper", choices=tuple(engines()), help="engine profile (see engines)"
    )
    p.add_argument("--grad-dtype", default=None, choices=tuple(GRAD_DTYPES))
    p.add_argument("--offload", default="none", choices=OFFLOADS, help="ZeRO-Offload to the host")
    _adapter_flags(p)
    p.add_argument(
        "--gpus-per-node", type=_int(1, 1024), default=None, help="for host memory per node"
    )
    p.add_argument(
        "--context-gib", type=_real(0, 1024), default=0.0, help="CUDA context per GPU, GiB"
    )
    p.add_argument("--json", action="store_true", help="bytes as JSON")
    p.add_argument(
        "--bound", default="high", choices=BOUNDS, help="the number fits is judged on (fit)"
    )
    p.add_argument(
        "--measured-context-gib",
        type=_real(0, 1024),
        default=None,
        help="your measured CUDA context, GiB (bounds; default: data/overheads.toml)",
    )
    p.add_argument(
        "--reserve-gib",
        type=_real(0, 1024),
        default=None,
        help="your measured reserved - allocated, GiB (bounds; default: the allocator model)",
    )


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    ap = OneLineParser(prog="parmem", description="GPU memory under parallelism.")
    ap.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = ap.add_subparsers(dest="cmd", metavar="COMMAND", required=True)

    p = sub.add_parser("models", help="list model presets (--hf: the config.json families)")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--hf", action="store_true", help="list the Transformers families read from a config.json"
    )
    p.set_defaults(func=_cmd_models)

    p = sub.add_parser("engines", help="list engine profiles, one line each")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_engines)

    p = sub.add_parser("estimate", help="per-GPU training memory, stage by stage")
    _step_flags(p, seq_required=True)
    p.add_argument("--layers-per-stage", type=_ints, default=None, help="uneven split, e.g. 15,17")
    p.add_argument("--world-size", type=_int(), default=None, help="check d*t*p*cp against this")
    p.add_argument(
        "--gpu",
        default=None,
        help="also print allocated, expected reserved and the high bound on this GPU preset",
    )
    p.set_defaults(func=_cmd_estimate)

    p = sub.add_parser(
        "fit",
        help="the longest sequence, largest micro-batch, most requests or fewest GPUs that fit",
    )
    p.add_argument(
        "quantity",
        choices=("seq", "micro-batch", "requests", "gpus"),
        help="what to find (seq, micro-batch: for the layout given; requests: serving on --tp "
        "GPUs; gpus: the fewest, and the layout)",
    )
    _step_flags(p, seq_required=False)
    p.add_argument("--gpu", default="h100-sxm", help="hardware preset (see data/hardware.toml)")
    p.add_argument("--max-gpus", type=_int(1, MAX_GPUS), default=1024, help="fit gpus: stop here")
    p.add_argument("--weights", default="fp16", choices=tuple(WEIGHT_DTYPES), help="fit requests")
    p.add_argument("--kv-dtype", default="fp16", choices=tuple(KV_DTYPES), help="fit requests")
    p.add_argument(
        "--utilization", type=_real(0, 1), default=0.9, help="fit requests: memory fraction"
    )
    p.set_defaults(func=_cmd_fit)

    p = sub.add_parser("kv", help="KV-cache bytes for serving")
    p.add_argument("--model", required=True)
    p.add_argument("--seq", type=_int(0, MAX_SEQ_LEN), required=True)
    p.add_argument("--batch", type=_int(0, MAX_BATCH), default=1)
    p.add_argument("--tp", type=_int(), default=1)
    p.add_argument("--dtype", default="fp16", choices=tuple(KV_DTYPES))
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_kv)

    p = sub.add_parser("serve-memory", help="weights + KV cache per GPU for serving")
    p.add_argument("--model", required=True)
    p.add_argument("--seq", type=_int(0, MAX_SEQ_LEN), required=True)
    p.add_argument("--batch", type=_int(0, MAX_BATCH), default=1)
    p.add_argument("--tp", type=_int(), default=1)
    p.add_argument("--weights", default="fp16", choices=tuple(WEIGHT_DTYPES))
    p.add_argument("--kv-dtype", default="fp16", choices=tuple(KV_DTYPES))
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_serve)

    from .serving import DTYPES, ENGINES, QUANTIZATIONS, SERVE_KV_DTYPES

    p = sub.add_parser(
        "serve", help="startup memory and KV cache of a serving engine (vLLM, SGLang, TRT-LLM)"
    )
    p.add_argument("--model", required=True, help="preset name or path to a config.json")
    p.add_argument("--engine", choices=tuple(ENGINES), default="vllm")
    p.add_argument("--gpu", default="h100-sxm", help="hardware preset (see data/hardware.toml)")
    p.add_argument("--tp", type=_int(), default=1)
    p.add_argument("--pp", type=_int(), default=1)
    p.add_argument("--quantization", choices=tuple(QUANTIZATIONS), default="none")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    p.add_argument("--kv-cache-dtype", choices=tuple(SERVE_KV_DTYPES), default="auto")
    p.add_argument(
        "--utilization",
        type=_real(0, 1),
        default=None,
        help="vLLM gpu_memory_utilization / SGLang mem_fraction_static / TRT-LLM free fraction",
    )
    p.add_argument("--max-model-len", type=_int(1, MAX_SEQ_LEN), default=None)
    p.add_argument("--max-num-seqs", type=_int(1, MAX_BATCH), default=None)
    p.add_argument("--max-num-batched-tokens", type=_int(1, MAX_SEQ_LEN), default=None)
    p.add_argument(
        "--engine-version",
        default=None,
        help="an earlier version's profiling peak (vLLM: 0.10; default the newest, 0.19)",
    )
    p.add_argument("--batch", type=_int(1, MAX_BATCH), default=32, help="latency: requests")
    p.add_argument("--prompt", type=_int(1, MAX_SEQ_LEN), default=1024, help="latency: input")
    p.add_argument("--output", type=_int(1, MAX_SEQ_LEN), default=256, help="latency: output")
    p.add_argument(
        "--log",
        default=None,
        help="a vLLM or SGLang startup log: its numbers beside the prediction",
    )
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--emit",
        action="store_true",
        help="print the engine's launch command (exit 1 if it would not start)",
    )
    p.set_defaults(func=_cmd_startup)

    p = sub.add_parser(
        "measure",
        help="one real training step of your model, shrunk, on CPU ranks, beside the estimate",
    )
    _step_flags(p, seq_required=False)
    p.set_defaults(dp=2, engine="hf")
    p.add_argument("--seq-len", dest="seq", type=_int(1, MAX_SEQ_LEN), help="= --seq (default 32)")
    p.add_argument(
        "--layers",
        type=_int(1, MAX_LAYERS),
        default=None,
        help="the first depth run (default 2); the second adds the layer period",
    )
    p.add_argument(
        "--width-factor",
        type=_int(1, 1 << 20),
        default=None,
        help="divide the width by this (keeps head_dim and the GQA ratio)",
    )
    p.add_argument(
        "--vocab", type=_int(1, 1 << 31), default=None, help="vocabulary (default <= 1024)"
    )
    p.add_argument("--experts", type=_int(1, 1 << 20), default=None, help="experts (default <= 8)")
    p.add_argument(
        "--device",
        default="cpu",
        choices=("cpu", "cuda"),
        help="cuda: one GPU per rank (NCCL), torch.cuda.max_memory_allocated too",
    )
    p.add_argument(
        "--snapshot",
        default=None,
        help="a torch.cuda.memory._snapshot() pickle: its numbers beside the estimate",
    )
    p.add_argument(
        "--log",
        default=None,
        help="a Megatron-LM or torchtitan training log: its memory lines beside it",
    )
    p.add_argument("--gpu", default=None, help="with --snapshot/--log: expected reserved bytes")
    p.set_defaults(func=_cmd_measure)

    p = sub.add_parser("plan", help="search parallel layouts for a model on a cluster")
    p.add_argument("--model", required=True, help="preset name or path to a config.json")
    p.add_argument("--gpu", default="h100-sxm", help="hardware preset (see data/hardware.toml)")
    p.add_argument("--gpus-per-node", type=_int(), default=8)
    p.add_argument("--nodes", type=_int(), required=True)
    p.add_argument(
        "--global-batch", type=_int(1, MAX_BATCH), required=True, help="sequences per step"
    )
    p.add_argument("--seq", type=_int(1, MAX_SEQ_LEN), required=True, help="sequence length s")
    p.add_argument("--top", type=_int(1, 10**6), default=10, help="candidates to list")
    p.add_argument(
        "--sensitivity",
        action="store_true",
        help="also list, per fitted assumption, the value at which the fastest layout changes",
    )
    p.add_argument(
        "--emit",
        choices=("megatron", "deepspeed", "torchtitan"),
        default=None,
        help="print the best layout as this engine's recipe (plans with its profile)",
    )
    p.add_argument(
        "--engine",
        default=None,
        choices=tuple(engines()),
        help="engine profile to search, size and time with (default: --emit's, else paper)",
    )
    p.add_argument("--json", action="store_true", help="the whole plan as JSON")
    for flag in ("tp", "pp", "cp", "ep", "zero", "micro-batch", "vpp"):
        p.add_argument(
            f"--{flag}",
            type=_ints,
            default=None,
            help="allowed values, comma-separated (default: all valid"
            + ("; cp: 1)" if flag == "cp" else ")"),
        )
    p.add_argument("--recompute", type=_names, default=None, help="e.g. selective,full")
    p.add_argument("--no-sp", action="store_true", help="never use sequence parallelism")
    p.add_argument(
        "--tp-comm-overlap",
        action="store_true",
        help="time every TP collective as overlapped and turn the engine's switch on in --emit's "
        "recipe (Megatron-LM --tp-comm-overlap, torchtitan async TP)",
    )
    _loss_chunks_flag(p)
    p.add_argument("--uneven-pp", action="store_true", help="allow pp not dividing the layers")
    p.add_argument("--precision", default="bf16-mixed", choices=tuple(PRECISIONS))
    p.add_argument("--optimizer", default="adamw", choices=tuple(OPTIMIZERS))
    _flash_flags(p)
    p.add_argument("--no-dropout", action="store_true")
    _adapter_flags(p, step=False)
    _assumption_flags(p)
    p.set_defaults(func=_cmd_plan)
    _calibrate_parser(sub)
    return ap


#: the commands with the step flags (:func:`_step_flags`), whose ``--vpp`` defaults by schedule
_STEP_COMMANDS = (_cmd_estimate, _cmd_fit, _cmd_measure)


def main(argv: list[str] | None = None) -> int:
    """Run the ``parmem`` command with ``argv`` (default ``sys.argv[1:]``); the exit status.
    Every error is one line on stderr and status 2 (see ``parmem._check.run_guarded``)."""

    def body() -> int:
        args = build_parser().parse_args(argv)
        if getattr(args, "func", None) in _STEP_COMMANDS and args.vpp is None:
            args.vpp = 2 if args.schedule == "zbv" else 1  # ZB-V's V is two chunks per rank
        return int(args.func(args))

    return run_guarded("parmem", body)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
