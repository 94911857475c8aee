"""The planner's kernel rates (issue 29): an engine's busy fraction by GPU generation, the
attention core's rate, and the dtype in which a measured source reduces gradients. Expected
values come from the datasheets (generations, peaks) and Narayanan et al. 2021 eq. (3) (FLOPs),
not from the model."""

from __future__ import annotations

import tomllib
from dataclasses import replace

import pytest
from helpers import gpt

from parmem import Cluster, ParallelConfig, TrainingSetup
from parmem._data import data_path
from parmem.hardware import hardware_preset, hardware_presets
from parmem.planner import Assumptions, evaluate
from parmem.planner.cost import flop_byte_ratio
from parmem.planner.heldout import ORGS, Scored, leave_one_out, measured_runs, run_from_row, score

PEAK = {"a100-80gb": 312e12, "h100-sxm": 989e12}  # dense BF16, the datasheets
# busy fraction = mfu exactly
PLAIN = dict(mfu=0.5, mfu_half_width=0, mfu_half_hidden=0, mfu_half_tokens=0)


def test_presets_name_their_generation():
    """NVIDIA's whitepapers and datasheets: the A100 is Ampere, the H100 and H200 Hopper."""
    gens = {n: hardware_preset(n).generation for n in hardware_presets()}
    assert gens == {"a100-40gb": "ampere", "a100-80gb": "ampere", "h100-sxm": "hopper",
                    "h200": "hopper"}  # fmt: skip


def _eq3_setup(engine: str, recompute: str = "full"):
    spec = gpt("gpt-1.3b", heads=16, hidden=2048, layers=24)
    par = ParallelConfig(dp=8, zero=3 if engine == "fsdp2" else 1)
    # the scores kept (no FlashAttention): eq. (3)'s backward of two forwards, the core's too
    st = TrainingSetup(seq_len=2048, micro_batch=2, num_microbatches=4, recompute=recompute,
                       engine=engine, flash_attention=False)  # fmt: skip
    return spec, par, st


@pytest.mark.parametrize(
    "gpu,own,other",
    [
        ("a100-80gb", "mfu_ampere_scale", "mfu_hopper_scale"),
        ("h100-sxm", "mfu_hopper_scale", "mfu_ampere_scale"),
    ],
)
def test_an_engines_kernels_run_at_its_generations_scale(gpu, own, other):
    """FSDP2 on one node: compute + recompute = eq. (3) FLOPs per GPU over peak · mfu · scale,
    with the scale of the GPU's own generation; the paper profile takes none."""
    spec, par, st = _eq3_setup("fsdp2")
    G, s, h, L, V = 64, 2048, 2048, 24, 51200
    eq3 = 96 * G * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
    cluster = Cluster(gpu, 8, 1)
    c = evaluate(spec, cluster, par, st, **PLAIN, **{own: 1.25, other: 0.6})
    want = eq3 / 8 / (PEAK[gpu] * 0.5 * 1.25)
    assert c.time.compute + c.time.recompute == pytest.approx(want, rel=1e-12)
    spec, par, st = _eq3_setup("paper")
    p = evaluate(spec, cluster, par, st, **PLAIN, **{own: 1.25, other: 0.6})
    assert p.time.compute + p.time.recompute == pytest.approx(eq3 / 8 / (PEAK[gpu] * 0.5),
                                                              rel=1e-12)  # fmt: skip


@pytest.mark.parametrize("half", [1024, 4096])
def test_an_engines_micro_batch_costs_mfu_half_tokens_more(half):
    """Each micro-batch of b·s tokens costs the compute of b·s + mfu_half_tokens under an engine
    profile (the rate times b·s/(b·s + mfu_half_tokens)); the paper profile is not charged."""
    spec, par, st = _eq3_setup("fsdp2")
    G, s, h, L, V = 64, 2048, 2048, 24, 51200
    eq3 = 96 * G * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
    cluster = Cluster("a100-80gb", 8, 1)
    kw = {**PLAIN, "mfu_half_tokens": half, "mfu_ampere_scale": 1.0}
    c = evaluate(spec, cluster, par, st, **kw)
    tokens = 2 * 2048  # micro_batch 2 of 2,048-token sequences
    want = eq3 / 8 / (312e12 * 0.5) * (tokens + half) / tokens
    assert c.time.compute + c.time.recompute == pytest.approx(want, rel=1e-12)
    spec, par, st = _eq3_setup("paper")
    p = evaluate(spec, cluster, par, st, **kw)
    assert p.time.compute + p.time.recompute == pytest.approx(eq3 / 8 / (312e12 * 0.5),
                                                              rel=1e-12)  # fmt: skip


