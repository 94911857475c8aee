"""One LoRA and one QLoRA step of a tiny Transformers Llama under DDP on the pool's ranks,
measured (parmem.distributed.finetune_runs.demo), held against parmem.estimate for the same model
(issue 31): weights as stored (bitsandbytes' packed NF4 data and quantisation state included),
gradients, optimizer states and the bytes autograd keeps, loss included, must be equal, every
difference named (torch AdamW's 0-d step tensors; QLoRA's dequantised weight, a transient the
estimate adds and autograd does not save). The expected trainable count is PEFT's own
(``get_nb_trainable_parameters`` on the model the demo builds), not parmem's.
"""

from __future__ import annotations

import pytest

pytest.importorskip("peft")
pytest.importorskip("bitsandbytes")

pytestmark = pytest.mark.dist


@pytest.mark.parametrize(
    "adapter, optimizer, targets",
    [("lora", "adamw", "all-linear"), ("qlora", "paged-adam-8bit", "all-linear"),
     ("qlora", "adamw", "qv")],
)
def test_fine_tuning_step_per_rank_equals_the_estimate(pool, adapter, optimizer, targets):
    from parmem.distributed.finetune_runs import compare

    res = pool.run("parmem.distributed.finetune_runs:demo", adapter=adapter, optimizer=optimizer,
                   targets=targets)
    for row in res:
        assert row["max_adapter_diff_vs_rank0"] == 0.0
        assert row["trainable"] == row["peft_trainable"]
        assert [r["unexplained"] for r in compare(row)] == [0, 0, 0, 0], compare(row)
        assert row["measured"]["grads"] == 4 * row["trainable"]
