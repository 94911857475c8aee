"""The measured check: bytes autograd saves for the reference GPT layer equal Korthikanti et al.
2022 Table 2, and the only difference - the LayerNorm statistics the paper leaves out - is named
and asserted exactly."""

import pytest

torch = pytest.importorskip("torch")

from helpers import layernorm_stats  # noqa: E402

from parmem import ModelSpec, ParallelConfig, TrainingSetup  # noqa: E402
from parmem.activations import layer_terms, per_layer_bytes  # noqa: E402
from parmem.measure import SavedTensorsMeter, state_bytes, tensor_storage_bytes  # noqa: E402
from parmem.reference import GPTLayer  # noqa: E402


def measure_layer(s, b, h, a, tp=1, rank=0, dropout_p=0.1):
    torch.manual_seed(0)
    layer = GPTLayer(h, a, tp_size=tp, tp_rank=rank, dropout_p=dropout_p, max_seq_len=s).train()
    x = torch.randn(s, b, h, dtype=torch.bfloat16, requires_grad=True)
    with SavedTensorsMeter(exclude=layer.parameters()) as meter:
        y = layer(x)
    y.float().sum().backward()  # the saved tensors really are enough for backward
    return meter


@pytest.mark.parametrize("s,b,h,a,tp", [(64, 2, 128, 4, 1), (32, 3, 96, 6, 1),
                                        (64, 2, 128, 4, 2), (48, 1, 128, 8, 4)])
def test_saved_bytes_equal_table2_plus_named_norm_statistics(s, b, h, a, tp):
    meter = measure_layer(s, b, h, a, tp=tp)
    paper = per_layer_bytes(s, b, h, a, tp=tp)
    assert meter.bytes == paper + layernorm_stats(s, b)
    # the 1-byte masks: two s*b*h dropout masks and one a/t*s*s*b attention-dropout mask
    assert meter.by_dtype["torch.bool"] == 2 * s * b * h + a // tp * s * s * b


def test_layer_terms_with_norm_statistics_match_the_measurement_exactly():
    s, b, h, a = 64, 2, 128, 4
    spec = ModelSpec(name="ref", vocab_size=100, hidden=h, layers=1, heads=a, ffn_kind="gelu",
                     bias=True, norm="layernorm", position="learned", max_positions=s)
    terms = layer_terms(spec, s, b, norm_stat_bytes=2)
    assert measure_layer(s, b, h, a).bytes == sum(t.bytes for t in terms)


def test_no_dropout_removes_the_masks():
    s, b, h, a = 32, 2, 64, 4
    meter = measure_layer(s, b, h, a, dropout_p=0.0)
    # without dropout: no masks, and the softmax output is saved once (it is also the input of
    # the attention-times-V matmul), so 5as^2b becomes 2as^2b and 34sbh becomes 34 - 2 = 32 sbh.
    assert meter.bytes == 32 * s * b * h + 2 * a * s * s * b + layernorm_stats(s, b)


def test_storages_are_counted_once():
    x = torch.zeros(10, 10, dtype=torch.float32)
    assert tensor_storage_bytes([x, x[0], x.t(), x.view(100)]) == 400


def test_state_bytes_adam():
    model = torch.nn.Linear(10, 10)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 10)).sum().backward()
    opt.step()
    sb = state_bytes(model, opt)
    n = 110
    assert sb.params == 4 * n and sb.grads == 4 * n
    # exp_avg and exp_avg_sq in fp32 (8 bytes/param) plus one 0-d fp32 "step" per parameter
    # tensor (PyTorch keeps step as a tensor)
    assert sb.optimizer == 8 * n + 2 * 4


@pytest.mark.parametrize(("tokens", "vocab", "hidden"), [(256, 4096, 32), (96, 1000, 8)])
def test_loss_peak_is_three_fp32_logits(tokens, vocab, hidden):
    """Counted by hand from the ops (per logit, bytes alive together): the forward casts the bf16
    logits (2, freed once cast) to fp32 (4) and log_softmax writes its fp32 output (4, saved for
    the backward; the fp32 input is then freed, log_softmax's backward needs only its output).
    The backward makes nll_loss's gradient (4) and log_softmax's input gradient (4) while the
    saved output still lives: 4 + 4 + 4 = 12 bytes per logit, three times the 4·T·V fp32 logits
    an estimate keeps, plus the fp32 loss and its gradient (4 + 4 bytes)."""
    from parmem.measure import loss_peak_bytes

    assert loss_peak_bytes(tokens, vocab, hidden) == 12 * tokens * vocab + 8


@pytest.mark.parametrize(("engine", "tp"), [("hf", False), ("deepspeed", False),
                                          ("fsdp2", False), ("megatron-core", False),
                                          ("fsdp2", True), ("megatron-core", True)])  # fmt: skip
