"""parmem.serving by hand: weights as each quantisation method stores them, vLLM's block
arithmetic, the verdicts, and the launch commands against the engines' recorded parsers."""

from __future__ import annotations

from dataclasses import replace

import pytest

from parmem import ModelSpec
from parmem.serving import (
    QUANTIZATIONS,
    check_command,
    emit_command,
    kv_blocks,
    loaded_weight_bytes,
    rope_cache_bytes,
    sglang_mem_fraction_static,
    startup,
)

GIB = 2**30
# one layer, h = 256, 4 heads of 64 (2 kv heads), f = 512, V = 1000, untied, RMSNorm, SwiGLU
TINY = ModelSpec(
    name="tiny",
    vocab_size=1000,
    hidden=256,
    layers=1,
    heads=4,
    kv_heads=2,
    ffn_hidden=512,
    ffn_kind="swiglu",
    norm="rmsnorm",
    max_positions=64,
)
# its matrices (out, in): q 256x256, k 128x256, v 128x256, o 256x256, gate 512x256, up 512x256,
# down 256x512: 2 * 65,536 + 2 * 32,768 + 3 * 131,072 = 589,824 values in 7 matrices
LINEAR = 589_824
ROWS = 256 + 128 + 128 + 256 + 512 + 512 + 256  # output rows of the 7 matrices
OTHER = 2 * 1000 * 256 + 3 * 256  # embedding, LM head, 3 RMSNorm weights
ROPE = 64 * 64 * 2  # max_positions x head_dim, bf16


def test_rope_cache():
    assert rope_cache_bytes(TINY) == ROPE
    assert rope_cache_bytes(ModelSpec.preset("gpt2")) == 0  # learned positions


def test_unquantised_weights():
    assert loaded_weight_bytes(TINY) == 2 * (LINEAR + OTHER) + ROPE
    assert loaded_weight_bytes(TINY, dtype="fp32", rope_cache=False) == 4 * (LINEAR + OTHER)


def test_fp8_per_shard_and_per_channel():
    # one fp32 scale per matrix (per fused shard): 7 scales
    assert loaded_weight_bytes(TINY, "fp8", rope_cache=False) == LINEAR + 7 * 4 + 2 * OTHER
    assert loaded_weight_bytes(TINY, "fp8-channel", rope_cache=False) == (
        LINEAR + 4 * ROWS + 2 * OTHER
    )


