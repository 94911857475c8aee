"""Serving memory: KV cache from the config, quantised weights."""

import pytest

from parmem import ModelSpec, kv_cache_bytes, kv_cache_bytes_per_token, weight_bytes
from parmem.sharding import linear_shapes


def test_llama2_7b_kv_is_512_kib_per_token():
    # 2 (K and V) * 32 layers * 32 heads * 128 dims * 2 bytes = 524,288 bytes (TOPICS row 20).
    assert kv_cache_bytes_per_token(ModelSpec.preset("llama-2-7b")) == 512 * 1024


def test_gqa_and_tp():
    spec = ModelSpec.preset("llama-3-70b")  # 80 layers, 8 kv heads of 128 (GQA)
    assert kv_cache_bytes_per_token(spec) == 2 * 80 * 8 * 128 * 2
    assert kv_cache_bytes_per_token(spec, tp=8) == 2 * 80 * 1 * 128 * 2
    # t = 16 > 8 kv heads: each GPU still keeps one whole head (duplicated across pairs)
    assert kv_cache_bytes_per_token(spec, tp=16) == 2 * 80 * 1 * 128 * 2
    assert kv_cache_bytes(spec, 8192, 16, tp=8) == 16 * 8192 * 2 * 80 * 128 * 2
    assert kv_cache_bytes_per_token(spec, "fp8") * 2 == kv_cache_bytes_per_token(spec)


def test_mqa():
    spec = ModelSpec(name="mqa", vocab_size=1000, hidden=1024, layers=4, heads=16, kv_heads=1)
    assert kv_cache_bytes_per_token(spec) == 2 * 4 * 1 * 64 * 2


def test_fp16_weights_are_two_bytes_per_param():
    spec = ModelSpec.preset("llama-2-7b")
    assert weight_bytes(spec, "fp16") == 2 * 6_738_415_616
    assert weight_bytes(spec, "fp32") == 4 * 6_738_415_616


def test_int4_group_quantisation_by_hand():
    # Llama-2-7B, int4 with group size 128 and fp16 scale + zero point per group (GPTQ/AWQ):
    # each layer matrix costs n_in*n_out/2 bytes plus 4 bytes per 128 inputs of each row.
    spec = ModelSpec.preset("llama-2-7b")
    h, f, L = 4096, 11008, 32
    mats = [(h, h)] * 4 + [(h, f), (h, f), (f, h)]
    quant = sum(i * o for i, o in mats) * L
    expected = (L * sum(i * o // 2 + o * (i // 128) * 4 for i, o in mats)
                + 2 * (6_738_415_616 - quant))
    assert weight_bytes(spec, "int4") == expected
    # int8 per-channel (one fp16 scale per row), no zero point
    expected8 = L * sum(i * o + o * 2 for i, o in mats) + 2 * (6_738_415_616 - quant)
    assert weight_bytes(spec, "int8", group_size=None) == expected8


def test_linear_shapes_cover_the_layer_params():
    for name in ("llama-2-7b", "mixtral-8x7b", "llama-3-70b"):
        spec = ModelSpec.preset(name)
        c = spec.param_counts()
        in_layers = sum(i * o * n for _, i, o, n in linear_shapes(spec))
        assert in_layers == c["attention"] + c.get("mlp", 0) + c.get("experts", 0)


@pytest.mark.parametrize("call,msg", [
    (lambda s: kv_cache_bytes_per_token(s, "fp12"), "dtype='fp12'"),
    (lambda s: kv_cache_bytes_per_token(s, tp=3), "tp=3 must divide heads=32"),
    (lambda s: kv_cache_bytes(s, -1), "seq_len=-1"),
    (lambda s: weight_bytes(s, "int3"), "dtype='int3'"),
    (lambda s: weight_bytes(s, "int4", group_size=0), "group_size=0"),
])
def test_invalid(call, msg):
    with pytest.raises(ValueError, match=msg):
        call(ModelSpec.preset("llama-2-7b"))
