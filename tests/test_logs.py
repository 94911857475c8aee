"""parmem.planner.logs: the readers of training logs behind ``parmem calibrate`` (issue 29).

The fixtures under tests/fixtures/logs are excerpts of public logs, copied line for line (each
file's first lines cite its URL), and one hand-written profiler trace. Every expected number
below is read off the fixture's text and worked out by hand in the comment beside it.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import re
from pathlib import Path

import pytest

from parmem.planner.logs import FORMATS, WARMUP_ITERATIONS, StepLog, read_log, read_log_file

LOGS = Path(__file__).resolve().parent / "fixtures" / "logs"
# https://github.com/NVIDIA/Megatron-LM/issues/756, description (t=4, d=4, 2024-03-30)
MIXTRAL_1 = LOGS / "megatron_756_mixtral_first_run.log"
# https://github.com/NVIDIA/Megatron-LM/issues/756, comment of 2024-04-06 (expert parallel 8)
MIXTRAL_2 = LOGS / "megatron_756_mixtral_second_run.log"
# https://github.com/epfLLM/Megatron-LLM/issues/11: no timestamp, no TFLOP/s
OLD = LOGS / "megatron_llm_11_old_format.log"
# https://github.com/pytorch/torchtitan/pull/2389: 8 ranks print every step
TITAN_RANKS = LOGS / "torchtitan_2389_eight_ranks.log"
# https://github.com/pytorch/torchtitan/pull/3393: "[rank0]:" before every line
TITAN_RANK0 = LOGS / "torchtitan_3393_rank0.log"
# https://github.com/pytorch/torchtitan/pull/3935: steps 1 to 5 of a run
TITAN_FIRST = LOGS / "torchtitan_3935_first_steps.log"
# hand-written: three ProfilerStep events of 812500, 790000 and 801250 us, and a GPU copy
TRACE = LOGS / "profiler_hand_written.json"


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _megatron_arg(name: str, value: str) -> str:
    # the line Megatron-LM's _print_args prints (megatron/training/arguments.py)
    return "  {} {} {}".format(name, "." * (48 - len(name)), value)


# ---- detection ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "fmt"),
    [
        (MIXTRAL_1, "megatron"),
        (MIXTRAL_2, "megatron"),
        (OLD, "megatron"),
        (TITAN_RANKS, "torchtitan"),
        (TITAN_RANK0, "torchtitan"),
        (TITAN_FIRST, "torchtitan"),
        (TRACE, "profiler"),
    ],
)
def test_the_format_is_recognised(path, fmt):
    log = read_log_file(path)
    assert isinstance(log, StepLog)
    assert log.format == fmt and log.format in FORMATS
    assert log.name == str(path)
    assert read_log(_text(path)).name == "<text>"


# ---- Megatron-LM --------------------------------------------------------------------------


def test_megatron_steps_median_and_throughput():
    log = read_log_file(MIXTRAL_2)
    # the log's "elapsed time per iteration (ms)" of iterations 29, 30, 31, 99, 100
    assert [i for i, _ in log.steps] == [29, 30, 31, 99, 100]
    assert [s for _, s in log.steps] == pytest.approx([5.9121, 5.5711, 5.7189, 5.5235, 5.5400])
    # the first logged entry (29) is warm-up; 30, 31, 99, 100 are past iteration 4
    assert log.kept == (30, 31, 99, 100)
    # sorted 5523.5, 5540.0, 5571.1, 5718.9 ms: median (5540.0 + 5571.1) / 2 = 5555.55 ms
    assert log.step_time == pytest.approx(5.55555)
    # TFLOP/s/GPU of the kept lines 234.4, 228.3, 236.4, 235.7: median (234.4 + 235.7) / 2
    assert log.reported_tflops == pytest.approx(235.05)
    assert log.tokens_per_s_per_gpu is None
    assert log.global_batch == 128  # "global batch size:   128"


def test_megatron_arguments_are_typed():
    s = read_log_file(MIXTRAL_2).settings
    assert s["expert_model_parallel_size"] == 8
    assert s["hidden_size"] == 4096 and type(s["hidden_size"]) is int
    assert s["ffn_hidden_size"] == 14336
    assert s["global_batch_size"] == 128
    assert s["fp8"] is None
    assert s["fp16"] is False and s["gradient_accumulation_fusion"] is True
    assert s["head_lr_mult"] == 1.0 and type(s["head_lr_mult"]) is float
    assert s["fp8_amax_compute_algo"] == "most_recent"
    assert len(s) == 23  # the 23 argument lines of the excerpt


def test_megatron_first_run_settings_and_world_line():
    log = read_log_file(MIXTRAL_1)
    s = log.settings
    assert s["hidden_size"] == 4096
    assert s["recompute_granularity"] is None
    assert s["accumulate_allreduce_grads_in_fp32"] is True
    assert s["add_bias_linear"] is False
    assert s["adam_eps"] == 1e-08
    assert s["initial_loss_scale"] == 4294967296
    assert s["retriever_report_topk_accuracies"] == []
    assert s["load"] == "custom/ckpt/mixtral-8x7b"
    assert s["log_interval"] == 1
    # "using world size: 16, data-parallel size: 4, context-parallel size: 1
    # tensor-model-parallel size: 4, pipeline-model-parallel size: 1 "
    assert s["world_size"] == 16 and s["data_parallel_size"] == 4
    assert s["context_parallel_size"] == 1
    assert s["tensor_model_parallel_size"] == 4 and s["pipeline_model_parallel_size"] == 1
    assert len(s) == 56 + 5  # 11 + 22 + 23 argument lines, 5 sizes
    # iterations 10, 11, 12 at 9496.4, 10036.9, 10198.4 ms; 10 is the first logged entry
    assert log.kept == (11, 12)
    assert log.step_time == pytest.approx((10.0369 + 10.1984) / 2)  # 10.11765 s
    assert log.reported_tflops == pytest.approx((130.1 + 128.1) / 2)  # 129.1


def test_the_arguments_block_wins_over_the_world_line():
    text = _text(MIXTRAL_1) + _megatron_arg("world_size", "32") + "\n"
    assert read_log(text).settings["world_size"] == 32


def test_argument_values_and_line_shape():
    lines = [
        _megatron_arg("params_dtype", "torch.bfloat16"),
        _megatron_arg("data_path", "['/data/a', '/data/b']"),
        _megatron_arg("some_tuple", "(1, 2)"),
        _megatron_arg("max_tokens_to_oom", "inf"),
        _megatron_arg("a_name_of_fifty_one_characters_xxxxxxxxxxxxxxxxxxx", "7"),
        "  wrong_dots ..... 3",  # not the 48 - len(name) dots _print_args writes
    ]
    text = "\n".join(lines + [_text(OLD)])
    s = read_log(text).settings
    assert s["params_dtype"] == "torch.bfloat16"
    assert s["data_path"] == ["/data/a", "/data/b"]
    assert s["some_tuple"] == [1, 2]
    assert s["max_tokens_to_oom"] == math.inf
    assert s["a_name_of_fifty_one_characters_xxxxxxxxxxxxxxxxxxx"] == 7
    assert "wrong_dots" not in s


def test_old_megatron_line_without_timestamp_or_tflops():
    log = read_log_file(OLD)
    assert [i for i, _ in log.steps] == [122, 123, 124, 125]
    assert log.kept == (123, 124, 125)
    # 87871.6, 89474.8, 89075.2 ms: sorted, the middle one is 89075.2 ms
    assert log.step_time == pytest.approx(89.0752)
    assert log.reported_tflops is None and log.tokens_per_s_per_gpu is None
    assert log.global_batch == 1024 and log.settings == {}


def test_megatron_today_line_with_microseconds_and_rank_prefix():
    # the same numbers as the 2024 log, in today's shape: microseconds in the timestamp
    # (megatron/training/training.py, training_log) and torchrun's "[rank15]:" tee prefix
    text = _text(MIXTRAL_2)
    text = re.sub(r"^ \[(\S+ \S+)\]", r"[rank15]: [\1.000000]", text, flags=re.M)
    assert "[rank15]: [2024-04-06 02:58:23.000000] iteration" in text
    log = read_log(text)
    assert log.kept == (30, 31, 99, 100)
    assert log.step_time == pytest.approx(5.55555)


def test_warmup_n_leaves_out_the_first_n_entries():
    # all five: 5523.5, 5540.0, 5571.1, 5718.9, 5912.1 ms sorted; median 5571.1 ms
    log = read_log_file(MIXTRAL_2, warmup=0)
    assert log.kept == (29, 30, 31, 99, 100)
    assert log.step_time == pytest.approx(5.5711)
    # without the first three: 5523.5 and 5540.0 ms
    log = read_log_file(MIXTRAL_2, warmup=3)
    assert log.kept == (99, 100)
    assert log.step_time == pytest.approx((5.5235 + 5.5400) / 2)


# ---- torchtitan ---------------------------------------------------------------------------


def test_torchtitan_rank_duplicates_collapse_to_the_first_line():
    log = read_log_file(TITAN_RANKS)
    # 4 + 7 + 1 step lines, three steps
    assert [i for i, _ in log.steps] == [1, 5, 6]
    first, five, six = (s for _, s in log.steps)
    assert math.isnan(first)  # no logged step before step 1
    # 19:48:29,513 -> 19:48:36,099 over steps 1 -> 5: 6.586 s / 4 = 1.6465 s per step
    assert five == pytest.approx(1.6465)
    assert six == pytest.approx(1.653)  # 19:48:36,099 -> 19:48:37,752
    assert log.kept == (5, 6)
    assert log.step_time == pytest.approx((1.6465 + 1.653) / 2)  # 1.64975
    # tps of each step's first line: 9,966 and 9,913; tflops 312.06 and 310.41
    assert log.tokens_per_s_per_gpu == pytest.approx((9966 + 9913) / 2)
    assert log.reported_tflops == pytest.approx((312.06 + 310.41) / 2)
    # warmup=0 keeps step 1, whose first line says tps 2,075 (the other ranks 2,072, 2,106, ...)
    all_three = read_log_file(TITAN_RANKS, warmup=0)
    assert all_three.tokens_per_s_per_gpu == 9913  # median of 2075, 9966, 9913
    assert all_three.reported_tflops == pytest.approx(310.41)  # of 64.97, 312.06, 310.41
    assert all_three.step_time == pytest.approx(1.64975)  # step 1 has no seconds


def test_torchtitan_rank_prefix_timestamps_and_mesh():
    log = read_log_file(TITAN_RANK0)
    assert [i for i, _ in log.steps] == list(range(14, 22))
    # seconds between the lines: 47,456-46,338 = 1.118; 1.121; 1.125; 1.119; 1.121; 1.127; 1.122
    expected = [1.118, 1.121, 1.125, 1.119, 1.121, 1.127, 1.122]
    assert [s for _, s in log.steps[1:]] == pytest.approx(expected)
    assert log.kept == tuple(range(15, 22))
    assert log.step_time == pytest.approx(1.121)  # the 4th of the 7 sorted
    # tps 7334, 7313, 7282, 7322, 7309, 7272, 7304: sorted, the 4th is 7309
    assert log.tokens_per_s_per_gpu == 7309
    assert log.reported_tflops == pytest.approx(0.52)  # 0.53 once, 0.52 six times
    assert log.settings == {"pp": 1, "dp_replicate": 1, "dp_shard": 2, "cp": 1, "tp": 1, "ep": 1}
    assert log.global_batch is None


def test_torchtitan_settings_lines():
    # two lines of the second run in https://github.com/pytorch/torchtitan/pull/3393 (copied)
    model = (
        "[rank0]:[titan] 2026-05-18 16:07:12,518 - root - INFO - Model llama3 debugmodel size: "
        "6,163,712 total parameters"
    )
    peak = (
        "[rank0]:[titan] 2026-05-18 16:07:12,874 - root - INFO - Peak FLOPS used for computing "
        "MFU: 3.120e+14"
    )
    # hand-written from torchtitan's f-strings: Trainer.__init__ before the fold-batch change
    # (torchtitan/trainer.py) and ParallelDims.build_mesh of 2025 (parallel_dims.py)
    trainer = (
        "[titan] 2026-01-01 00:00:00,000 - root - INFO - Trainer is initialized with local batch "
        "size 2, global batch size 16, gradient accumulation steps 1, sequence length 8192, "
        "total steps 1000 (warmup 200)"
    )
    old_mesh = (
        "[titan] 2025-01-01 00:00:00,000 - root - INFO - Building 2-D device mesh with "
        "['dp_shard', 'tp'], [4, 2]"
    )
    text = "\n".join([old_mesh, model, peak, trainer, _text(TITAN_RANK0)])
    s = read_log(text).settings
    assert s["model"] == "llama3" and s["flavor"] == "debugmodel"
    assert s["total_parameters"] == 6163712
    assert s["peak_flops"] == 3.12e14
    assert (s["local_batch_size"], s["global_batch_size"], s["seq_len"]) == (2, 16, 8192)
    assert (s["gradient_accumulation_steps"], s["steps"], s["warmup_steps"]) == (1, 1000, 200)
    assert s["tp"] == 1 and s["dp_shard"] == 2  # the later mesh line of the fixture wins
    assert read_log(old_mesh + "\n" + _text(TITAN_FIRST)).settings == {"dp_shard": 4, "tp": 2}
    assert read_log(text).global_batch == 16


def test_torchtitan_colour_codes_are_ignored():
    # torchtitan's colours (torchtitan/tools/utils.py, Color) before each field, as
    # MetricsProcessor.log writes them
    colours = {
        "step:": "\x1b[31m",
        "loss:": "\x1b[32m",
        "grad_norm:": "\x1b[38;2;180;60;0m",
        "memory:": "\x1b[38;2;54;234;195m",
        "tps:": "\x1b[34m",
        "tflops:": "\x1b[36m",
        "mfu:": "\x1b[35m",
    }
    lines = []
    for line in _text(TITAN_RANK0).splitlines():
        if " - step:" in line:
            for word, code in colours.items():
                line = line.replace(word, code + word, 1)
            line += "\x1b[39m"
        lines.append(line)
    coloured = read_log("\n".join(lines))
    assert "\x1b[31mstep: 15" in "\n".join(lines)
    plain = read_log_file(TITAN_RANK0)
    assert coloured.kept == plain.kept
    assert coloured.step_time == pytest.approx(1.121)
    assert coloured.tokens_per_s_per_gpu == 7309


def test_torchtitan_without_timestamps_gives_tps_only():
    text = re.sub(r"^.* - INFO - ", "", _text(TITAN_RANK0), flags=re.M)
    assert text.splitlines()[-1].startswith("step: 21  loss:")
    log = read_log(text)
    assert log.format == "torchtitan"
    assert all(math.isnan(s) for _, s in log.steps)
    assert math.isnan(log.step_time)
    assert log.tokens_per_s_per_gpu == 7309


def test_default_warmup_leaves_out_iterations_up_to_four():
    assert WARMUP_ITERATIONS == 4
    log = read_log_file(TITAN_FIRST)
    # steps 1 to 4 are warm-up; step 5: 20,325 - 20,141 = 0.184 s, tps 89,030, tflops 48.34
    assert log.kept == (5,)
    assert log.step_time == pytest.approx(0.184)
    assert log.tokens_per_s_per_gpu == 89030
    assert log.reported_tflops == pytest.approx(48.34)  # "mfu: N/A" does not matter
    # warmup=1 keeps 2..5: 0.192, 0.188, 0.183, 0.184 s -> (0.184 + 0.188) / 2
    log = read_log_file(TITAN_FIRST, warmup=1)
    assert log.kept == (2, 3, 4, 5)
    assert log.step_time == pytest.approx(0.186)
    assert log.tokens_per_s_per_gpu == (87036 + 89030) / 2  # of 85,636 87,036 89,849 89,030


# ---- profiler traces ----------------------------------------------------------------------


def test_profiler_trace_json_and_gz(tmp_path):
    log = read_log_file(TRACE)
    # the CPU ranges, in us: 812500, 790000, 801250; the GPU copy of step 11 (5000 us) is not one
    assert log.steps == ((10, 0.8125), (11, 0.79), (12, 0.80125))
    assert log.kept == (10, 11, 12)  # past iteration 4; a trace keeps its first step
    assert log.step_time == pytest.approx(0.80125)
    assert log.tokens_per_s_per_gpu is None and log.reported_tflops is None
    assert log.settings == {"backend": "nccl", "rank": 0, "world_size": 8}
    zipped = tmp_path / "worker0.123.pt.trace.json.gz"
    zipped.write_bytes(gzip.compress(TRACE.read_bytes()))
    assert read_log_file(zipped).steps == log.steps


def test_profiler_trace_as_an_event_list_and_its_warmup():
    # Chrome's JSON array format; steps 2..4 of a profiler started with the job
    events = [
        {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "ts": n, "dur": 1e6}
        for n in (2, 3, 4)
    ]
    text = json.dumps(events)
    with pytest.raises(ValueError, match="warmup=0"):
        read_log(text)
    log = read_log(text, warmup=0)
    assert log.format == "profiler" and log.kept == (2, 3, 4) and log.step_time == 1.0


# ---- errors -------------------------------------------------------------------------------


def test_unknown_text_names_the_formats_looked_for():
    with pytest.raises(ValueError) as err:
        read_log("hello\nworld\n", "notes.txt")
    message = str(err.value)
    assert "\n" not in message and message.startswith("notes.txt:")
    for word in ("Megatron-LM", "torchtitan", "profiler"):
        assert word in message
    with pytest.raises(ValueError, match="traceEvents"):
        read_log('{"a": 1}')


def test_a_log_without_steps():
    head = "\n".join(_text(MIXTRAL_1).splitlines()[:30])  # the arguments, no iteration line
    with pytest.raises(ValueError, match="megatron log with no step"):
        read_log(head)
    mesh = _text(TITAN_RANK0).splitlines()[5]
    assert "Building device mesh" in mesh
    with pytest.raises(ValueError, match="torchtitan log with no step"):
        read_log(mesh)
    with pytest.raises(ValueError, match="profiler log with no step"):
        read_log('{"traceEvents": [{"ph": "X", "name": "aten::mm", "dur": 3}]}')


def test_warmup_that_leaves_nothing():
    with pytest.raises(ValueError, match="leaves none of the 4 logged steps"):
        read_log_file(OLD, warmup=4)
    first_four = "\n".join(_text(TITAN_FIRST).splitlines()[:-1])  # steps 1 to 4
    with pytest.raises(ValueError, match="warmup=0"):
        read_log(first_four)
    assert read_log(first_four, warmup=0).kept == (1, 2, 3, 4)


@pytest.mark.parametrize("bad", [-1, True, 1.5, "2"])
def test_bad_warmup(bad):
    with pytest.raises(ValueError, match="warmup"):
        read_log(_text(OLD), warmup=bad)


def test_not_a_str():
    with pytest.raises(ValueError, match="must be a str"):
        read_log(b"iteration 1/ 2 |")  # type: ignore[arg-type]


def test_steplog_is_frozen():
    log = read_log_file(OLD)
    with pytest.raises(dataclasses.FrozenInstanceError):
        log.step_time = 1.0  # type: ignore[misc]
    hash(log)  # the settings dict stays out of the hash
