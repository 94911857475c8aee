"""parmem.traces: the allocation events of a training step, and the recorder of a real run.

Expected values: the published Llama-2-7B count (Touvron et al. 2023), 16 bytes per parameter
(Rajbhandari et al. 2020 §3.1), Korthikanti et al. 2022 Table 2, Megatron sharding (Shoeybi et al.
2019 §3), each worked out in the comment next to it.
"""

import pytest

from parmem import ModelSpec, ParallelConfig, TrainingSetup
from parmem.activations import per_layer_bytes
from parmem.estimate import estimate
from parmem.traces import stage_weight_tensors, training_step_events


def test_training_step_events_model_states_are_16_bytes_per_param():
    # Llama-2-7B, one GPU: the parameter tensors sum to 2 bytes x 6,738,415,616 (the published
    # count); after the step, weights + gradients + fp32 master + two Adam moments = 16 bytes per
    # parameter (Rajbhandari et al. 2020, §3.1) are all that is left.
    spec = ModelSpec.preset("llama-2-7b")
    ev = training_step_events(spec, ParallelConfig(), TrainingSetup(seq_len=256))
    live: dict = {}
    for e in ev:
        if e[0] == "alloc":
            live[e[1]] = e[2]
        else:
            del live[e[1]]
    n_weights = spec.layers * 9 + 3          # 7 matrices + 2 norms per layer, emb, norm, head
    assert sum(e[2] for e in ev[:n_weights]) == 2 * 6_738_415_616
    assert sum(live.values()) == 16 * 6_738_415_616


def test_training_step_events_activations_match_table2_at_the_end_of_forward():
    # GPT-3 175B shapes at t = 8, one micro-batch: just before the first backward the live bytes
    # are the stage's 16-bit weights plus L layers of sbh(10 + 24/t + 5as/(ht)) (Korthikanti et
    # al. 2022, Table 2).
    spec = ModelSpec.preset("gpt3-175b").with_(bias=False, norm="rmsnorm", position="rotary",
                                              tied_embeddings=False)
    s, b, t = 2048, 1, 8
    ev = training_step_events(spec, ParallelConfig(tp=t), TrainingSetup(seq_len=s,
                                                                         micro_batch=b))
    n_weights = spec.layers * 8 + 3          # 6 matrices + 2 norms per layer, emb, norm, head
    weights = sum(e[2] for e in ev[:n_weights])
    # live bytes after the forward: every allocation before the first free, less the two
    # gradient buffers the last layer's backward allocates just before it
    first_free = next(i for i, e in enumerate(ev) if e[0] == "free")
    allocated_before = sum(e[2] for e in ev[:first_free - 2])
    table2 = spec.layers * per_layer_bytes(s, b, spec.hidden, spec.heads, tp=t)
    assert allocated_before - weights == table2


@pytest.mark.parametrize("name,par", [
    ("gpt2", ParallelConfig(pp=2)),                       # tied embedding copied to the last stage
    ("gpt3-175b", ParallelConfig(tp=8, pp=4)),            # biases, learned positions
    ("llama-3-70b", ParallelConfig(tp=16)),               # t > kv_heads: one kv head per GPU
    ("mixtral-8x7b", ParallelConfig(dp=8, ep=2, pp=4)),   # experts and router
])
def test_stage_weight_tensors_are_the_estimates_parameters(name, par):
    # two independent codings of Shoeybi et al. 2019 §3 sharding must agree on every stage
    spec = ModelSpec.preset(name)
    est = estimate(spec, par, TrainingSetup(seq_len=256))
    for i, st in enumerate(est.stages):
        assert 2 * sum(stage_weight_tensors(spec, par, i)) == st.params


def test_training_step_events_rejects_what_it_does_not_model():
    spec = ModelSpec.preset("llama-2-7b")
    with pytest.raises(ValueError, match="zero=3"):
        training_step_events(spec, ParallelConfig(dp=2, zero=3), TrainingSetup(seq_len=128))
    with pytest.raises(ValueError, match="stage=2"):
        training_step_events(spec, ParallelConfig(pp=2), TrainingSetup(seq_len=128), stage=2)


def test_record_allocations_sees_new_storages_and_their_death():
    torch = pytest.importorskip("torch")
    from parmem.traces import record_allocations

    with record_allocations() as rec:
        x = torch.empty(1000, dtype=torch.uint8)
        v = x.view(10, 100)          # a view: no allocation
        y = x + 1                    # a new 1000-byte storage
        y.add_(1)                    # in place: no allocation
        del x, v                     # x's storage dies; seen after the next operator
        z = y * 2
    kinds = [(e[0], e[2] if e[0] == "alloc" else None) for e in rec.events]
    assert kinds == [("alloc", 1000), ("alloc", 1000), ("free", None), ("alloc", 1000)]
    assert rec.events[2][1] == rec.events[0][1]      # the first storage is the one freed
    assert rec.live == 2 and z.shape == (1000,)