def test_each_engine_profile_holds_its_own_losss_measured_peak(engine, tp):
    """Each profile's ``loss_peak`` (bytes per logit at the loss's peak, data/engines.toml) is
    the peak of the engine's own loss code, measured: Transformers' ForCausalLMLoss (hf, and
    DeepSpeed, which trains the Transformers model), torchtitan's cross_entropy_loss (fsdp2),
    Megatron-Core's vocab_parallel_cross_entropy (on one gloo rank: it all-reduces over the
    tensor-parallel group); ``loss_peak_tp`` the loss each runs under tensor parallelism,
    measured on one rank's group (torchtitan's _LossParallelCrossEntropy; Megatron-Core's is
    the same code at any t). What a loss keeps per token (targets, the per-token loss, the
    softmax's sums) is under 64 bytes a token; the rest is per logit. The unfused ones equal
    the plain F.cross_entropy counted by hand above."""
    from parmem.engine_losses import engine_loss_peak_bytes
    from parmem.engines import engine as profile

    tokens, vocab = 256, 4096
    if engine == "megatron-core" or tp:
        from parmem.distributed import Pool

        with Pool(world_size=1) as pool:
            (peak,) = pool.run("parmem.engine_losses:engine_loss_peak_bytes", engine=engine,
                               tokens=tokens, vocab=vocab, tp=tp, timeout=120)  # fmt: skip
    else:
        peak = engine_loss_peak_bytes(engine, tokens, vocab)
        assert peak == 12 * tokens * vocab + 8
    per_logit = profile(engine).loss_peak_at(2 if tp else 1)
    assert 0 <= peak - per_logit * tokens * vocab < 64 * tokens


@pytest.fixture(scope="module")
def one_rank():
    from parmem.distributed import Pool

    with Pool(world_size=1) as pool:
        yield pool


@pytest.mark.parametrize(("batch", "seq", "hidden", "vocab", "chunks"), [
    (1, 256, 64, 4096, 1), (1, 256, 64, 4096, 8), (2, 256, 64, 4096, 8), (1, 256, 128, 4096, 8),
    (3, 128, 32, 1024, 2), (1, 256, 256, 2048, 8), (1, 256, 512, 2048, 8), (2, 256, 256, 2048, 8),
])  # fmt: skip
def test_torchtitans_chunked_loss_is_what_the_estimate_counts(one_rank, batch, seq, hidden, vocab,
                                                               chunks):
    """torchtitan 0.3.0's ChunkedLossWrapper on an LM head under FSDP2 with torchtitan's mixed
    precision, run on one gloo rank: its peak above what existed before it ran is
    parmem.estimate.loss_pieces of a layout with those shapes (a model torchtitan builds itself,
    so the fsdp2 profile chunks its loss), up to the labels' chunk copies and a few scalars
    (under 16 bytes a token); what it leaves for the decoder's backward is kept_logits (the
    hidden states' bf16 gradient) and 6 bytes per head weight, which do not grow with the
    tokens: the head's fp32 gradient (its share of the estimate's gradients) and FSDP2's
    all-gather output of its bf16 weight, which FSDP2 frees by resizing its storage to 0 (0
    bytes once the wrapper returns, checked on 1 and 2 ranks), a free record_allocations does
    not see. The shapes cover both moments of a chunk: the cross-entropy's (small h against
    the chunk's tokens) and the head's new gradient (large h)."""
    from dataclasses import replace

    from parmem.estimate import kept_logits, loss_pieces
    from parmem.layout import layout

    pytest.importorskip("torchtitan")
    (got,) = one_rank.run("parmem.distributed.runs_fsdp2:chunked_loss_peak_bytes", seq=seq,
                          vocab=vocab, hidden=hidden, chunks=chunks, batch=batch,
                          timeout=120)  # fmt: skip
    spec = replace(ModelSpec.preset("llama-3-8b"), vocab_size=vocab, hidden=hidden, heads=4,
                   kv_heads=4, head_dim=0, ffn_hidden=2 * hidden, layers=2)  # fmt: skip
    lay = layout(spec, ParallelConfig(), TrainingSetup(seq_len=seq, micro_batch=batch,
                                                       engine="fsdp2", loss_chunks=chunks))
    T = batch * seq
    assert 0 <= got["peak"] - sum(loss_pieces(lay)) < 16 * T
    assert 0 <= got["kept"] - kept_logits(lay) - 6 * vocab * hidden < 16


def test_engine_loss_refuses_what_it_does_not_run():
    from parmem.engine_losses import engine_loss

    with pytest.raises(ValueError, match="engine"):
        engine_loss("paper")
    with pytest.raises(ValueError, match="process group"):
        engine_loss("megatron-core")  # no process group in this process
    with pytest.raises(ValueError, match="process group"):
        engine_loss("fsdp2", tp=True)
    with pytest.raises(ValueError, match="tensor-parallel loss"):
        engine_loss("hf", tp=True)


def test_loss_peak_refuses_bad_sizes():
    from parmem.measure import loss_peak_bytes

    with pytest.raises(ValueError, match="vocab"):
        loss_peak_bytes(8, 1)
