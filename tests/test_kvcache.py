"""parmem.kvcache: the KV cache of GQA, multi-head latent attention (DeepSeek-V2 §2.1.2: (d_c +
d_h^R) per token and layer, not split by TP) and sliding-window layers (min(seq, window) tokens),
derived here independently; serving and the serve-memory command on the new presets."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from arch_configs import T  # noqa: E402

from parmem import ModelSpec  # noqa: E402
from parmem.cli import main  # noqa: E402
from parmem.inference import (  # noqa: E402
    kv_cache_bytes,
    kv_cache_bytes_per_token,
    max_concurrency,
    serving_layout,
)
from parmem.sharding import stage_params  # noqa: E402


# ------------------------------------------------------------------------------ KV cache
def test_mla_kv_cache_is_the_latent():
    """DeepSeek-V2 §2.1.2: MLA caches c_kv (d_c = kv_lora_rank) and k_rope (d_h^R) per token and
    layer. DeepSeek-V3 in bf16: (512 + 64) x 2 bytes x 61 layers = 70,272 bytes; the latent is
    shared by the heads, so TP does not divide it."""
    spec = ModelSpec.preset("deepseek-v3")
    assert kv_cache_bytes_per_token(spec, "bf16") == (512 + 64) * 2 * 61 == 70_272
    assert kv_cache_bytes_per_token(spec, "bf16", tp=8) == 70_272
    assert kv_cache_bytes(spec, 4096, dtype="bf16") == 4096 * 70_272
    assert kv_cache_bytes(spec, 131072, dtype="bf16") == 131072 * 70_272
    # from the config too (Transformers' default DeepseekV3Config is V3's shape)
    from_cfg = ModelSpec.from_hf_config(T.DeepseekV3Config().to_dict())
    assert kv_cache_bytes_per_token(from_cfg, "bf16") == 70_272


def test_sliding_window_kv_is_bounded_by_the_window():
    """Gemma-3-27B: 62 layers, every 6th global (10), 52 local with a 1024-token window;
    16 kv heads of 128 in bf16 = 8192 bytes per token and layer."""
    spec = ModelSpec.preset("gemma-3-27b")
    per_layer = 2 * 16 * 128 * 2
    assert spec.num_local_layers == 52
    for seq in (4096, 131072):
        want = per_layer * (10 * seq + 52 * min(seq, 1024))
        assert kv_cache_bytes(spec, seq, dtype="bf16") == want
    assert kv_cache_bytes(spec, 512, dtype="bf16") == per_layer * 62 * 512
    gpt_oss = ModelSpec.preset("gpt-oss-120b")  # 18 full, 18 with a 128-token window
    assert kv_cache_bytes(gpt_oss, 8192, dtype="bf16") == 2 * 8 * 64 * 2 * (18 * 8192 + 18 * 128)


def test_serving_accepts_the_new_presets():
    for name in ("deepseek-v3", "gpt-oss-120b", "llama-4-scout"):
        spec = ModelSpec.preset(name)
        out = serving_layout(spec, "h100-sxm", tp=8, ep=1)
        assert out["kv_tokens"] > 0 or out["weights"] > 80 * 2**30
    gemma = ModelSpec.preset("gemma-3-27b")
    n = max_concurrency(gemma, 131072, "h100-sxm", tp=2)
    assert n == (int(80 * 2**30) - sum(stage_params(gemma, 2)) * 2) // kv_cache_bytes(
        gemma, 131072, tp=2)


def test_kv_cache_by_layer_kind_and_its_explorer():
    from parmem.kvcache import kv_cache_by_layer_kind

    gemma = ModelSpec.preset("gemma-3-27b")
    split = kv_cache_by_layer_kind(gemma, 131072, 2, "bf16")
    assert split == {"full-attention layers": 2 * 8192 * 10 * 131072,
                     "sliding-window layers": 2 * 8192 * 52 * 1024}
    ds = kv_cache_by_layer_kind(ModelSpec.preset("deepseek-v3"), 4096, 1, "bf16")
    assert ds == {"full-attention layers": 4096 * 70_272, "sliding-window layers": 0}
    pytest.importorskip("ipywidgets")
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    from parmem.book.widgets import explore_kv_cache

    assert explore_kv_cache(static=False).children


def test_cli_serve_memory_sliding_window(capsys):
    assert main(["serve-memory", "--model", "gemma-3-27b", "--seq", "131072", "--tp", "2",
                 "--kv-dtype", "bf16", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    spec = ModelSpec.preset("gemma-3-27b")
    assert got["kv_cache_bytes_per_gpu"] == 8 * 2 * 128 * 2 * (10 * 131072 + 52 * 1024)
    assert got["kv_cache_bytes_per_gpu"] == kv_cache_bytes(spec, 131072, dtype="bf16", tp=2)
