"""parmem.config: ParallelConfig, TrainingSetup and the layout checks name the field and the rule
of every invalid input (shapes: the Llama-2-7B and GPT-2 configs, data/models.toml)."""

import pytest

from parmem import ModelSpec, ParallelConfig, TrainingSetup, estimate


@pytest.mark.parametrize("par,setup,kw,msg", [
    (dict(tp=3), {}, {}, "tp=3 must divide heads=32"),
    (dict(pp=48), {}, {}, "pp=48 > layers=32"),
    (dict(dp=0), {}, {}, "dp=0 must be an integer >= 1"),
    (dict(zero=4), {}, {}, "zero=4 must be an integer in 0..3"),
    (dict(sp=True), {}, {}, "sp=True needs tp >= 2"),
    (dict(ep=2, dp=2), {}, {}, "needs a mixture-of-experts model"),
    (dict(dp=3, ep=2), {}, {}, r"ep=2 must divide dp\*cp=3"),
    (dict(pp=2, vpp=2), {}, {}, "interleaved schedule needs vpp >= 2"),
    (dict(pp=4, vpp=2), dict(schedule="interleaved", num_microbatches=6), {},
     "num_microbatches=6 must be a multiple of pp=4"),
    (dict(pp=2), {}, dict(layers_per_stage=[10, 10]), "must sum to layers=32"),
    (dict(pp=2), {}, dict(layers_per_stage=[32]), "needs pp=2"),
    (dict(pp=2), {}, dict(layers_per_stage=[32, 0]), r"layers_per_stage\[1\]=0"),
    (dict(dp=2, tp=2), {}, dict(world_size=8), r"dp\*tp\*pp\*cp = 2\*2\*1\*1 = 4 must equal"),
    (dict(cp=3), {}, {}, "cp=3 must divide seq_len=4096"),
    (dict(), dict(micro_batch=0), {}, "micro_batch=0 must be an integer >= 1"),
    (dict(), dict(precision="fp8"), {}, "precision='fp8' must be one of"),
    (dict(), dict(optimizer="adagrad"), {}, "optimizer='adagrad' must be one of"),
    (dict(), dict(recompute="partial"), {}, "recompute='partial' must be one of"),
])
def test_invalid_configs(par, setup, kw, msg):
    spec = ModelSpec.preset("llama-2-7b")
    with pytest.raises(ValueError, match=msg):
        estimate(spec, ParallelConfig(**par), TrainingSetup(seq_len=4096, **setup), **kw)


def test_learned_positions_limit_the_sequence():
    with pytest.raises(ValueError, match="seq_len=2048 > max_positions=1024"):
        estimate(ModelSpec.preset("gpt2"), ParallelConfig(), TrainingSetup(seq_len=2048))