def test_the_defaults_slow_hopper_below_ampere():
    """The fitted scales say what the sources say: the same engine sustains a smaller fraction
    of the H100's peak than of the A100's (FlashAttention-3's abstract: FlashAttention-2 at 35 %
    of the H100, 50-73 % of the A100), and current engines beat the 2021 paper runs on A100s."""
    a = Assumptions()
    assert a.mfu_hopper_scale < a.mfu_ampere_scale and a.mfu_ampere_scale > 1


# HBM bandwidth, bytes/s: the datasheets' "GPU Memory Bandwidth" (A100 80GB SXM, H100 SXM, H200)
BANDWIDTH = {"a100-80gb": 2039e9, "h100-sxm": 3350e9, "h200": 4800e9}


@pytest.mark.parametrize("gpu", ["a100-80gb", "h100-sxm", "h200"])
def test_the_elementwise_work_weighs_by_the_gpus_flop_to_byte_ratio(gpu):
    """Under an engine profile the hidden size at which the kernels run at half their rate is
    mfu_half_hidden times the GPU's peak-to-bandwidth ratio over the A100 80GB's (datasheet
    numbers: 989/3350 over 312/2039 is 1.93 on an H100); the paper profile keeps 1."""
    peak = {**PEAK, "h200": 989e12}[gpu]
    ratio = (peak / BANDWIDTH[gpu]) / (312e12 / 2039e9)
    assert flop_byte_ratio(hardware_preset(gpu), "fsdp2") == pytest.approx(ratio, rel=1e-12)
    assert flop_byte_ratio(hardware_preset(gpu), "paper") == 1.0
    spec, par, st = _eq3_setup("fsdp2")
    G, s, h, L, V = 64, 2048, 2048, 24, 51200
    eq3 = 96 * G * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
    kw = {**PLAIN, "mfu_half_hidden": 1000, "mfu_ampere_scale": 1.0, "mfu_hopper_scale": 1.0}
    c = evaluate(spec, Cluster(gpu, 8, 1), par, st, **kw)
    want = eq3 / 8 / (peak * 0.5 * h / (h + 1000 * ratio))
    assert c.time.compute + c.time.recompute == pytest.approx(want, rel=1e-12)
    spec, par, st = _eq3_setup("paper")
    p = evaluate(spec, Cluster(gpu, 8, 1), par, st, **kw)
    assert p.time.compute + p.time.recompute == pytest.approx(
        eq3 / 8 / (peak * 0.5 * h / (h + 1000)), rel=1e-12)  # fmt: skip


def test_a_gpu_of_no_stated_bandwidth_keeps_the_reference_weight():
    """A custom GPU without ``memory_bandwidth`` (0: not stated) is not weighed at all."""
    hw = replace(hardware_preset("h100-sxm"), memory_bandwidth=0.0)
    assert flop_byte_ratio(hw, "fsdp2") == 1.0


def test_flash_attentions_backward_recomputes_the_scores():
    """FlashAttention's backward recomputes QKᵀ: five matmuls of 2·s²·d_head a head against the
    forward's two (Dao et al. 2022, Algorithm 4), so the core's backward costs 2.5 of its
    forwards, 0.5 more than the two that eq. (3) counts. The core's forward is 4·s²·h FLOPs per
    layer and sequence; nothing else in the step changes."""
    spec, par, st = _eq3_setup("paper", recompute="none")
    G, s, h, L = 64, 2048, 2048, 24
    cluster = Cluster("a100-80gb", 8, 1)
    kept = evaluate(spec, cluster, par, replace(st, flash_attention=False), **PLAIN)
    flash = evaluate(spec, cluster, par, replace(st, flash_attention=True), **PLAIN)
    extra = 0.5 * (4 * s * s * h) * L * G / 8 / (312e12 * 0.5)
    assert flash.time.compute - kept.time.compute == pytest.approx(extra, rel=1e-9)
    assert flash.time.recompute == kept.time.recompute == 0


