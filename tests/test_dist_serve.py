"""parmem.distributed.serve: the decoder's KV cache in one process and on tensor-parallel gloo ranks
equals the formula (KV bytes per token: 2 · L · kv_heads · head_dim · bytes).
World size: $PARMEM_WORLD_SIZE, default 2.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from helpers import WORLD_SIZE as N  # noqa: E402

from parmem import ModelSpec  # noqa: E402


def test_single_process_decoder_cache_grows_one_token_per_step():
    torch = pytest.importorskip("torch")
    from parmem.distributed.serve import Decoder, generate, generate_without_cache
    from parmem.reference import tiny_spec

    spec = tiny_spec("llama", vocab=64, hidden=32, layers=3, heads=4, kv_heads=2, ffn_hidden=64,
                     seq=64)
    model = Decoder(spec)
    prompt = torch.randint(0, 64, (3, 5), generator=torch.Generator().manual_seed(0))
    ids, cache, sizes, _ = generate(model, prompt, 6)
    ref, _ = generate_without_cache(model, prompt, 6)
    assert torch.equal(ids, ref)
    # 2 (K, V) * L=3 * kv_heads=2 * head_dim=8 * 4 bytes (fp32) * b=3 per token
    assert sizes == [(n, 2 * 3 * 2 * 8 * 4 * 3 * n) for n in range(5, 11)]
    _, cache16, sizes16, _ = generate(model, prompt, 6, cache_dtype=torch.bfloat16)
    assert sizes16[-1][1] * 2 == sizes[-1][1]


def test_decoder_rejects_shapes_it_cannot_shard():
    pytest.importorskip("torch")
    from parmem.distributed.serve import Decoder
    from parmem.reference import tiny_spec

    with pytest.raises(ValueError, match="tp=3"):
        Decoder(tiny_spec("llama", heads=8, kv_heads=2), tp_size=3)
    with pytest.raises(ValueError, match="Llama-shaped"):
        Decoder(ModelSpec.preset("gpt2"))


@pytest.mark.dist
@pytest.mark.parametrize("kv_heads", [8, 2, 1])
def test_tp_kv_cache_bytes_equal_the_formula(pool, kv_heads):
    res = pool.run("parmem.distributed.serve:demo", heads=8, kv_heads=kv_heads)
    kv_local = max(kv_heads // N, 1)            # one head, duplicated, once t > kv_heads
    for r in res:
        assert r["kv_heads_local"] == kv_local
        assert r["same_tokens"] and r["max_logit_err"] < 1e-4
        assert r["weight_bytes"] == r["weight_bytes_estimate"]
        for tokens, measured in r["kv_bytes"]:
            # 2 * L=2 * kv_local * head_dim=8 * 4 bytes * b=2 per token
            assert measured == 2 * 2 * kv_local * 8 * 4 * 2 * tokens
        assert [b for _, b in r["kv_bytes"]] == r["kv_bytes_estimate"]
