"""Speed of the estimator: median time of estimate() and num_params().

Goal (issue #2): estimate() <= 50 us, with every engine profile (issue #14: for a 4-stage
layout). One column per profile of :mod:`parmem.engines`: the row's layout and setup with
``engine=NAME``; where the profile cannot express it, the nearest layout it can (its largest
ZeRO stage not above the row's, no pipeline for ``hf``, full instead of selective recompute),
marked ``*``. If ``transformers`` and ``torch`` are installed, also times building the same model
on the meta device and counting its parameters, and prints the ratio (the meta-device count is
the slow, independent way to get the same number).
"""

from __future__ import annotations

import statistics
import time

from parmem import ModelSpec, ParallelConfig, TrainingSetup, estimate
from parmem.engine_analyses import engine_layout
from parmem.engines import engines


def median_us(fn, repeat: int = 7, number: int = 500) -> float:
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        runs.append((time.perf_counter() - t0) / number * 1e6)
    return statistics.median(runs)


def meta_count(name: str):
    try:
        import torch
        import transformers
    except ImportError:
        return None
    cfgs = {"llama-2-7b": transformers.LlamaConfig(vocab_size=32000, hidden_size=4096,
                                                   intermediate_size=11008,
                                                   num_hidden_layers=32,
                                                   num_attention_heads=32)}
    if name not in cfgs:
        return None
    t0 = time.perf_counter()
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfgs[name])
    n = sum(p.numel() for p in model.parameters())
    return n, (time.perf_counter() - t0) * 1e6


def main() -> None:
    rows = []
    names = list(engines())
    for name, par, setup in [
        ("llama-2-7b", ParallelConfig(dp=8, tp=4, pp=2, zero=1),
         TrainingSetup(seq_len=4096, num_microbatches=8)),
        ("llama-3-70b", ParallelConfig(dp=16, tp=8, pp=8, sp=True, zero=1),
         TrainingSetup(seq_len=8192, num_microbatches=32, recompute="selective")),
        ("mixtral-8x7b", ParallelConfig(dp=8, tp=2, pp=4, ep=8, sp=True, zero=1),
         TrainingSetup(seq_len=4096, num_microbatches=16, flash_attention=True)),
        ("megatron-1t", ParallelConfig(dp=6, tp=8, pp=64, sp=True, vpp=2, zero=1),
         TrainingSetup(seq_len=2048, num_microbatches=128, schedule="interleaved")),
    ]:
        spec = ModelSpec.preset(name)
        cols = []
        for eng in names:
            p, st = engine_layout(eng, par, setup)
            changed = (p, st.recompute) != (par, setup.recompute)
            us = median_us(lambda spec=spec, p=p, st=st: estimate(spec, p, st))
            cols.append(f"{us:.1f}{'*' if changed else ''}")
        np_us = median_us(lambda spec=spec: spec.num_params())
        meta = meta_count(name)
        ratio = f"{meta[1] / np_us:,.0f}x" if meta else "transformers not installed"
        rows.append((name, f"{par.world_size}", f"{par.pp}", *cols, f"{np_us:.2f}", ratio))
    heads = ("model", "GPUs", "p", *(f"{n} us" for n in names), "num_params() us",
             "meta-device build / num_params")
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(heads)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    print("parmem estimator speed: estimate() per engine profile (median of 7 x 500 calls; "
          "goal: <= 50 us for a 4-stage layout)")
    print(fmt.format(*heads))
    for r in rows:
        print(fmt.format(*r))
    print("* the nearest layout the profile can express (ZeRO stage, no pipeline for hf, "
          "recompute)")


if __name__ == "__main__":
    main()
