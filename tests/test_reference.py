"""parmem.reference: the reference models (TinyGPT, tiny_spec) and the count of the normalisation
statistics Korthikanti et al. 2022 leave out."""

import pytest

torch = pytest.importorskip("torch")

from helpers import layernorm_stats  # noqa: E402

from parmem import ModelSpec  # noqa: E402
from parmem.reference import (  # noqa: E402
    TinyGPT,
    norm_stat_bytes,
    norm_stat_itemsize,
    tiny_spec,
)


def test_norm_stat_bytes_counts_each_statistic_per_norm_and_token():
    s, b = 64, 2
    assert norm_stat_bytes(s * b, 2) == layernorm_stats(s, b)  # bf16 on CPU: 2 bytes each
    assert norm_stat_bytes(s * b, 2, dtype=torch.float32) == 2 * layernorm_stats(s, b)
    assert norm_stat_bytes(s * b, 2, device="cuda") == 2 * layernorm_stats(s, b)  # fp32 there
    assert norm_stat_bytes(s * b, 3, norm="rmsnorm") == 3 * s * b * 2  # rstd only
    # the per-token size of one statistic, as parmem.activations.layer_terms takes it
    assert norm_stat_itemsize() == 2 and norm_stat_itemsize("cuda", torch.bfloat16) == 4
    with pytest.raises(ValueError, match="norm='batchnorm' must be one of"):
        norm_stat_bytes(s * b, 2, norm="batchnorm")
    with pytest.raises(ValueError, match="tokens=-1 must be an integer >= 0"):
        norm_stat_bytes(-1)


def test_tiny_spec_shapes():
    gpt = tiny_spec(vocab=64, hidden=32, layers=3, heads=4, seq=16, tied=True)
    assert (gpt.name, gpt.ffn_kind, gpt.norm, gpt.bias, gpt.position, gpt.tied_embeddings,
            gpt.max_positions, gpt.ffn_hidden) == ("tiny-gpt", "gelu", "layernorm", True,
                                                   "learned", True, 16, 128)
    assert tiny_spec(position="rotary").position == "rotary"
    llama = tiny_spec("llama", heads=8, kv_heads=2, ffn_hidden=128)
    assert (llama.name, llama.ffn_kind, llama.norm, llama.bias, llama.position,
            llama.kv_heads) == ("tiny-llama", "swiglu", "rmsnorm", False, "rotary", 2)
    with pytest.raises(ValueError, match="shape='bert' must be one of"):
        tiny_spec("bert")


def test_tiny_gpt_without_positions_logits_and_loss():
    spec = tiny_spec(vocab=40, hidden=16, layers=2, heads=2, seq=8, position="rotary")
    torch.manual_seed(0)
    model = TinyGPT(spec, dtype=torch.float32, dropout_p=0.0)
    assert model.pos is None and model.head is not None
    assert sum(p.numel() for p in model.parameters()) == spec.num_params()
    ids = torch.randint(0, 40, (8, 3))
    labels = torch.randint(0, 40, (8, 3))
    logits = model(ids)
    assert logits.shape == (8, 3, 40) and logits.dtype == torch.float32
    loss = torch.nn.functional.cross_entropy(logits.view(-1, 40), labels.view(-1))
    assert model(ids, labels).item() == loss.item()
    with pytest.raises(ValueError, match="GPT-shaped"):
        TinyGPT(tiny_spec("llama"))


def test_tiny_gpt_has_the_spec_parameter_count():
    torch = pytest.importorskip("torch")
    from parmem.reference import TinyGPT

    for tied in (False, True):
        spec = ModelSpec(name="t", vocab_size=300, hidden=32, layers=3, heads=4, ffn_kind="gelu",
                         bias=True, norm="layernorm", position="learned", max_positions=16,
                         tied_embeddings=tied)
        model = TinyGPT(spec)
        assert sum(p.numel() for p in model.parameters()) == spec.num_params()
        assert all(p.dtype == torch.bfloat16 for p in model.parameters())
