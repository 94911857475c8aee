"""Helpers shared by several test files, each in one home here (``from helpers import ...``;
``tests/`` is on ``sys.path`` beside its ``conftest.py``): the rank count of the distributed tests,
the models and the paper formulas that more than one module's tests build their expected values
from."""

from __future__ import annotations

import os
import time

from hypothesis import HealthCheck, settings

from parmem import ModelSpec
from parmem.papers import korthikanti_table2

#: the fuzz suites' scale: PARMEM_FUZZ_SCALE=20 runs 20 times as many examples, random (not
#: derandomized): a deeper search for a local run; CI runs the same examples every time
FUZZ_SCALE = int(os.environ.get("PARMEM_FUZZ_SCALE", "0"))
#: the fuzz suites' Hypothesis settings (no deadline, no example database)
FUZZ = settings(
    deadline=None,
    derandomize=not FUZZ_SCALE,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                           HealthCheck.data_too_large],
)
#: ranks for the distributed tests: $PARMEM_WORLD_SIZE (2 in CI and ``make test``)
WORLD_SIZE = int(os.environ.get("PARMEM_WORLD_SIZE", "2"))
FP32 = 4
LLAMA7 = ModelSpec.preset("llama-2-7b")     # h 4096, a = kv 32, L 32, f 11008, V 32000, untied
MIXTRAL = ModelSpec.preset("mixtral-8x7b")


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for positive integers (a shard padded up, as flat ZeRO buffers are)."""
    return -(-a // b)


def gpt_spec(layers: int, vocab: int = 4096, hidden: int = 64, heads: int = 4,
             tied: bool = False) -> ModelSpec:
    """A small GPT-shaped model (GeLU MLP, biases, LayerNorm, learned positions) whose every
    pipeline split can be tried by brute force."""
    return ModelSpec(name="t", vocab_size=vocab, hidden=hidden, layers=layers, heads=heads,
                     ffn_kind="gelu", bias=True, norm="layernorm", position="learned",
                     max_positions=256, tied_embeddings=tied)


def gpt(name: str, heads: int, hidden: int, layers: int, vocab: int = 51200) -> ModelSpec:
    """A GPT model as in Narayanan et al. 2021 §5.1 (V = 51,200, s = 2048)."""
    return ModelSpec(name=name, vocab_size=vocab, hidden=hidden, layers=layers, heads=heads,
                     ffn_kind="gelu", bias=True, norm="layernorm", tied_embeddings=True,
                     position="learned", max_positions=2048)


def table2(s, b, h, a, t, sp, recompute):
    """Korthikanti et al. 2022 Table 2 as printed (exact rationals, data/papers.toml). Its row
    for full recomputation keeps the layer's input, 2sbh; with sequence parallelism that input is
    the s/t slice, 2sbh/t."""
    if recompute == "full":
        full = korthikanti_table2("full", s, b, h, a, t)
        return full / t if sp else full
    case = "tp" + ("+sp" if sp else "") + ("+selective" if recompute == "selective" else "")
    return korthikanti_table2(case, s, b, h, a, t)


def layernorm_stats(s, b):
    """Two LayerNorms each save mean and rstd per token. On CPU with bf16 input they are bf16
    (2 bytes each); on CUDA they are fp32. Korthikanti et al. 2022 do not count them."""
    return 2 * 2 * 2 * s * b


def process_gone(pid: int) -> bool:
    """The process has exited (a zombie that nobody reaped counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True
    except OSError:  # no /proc (macOS): ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False


def wait_gone(pids, seconds: float) -> list[int]:
    """Poll until every pid is gone or ``seconds`` pass; the ones still running."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if all(process_gone(p) for p in pids):
            return []
        time.sleep(0.02)
    return [p for p in pids if not process_gone(p)]