def test_the_attention_core_runs_at_its_own_rate():
    """The core's forward FLOPs are 4·s²·h per layer and sequence (eq. (3)'s s/(6h) term of
    24·s·h²); at attention_efficiency e its three passes (forward, backward) and the recomputed
    forward take 1/e as long, the rest of the work is unchanged."""
    spec, par, st = _eq3_setup("paper")
    G, s, h, L = 64, 2048, 2048, 24
    cluster = Cluster("a100-80gb", 8, 1)
    base = evaluate(spec, cluster, par, st, **PLAIN)
    slow = evaluate(spec, cluster, par, st, **PLAIN, attention_efficiency=0.5)
    core = 4 * (4 * s * s * h) * L * G  # fwd + bwd (two fwds) + full recompute (one fwd)
    extra = core * (1 / 0.5 - 1) / 8 / (312e12 * 0.5)
    t = (slow.time.compute + slow.time.recompute) - (base.time.compute + base.time.recompute)
    assert t == pytest.approx(extra, rel=1e-9)
    with pytest.raises(ValueError, match="attention_efficiency"):
        evaluate(spec, cluster, par, st, attention_efficiency=0.0)


def test_a_stated_bf16_reduction_sends_half_the_gradient_bytes():
    """ZeRO-3 with nothing overlapped: two bf16 all-gathers of the weights and one reduce-scatter
    of the gradients, all ring collectives of the same size per element: 2 + 2 + 4 = 8 bytes
    per parameter with FSDP2's fp32 reduce_dtype, 2 + 2 + 2 = 6 with a bf16 one."""
    spec, par, st = _eq3_setup("fsdp2", recompute="none")
    cluster = Cluster("h100-sxm", 8, 1)
    fp32 = evaluate(spec, cluster, par, st, dp_overlap_on=0.0)
    bf16 = evaluate(spec, cluster, par, TrainingSetup(**{**st.__dict__, "grad_dtype": "bf16"}),
                    dp_overlap_on=0.0)  # fmt: skip
    assert bf16.time.dp / fp32.time.dp == pytest.approx(6 / 8, rel=0.01)


def test_measured_runs_reduce_in_the_dtype_their_code_states():
    """Composer's PURE mixed precision and fms-fsdp's bfSixteen reduce in bf16 (each group
    quotes the code); Composer's DEFAULT changed between versions, so those rows are unknown
    and keep the profile's fp32; torchtitan states nothing here."""
    data = tomllib.loads(data_path("measured_runs.toml").read_text())
    for name, g in data.items():
        if "grad_reduce" in g:
            assert "grad_reduce_source" in g, name
    by_key = {}
    for r in measured_runs():
        row_modes = {r2.get("mp_mode") for r2 in data[r.group]["rows"]}
        by_key.setdefault(r.group, set()).add(r.setup.grad_dtype)
        if r.group.startswith("llmfoundry") and row_modes == {"PURE"}:
            assert r.setup.grad_dtype == "bf16"
    assert by_key["llmfoundry_a100_40gb"] == {"bf16"}  # every row PURE
    assert by_key["llmfoundry_h100"] == {None}  # every row DEFAULT
    assert by_key["llmfoundry_a100_80gb"] == {"bf16", None}
    assert by_key["ibm_fsdp_blog_2024_03"] == {"bf16"}
    assert by_key["torchtitan_2024"] == {None}


def test_leave_one_out_fits_several_assumptions_on_the_other_organisations():
    """Two organisations, a grid of 2 x 2 pairs: each fold's pair is the best on the *other*
    organisation alone, scored on the held-out one."""
    runs = [r for r in measured_runs() if r.org in ("BAAI", "NVIDIA")]
    names, grid = ("mfu_ampere_scale", "mfu_hopper_scale"), ((1.0, 1.3), (0.8, 1.0))
    folds = leave_one_out(names, grid, runs)
    assert [f.held_out for f in folds] == ["BAAI", "NVIDIA"]

    def mean_err(org, a, h):
        e = [abs(s.error) for s in score([r for r in runs if r.org == org],
                                         mfu_ampere_scale=a, mfu_hopper_scale=h)
             if isinstance(s, Scored)]  # fmt: skip
        return sum(e) / len(e)

    pairs = [(a, h) for a in grid[0] for h in grid[1]]
    for f, other in zip(folds, ("NVIDIA", "BAAI"), strict=True):
        best = min(pairs, key=lambda p, o=other: mean_err(o, *p))
        assert f.value == dict(zip(names, best, strict=True))
        assert f.held_out_mean == pytest.approx(mean_err(f.held_out, *best))
    assert set(ORGS.values()) >= {f.held_out for f in folds}