def test_int4_group_layouts():
    groups = sum(
        r * -(-c // 128)
        for r, c in (
            (256, 256),
            (128, 256),
            (128, 256),
            (256, 256),
            (512, 256),
            (512, 256),
            (256, 512),
        )
    )
    # GPTQ/AWQ: 4-bit values, an fp16 scale and a packed 4-bit zero point per group
    assert loaded_weight_bytes(TINY, "gptq", rope_cache=False) == (
        LINEAR // 2 + 2 * groups + groups // 2 + 2 * OTHER
    )
    # compressed-tensors W4A16 (symmetric): no zero points
    assert loaded_weight_bytes(TINY, "w4a16", rope_cache=False) == (
        LINEAR // 2 + 2 * groups + 2 * OTHER
    )


def test_mxfp4_touches_experts_only_and_pads():
    moe = replace(TINY, name="tiny-moe", num_experts=4, top_k=2, expert_ffn_hidden=200)
    with pytest.raises(ValueError, match="mxfp4"):
        loaded_weight_bytes(TINY, "mxfp4")
    bf16 = loaded_weight_bytes(moe, rope_cache=False)
    experts = 4 * 3 * 200 * 256  # gate, up, down of 4 experts
    # Marlin pads the intermediate size to 256 (a multiple of 128) and keeps h = 256:
    # 4 experts x 3 matrices x 256 x 256 values, 4.25 bits each
    padded = 4 * 3 * 256 * 256
    assert loaded_weight_bytes(moe, "mxfp4", rope_cache=False) == (
        bf16 - 2 * experts + padded // 2 + padded // 32
    )
    # Triton pads it to 256 too (a multiple of 64 from 200)
    assert loaded_weight_bytes(moe, "mxfp4", rope_cache=False, mxfp4_backend="triton") == (
        bf16 - 2 * experts + padded // 2 + padded // 32
    )


def test_tensor_and_pipeline_parallel_weights():
    l8 = ModelSpec.preset("llama-3-8b")
    one = loaded_weight_bytes(l8)
    stages = [loaded_weight_bytes(l8, pp=2, stage=i) for i in range(2)]
    assert sum(stages) == one + rope_cache_bytes(l8)  # each stage keeps its rotary cache
    # the 65 RMSNorm weights (2 per layer and the final one) and the rotary cache on both ranks
    assert loaded_weight_bytes(l8, tp=2) * 2 - one == rope_cache_bytes(l8) + 2 * 65 * 4096


def test_vllm_blocks_by_hand():
    """vLLM 0.19 on Llama-3.1-8B: 58.11 GiB of KV cache at 131,072 bytes per token (32 layers x
    2 x 8 heads x 128 x 2 bytes): pages of 16 tokens x 4,096 bytes, ⌊⌊KV / 65,536⌋ / 32⌋
    blocks of 16 tokens: 29,751 blocks = 476,016 tokens (the count the log prints) for any KV
    between 29,751 and 29,752 x 2 MiB, which the printed 58.11 GiB (two decimals) falls in."""
    l8 = ModelSpec.preset("llama-3-8b")
    assert kv_blocks(l8, 29_751 * 2**21, 131_072, 32) == (29_751, 476_016)
    assert kv_blocks(l8, 29_752 * 2**21 - 1, 131_072, 32) == (29_751, 476_016)
    assert 29_751 * 2**21 / GIB == pytest.approx(58.11, abs=0.005)


def test_sliding_window_model_counts_two_groups():
    oss = ModelSpec.preset("gpt-oss-120b")
    per_token = 36 * 2 * 8 * 64 * 2  # every layer, t = 1
    blocks, tokens = kv_blocks(oss, 10 * GIB, per_token, 36)
    page = 16 * 2 * 8 * 64 * 2
    assert blocks == 10 * GIB // page // 18 and tokens == blocks // 2 * 16


def test_startup_budget_and_verdicts():
    l8 = ModelSpec.preset("llama-3-8b")
    r = startup(l8, "h100-sxm", utilization=0.9)
    assert r.budget == -(-round(79.19 * GIB) * 9 // 10)  # ceil(total x 0.9)
    assert r.kv == r.budget - r.weights - r.activation - r.non_torch
    assert r.starts and r.verdict.startswith("starts")
    l70 = ModelSpec.preset("llama-3-70b")
    assert not startup(l70, "h100-sxm").starts  # 131 GiB of weights on one 80 GB card
    long = startup(l8, "a100-40gb", max_model_len=2**20)
    assert not long.starts and f"--max-model-len {long.longest}" in long.verdict
    assert startup(l8, "a100-40gb", max_model_len=long.longest).starts


def test_sglang_and_trtllm_budgets():
    l8 = ModelSpec.preset("llama-3-8b")
    # SGLang 0.5's default on an H100 (81,559 MiB) at t = 1: reserved = 512 + 1.5 x 8,192 +
    # 2 x 256 + 1/8 x 1,024 + 58 piecewise graphs x 8 = 13,904 MiB, so (81,559 - 13,904) / 81,559
    assert sglang_mem_fraction_static(81559) == 0.83
    # an L4 (23,034 MiB) at t = 4: 512 + 1.5 x 2,048 + 2 x 80 + 512 + 42 x 8 = 4,592 MiB
    assert sglang_mem_fraction_static(23034, tp=4) == round((23034 - 4592) / 23034, 3)
    # an H200 at t = 8: 512 + 12,288 + 2 x 512 + 1,024 + 464 = 15,312 MiB (above the 10 GiB floor)
    assert sglang_mem_fraction_static(143771, tp=8) == round((143771 - 15312) / 143771, 3)
    # MLA keeps 1.5 GiB for its piecewise graphs instead: 512 + 12,288 + 512 + 128 + 1,536
    assert sglang_mem_fraction_static(81559, mla=True) == round((81559 - 14976) / 81559, 3)
    default = startup(l8, engine="sglang", free_bytes=70 * GIB)
    assert default.kv == startup(l8, engine="sglang", utilization=0.83, free_bytes=70 * GIB).kv
    free = 70 * GIB
    s = startup(l8, engine="sglang", utilization=0.85, free_bytes=free)
    assert s.kv == free - s.weights - int(free * 0.15)
    assert s.tokens == s.kv // (32 * 2 * 8 * 128 * 2)
    t = startup(l8, engine="trtllm")
    assert t.kv == int((t.total - t.weights - t.activation - t.non_torch) * 0.9)


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_emitted_commands_pass_the_recorded_parsers(engine):
    kw = {} if engine == "trtllm" else {"quantization": "awq", "kv_cache_dtype": "fp8"}
    cmd = emit_command(
        engine,
        "meta-llama/Llama-3.1-8B-Instruct",
        tp=4,
        pp=2,
        max_model_len=32768,
        utilization=0.9,
        max_num_seqs=256,
        max_num_batched_tokens=8192,
        **kw,
    )
    check_command(engine, cmd)
    assert "4" in cmd.split() and "32768" in cmd.split()


def test_check_command_catches_bad_flags():
    with pytest.raises(ValueError, match="not a flag"):
        check_command("vllm", "vllm serve m --tensor-parallel 2")
    with pytest.raises(ValueError, match="not one of"):
        check_command("vllm", "vllm serve m --kv-cache-dtype fp9")
    with pytest.raises(ValueError, match="trtllm"):
        emit_command("trtllm", "m", quantization="fp8")


def test_bad_input_names_the_field():
    l8 = ModelSpec.preset("llama-3-8b")
    for kw, field in (
        ({"quantization": "int3"}, "quantization"),
        ({"tp": 0}, "tp"),
        ({"utilization": 1.5}, "utilization"),
        ({"engine": "tgi"}, "engine"),
        ({"kv_cache_dtype": "fp4"}, "kv_cache_dtype"),
    ):
        with pytest.raises(ValueError, match=field):
            startup(l8, **kw)
    assert set(QUANTIZATIONS) >= {"fp8", "awq", "gptq", "mxfp4", "nvfp4"}


def test_emit_keeps_every_setting_and_refuses_what_the_parser_would():
    cmd = emit_command("vllm", "m", max_num_seqs=1, max_num_batched_tokens=1, dtype="fp16")
    words = cmd.split()
    assert words[words.index("--max-num-seqs") + 1] == "1"
    assert words[words.index("--max-num-batched-tokens") + 1] == "1"
    assert words[words.index("--dtype") + 1] == "float16"
    check_command("vllm", cmd)
    l8 = ModelSpec.preset("llama-3-8b")
    for engine, kv in (("vllm", "fp32"), ("sglang", "fp16"), ("trtllm", "fp8")):
        with pytest.raises(ValueError, match="kv_cache_dtype"):
            emit_command(engine, "m", kv_cache_dtype=kv)
        with pytest.raises(ValueError, match="kv_cache_dtype"):
            startup(l8, engine=engine, utilization=0.9, kv_cache_dtype=kv)


def test_mla_blocks_of_64_and_the_cli_table(capsys):
    """vLLM's MLA backend on Hopper takes 64-token blocks: DeepSeek-V3's tokens are a multiple
    of 64, and the latent (512 + 64 values, bf16) is one page per layer per token."""
    from parmem.cli import main

    ds = ModelSpec.preset("deepseek-v3")
    r = startup(ds, "h200", tp=8, quantization="fp8-block", max_model_len=32768)
    assert r.kv_token_bytes == 61 * (512 + 64) * 2 and r.tokens % 64 == 0 and r.starts
    assert main(["serve", "--model", "deepseek-v3", "--gpu", "h200", "--tp", "8",
                 "--quantization", "fp8-block", "--max-model-len", "32768"]) == 0
    out = capsys.readouterr().out
    assert f"{r.tokens:,}" in out and "TPOT" in out and out.count("\n") == 8