def test_a_loop_without_gradient_accumulation_runs_the_local_batch_at_once():
    """torchtitan's 2024 loop and fms-fsdp's (at the IBM blog's date too) run one forward and
    backward per step on the rank's whole batch (each group quotes the code): a row's
    batch_per_dp is its micro-batch. A row of a group that does not say, and that prints no
    micro-batch, keeps micro-batch 1."""
    data = tomllib.loads(data_path("measured_runs.toml").read_text())
    for name, g in data.items():
        if "grad_accum" in g:
            assert g["grad_accum"] == 1 and "grad_accum_source" in g, name
    for r in measured_runs():
        rows = data[r.group]["rows"]
        local = {x["batch_per_dp"] for x in rows if "batch_per_dp" in x}
        if r.group in ("torchtitan_2024", "ibm_fsdp_blog_2024_03"):
            assert r.setup.micro_batch in local and r.setup.num_microbatches == 1, r.key
    # the IBM blog's group as if it quoted no loop: its 70B row, 2 a GPU, as 2 micro-batches of 1
    group = {k: v for k, v in data["ibm_fsdp_blog_2024_03"].items() if k != "grad_accum"}
    row = next(x for x in group["rows"] if x["model"] == "llama-2-70b")
    r = run_from_row("ibm_fsdp_blog_2024_03", group, row)
    assert (r.setup.micro_batch, r.setup.num_microbatches) == (1, 2)


def test_by_table_separates_a_tables_offset_from_its_spread():
    """Three rows of one table modelled 10 % slow, 10 % fast and 30 % slow: offset +10 %, mean
    |error| 1/6, and 2/15 once the offset is out (|0|, |-0.2|, |+0.2|); a one-row table's error
    is all offset. Rows the planner could not model are not counted."""
    from parmem.planner.heldout import by_table, pooled_spread

    runs = measured_runs()
    first = [r for r in runs if r.group == runs[0].group][:3]
    other = next(r for r in runs if r.group != runs[0].group)
    scored = [Scored(r, r.step_time * (1 + e)) for r, e in zip(first, (0.1, -0.1, 0.3), strict=True)]
    scored += [Scored(other, other.step_time * 0.8), (other, "not modelled")]
    a, b = by_table(scored)
    assert (a.group, a.org, a.rows) == (first[0].group, first[0].org, 3)
    assert a.offset == pytest.approx(0.1) and a.mean == pytest.approx(1 / 6)
    assert a.mean_without_offset == pytest.approx(2 / 15)
    assert (b.group, b.rows, b.offset, b.mean_without_offset) == (
        other.group, 1, pytest.approx(-0.2), pytest.approx(0.0))  # fmt: skip
    # pooled over the four rows: (3 · 2/15 + 1 · 0) / 4
    assert pooled_spread([a, b]) == pytest.approx(0.1)


def test_flash_backward_is_what_pytorchs_flop_counter_counts_for_its_kernels():
    """PyTorch's own FLOP accounting of its fused attention kernels (torch.utils.flop_counter,
    registered for the flash, memory-efficient and cuDNN SDPA backward ops) counts the backward
    as the recomputed scores plus four gradient matmuls: 2.5 of the forward's count, the
    factor the time model takes (cost.FLASH_CORE_BACKWARD)."""
    from torch.utils import flop_counter

    from parmem.planner.cost import FLASH_CORE_BACKWARD

    ops = {str(k) for k in flop_counter.flop_registry}
    assert {"aten._scaled_dot_product_flash_attention_backward",
            "aten._scaled_dot_product_cudnn_attention_backward"} <= ops  # fmt: skip
    for shape in ((1, 8, 2048, 128), (2, 32, 4096, 64)):  # batch, heads, s, d_head
        fwd = flop_counter.sdpa_flop_count(shape, shape, shape)
        bwd = flop_counter.sdpa_backward_flop_count(shape, shape, shape, shape)
        assert bwd / fwd == FLASH_CORE_BACKWARD
