"""Serving memory: weights (optionally quantised) plus the KV cache.

* KV cache (:mod:`parmem.kvcache`, re-exported here): every layer keeps a key and a value vector
  of kv_heads · head_dim numbers per token, so a token costs 2 · L · kv_heads · head_dim · bytes
  (Vaswani et al. 2017; Shazeer 2019 for MQA, Ainslie et al. 2023 for GQA); MLA keeps
  kv_lora_rank + qk_rope_head_dim per layer (DeepSeek-V2 §2.1); sliding-window layers at most
  their window. Under tensor parallelism each GPU keeps kv_heads/t heads (one head, duplicated,
  when t > kv_heads, as vLLM does).
* Parallel serving layouts (:func:`serving_layout`, :func:`decode_step_comm`,
  :func:`prefill_workspace_bytes`): what each axis divides when nothing is trained, what a decode
  step sends, and the transient activations a server sets aside (vLLM's profiling pass).
* Weights under int8/int4: every linear weight of the transformer layers is quantised; each group
  of ``group_size`` input values of a row carries one fp16 scale (and one fp16 zero point when
  ``zero_point=True``), as GPTQ (Frantar et al. 2023) and AWQ (Lin et al. 2024) store them.
  Embeddings, the LM head, norms, biases and the MoE router stay 16-bit.
"""

from __future__ import annotations

from ._check import (
    MAX_BATCH,
    MAX_GPUS,
    MAX_SEQ_LEN,
    MAX_WIDTH,
    boolean,
    choice,
    instance,
    integer,
    number,
)
from .comm import collective_bytes, collective_time
from .config import even_split
from .hardware import MAX_MEMORY_BYTES, device_memory_bytes
from .kvcache import KV_DTYPES, kv_cache_bytes, kv_cache_bytes_per_token, layer_kv_values
from .model import ModelSpec
from .sharding import (
    check_tp,
    layer_groups,
    layer_params,
    local_numel,
    model_tensors,
    stage_params,
)

__all__ = [
    "KV_DTYPES",
    "WEIGHT_DTYPES",
    "kv_cache_bytes",
    "kv_cache_bytes_per_token",
    "weight_bytes",
    "serving_weight_bytes",
    "max_concurrency",
    "Request",
    "random_requests",
    "KVCacheSim",
    "simulate_kv_cache",
    "serving_layout",
    "decode_step_comm",
    "prefill_workspace_bytes",
]

#: the most requests :func:`random_requests` draws and :func:`simulate_kv_cache` serves
MAX_REQUESTS = 2**20
#: the most steps :func:`simulate_kv_cache` runs (the latest arrival plus every output token)
MAX_SIM_STEPS = 2**20  # about 3 s of simulation on a 2-core machine (issue 34: nothing over 5 s)
#: the largest capacity, block and ``max_len`` of :func:`simulate_kv_cache`, in tokens
MAX_SIM_TOKENS = 2**40
WEIGHT_DTYPES = {"fp32": 32, "fp16": 16, "bf16": 16, "int8": 8, "int4": 4}


def _spec(spec: object) -> None:
    instance("spec", spec, ModelSpec, "ModelSpec.preset(name)")


def weight_bytes(
    spec: ModelSpec,
    dtype: str = "fp16",
    group_size: int | None = 128,
    zero_point: bool | None = None,
    tp: int = 1,
    mtp: bool = False,
) -> int:
    """Bytes of the model weights for serving on one GPU of a t-way tensor-parallel group
    (``tp=1``: one whole copy). DeepSeek-V3's multi-token-prediction modules count only with
    ``mtp=True`` (an engine loads them for speculative decoding only), in every dtype alike.

    ``dtype`` fp32/fp16/bf16 stores every parameter at that size. int8/int4 quantise the layer
    weight matrices (:func:`parmem.sharding.linear_shapes`) with one fp16 scale per
    ``group_size`` input values of each row (``group_size=None``: one per row, "per-channel")
    and, if ``zero_point`` (default: True for int4, False for int8), one fp16 zero point too;
    everything else stays fp16. Under tensor parallelism each GPU holds its shard of every tensor
    as the sharding table splits it (Shoeybi et al. 2019 §3, as vLLM serves): a row-parallel
    matrix keeps its quantisation groups when the group size divides its local input width.
    """
    _spec(spec)
    choice("dtype", dtype, WEIGHT_DTYPES)
    tp = integer("tp", tp)
    check_tp(spec, tp)
    if group_size is not None:
        group_size = integer("group_size", group_size, 1, MAX_WIDTH)
    if zero_point is not None:
        boolean("zero_point", zero_point)
    bits = WEIGHT_DTYPES[dtype]
    boolean("mtp", mtp)
    if bits >= 16:
        return sum(stage_params(spec, tp, mtp=mtp)) * bits // 8
    zp = (bits == 4) if zero_point is None else zero_point
    per_group = 2 + (2 if zp else 0)
    total = 0
    rows = [(x, k) for k, group in layer_groups(spec) for x in group]
    whole = [(x, 1) for x in model_tensors(spec) if mtp or x.component[:3] != "mtp"]
    for x, copies in rows + whole:
        n = local_numel(spec, x, tp)
        if x.kind != "linear":
            total += 2 * n * copies
            continue
        n_in = x.cols // tp if x.split == "row" else x.cols
        n_out = n // n_in // x.count
        g = n_in if group_size is None else group_size
        per_matrix = -(-n_in * n_out * bits // 8) + n_out * -(-n_in // g) * per_group
        total += copies * x.count * per_matrix
    return total


def serving_weight_bytes(
    spec: ModelSpec,
    dtype: str = "fp16",
    tp: int = 1,
    group_size: int | None = 128,
    zero_point: bool | None = None,
) -> int:
    """Weight bytes on one GPU when serving with t-way tensor parallelism:
    :func:`weight_bytes` with ``tp`` (replicated norms and biases counted on every GPU)."""
    return weight_bytes(spec, dtype, group_size, zero_point, tp=tp)


def max_concurrency(
    spec: ModelSpec,
    seq_len: int,
    gpu,
    tp: int = 1,
    weight_dtype: str = "fp16",
    kv_dtype: str = "fp16",
    utilization: float = 1.0,
    reserved: int = 0,
    group_size: int | None = 128,
) -> int:
    """How many sequences of ``seq_len`` tokens fit in the KV cache next to the weights on one
    GPU of a t-way tensor-parallel group.

    ``gpu``: bytes, a :class:`~parmem.hardware.Hardware` or a preset name (``"h100-sxm"``).
    The KV budget is ⌊memory · ``utilization``⌋ − ``reserved`` − :func:`serving_weight_bytes`;
    the answer is ⌊budget / :func:`kv_cache_bytes` (one sequence)⌋, 0 when the weights alone do
    not fit. ``utilization`` is the fraction of memory the server may use (vLLM's
    ``gpu_memory_utilization``, 0.9 by default there); ``reserved`` is what else you set aside
    (activations of the largest prefill, CUDA context, communication buffers). Every sequence is
    counted at its full length, as a server that reserves whole sequences must; with
    PagedAttention (:func:`simulate_kv_cache`) the average length is what matters.
    """
    _spec(spec)
    seq_len = integer("seq_len", seq_len, 1, MAX_SEQ_LEN)
    utilization = number("utilization", utilization, 0, 1, lo_open=True)
    reserved = integer("reserved", reserved, 0, MAX_MEMORY_BYTES)
    budget = (
        int(device_memory_bytes(gpu) * utilization)
        - reserved
        - serving_weight_bytes(spec, weight_dtype, tp, group_size)
    )
    if budget <= 0:
        return 0
    return budget // kv_cache_bytes(spec, seq_len, 1, kv_dtype, tp)


# ---------------------------------------------------------------------------- PagedAttention
from dataclasses import dataclass  # noqa: E402


@dataclass(frozen=True)
class Request:
    """A generation request: it arrives at step ``arrival`` with ``prompt`` tokens and generates
    ``output`` tokens."""

    arrival: int
    prompt: int
    output: int

    @property
    def length(self) -> int:
        return self.prompt + self.output


def random_requests(
    n: int,
    seed: int = 0,
    prompt: tuple[int, int] = (16, 1024),
    output: tuple[int, int] = (16, 1024),
    rate: float | None = None,
) -> list[Request]:
    """``n`` requests with prompt and output lengths drawn uniformly from the inclusive ranges;
    all arrive at step 0, or, with ``rate``, as a Poisson stream of ``rate`` requests per step
    (exponential gaps, rounded down to whole steps). Deterministic for a given ``seed``."""
    import random

    n = integer("n", n, 0, MAX_REQUESTS)
    seed = integer("seed", seed, 0)
    for name, pair in (("prompt", prompt), ("output", output)):
        if not isinstance(pair, tuple | list) or len(pair) != 2:
            raise ValueError(f"{name}={pair!r:.60} must be a pair (low, high) of token counts")
        lo = integer(f"{name}[0]", pair[0], 1, MAX_SEQ_LEN)
        if integer(f"{name}[1]", pair[1], 1, MAX_SEQ_LEN) < lo:
            raise ValueError(f"{name}={tuple(pair)!r} must satisfy 1 <= low <= high")
    if rate is not None:
        rate = number("rate", rate, 0, lo_open=True)
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        if rate is not None:
            t += rng.expovariate(rate)
        out.append(Request(int(t), rng.randint(*prompt), rng.randint(*output)))
    return out


@dataclass(frozen=True)
class KVCacheSim:
    """The result of :func:`simulate_kv_cache`. Per step: ``stored`` tokens whose keys and values
    are in the cache, ``allocated`` token slots set aside for the running requests, ``running``
    requests. ``capacity`` is in tokens."""

    policy: str
    capacity: int
    stored: tuple[int, ...]
    allocated: tuple[int, ...]
    running: tuple[int, ...]
    generated: int
    preemptions: int

    @property
    def steps(self) -> int:
        return len(self.stored)

    @property
    def utilization(self) -> float:
        """Σ stored / Σ allocated: the share of set-aside KV memory that holds a token."""
        total = sum(self.allocated)
        return sum(self.stored) / total if total else 1.0

    @property
    def waste(self) -> float:
        """1 − :attr:`utilization`."""
        return 1.0 - self.utilization

    @property
    def mean_running(self) -> float:
        return sum(self.running) / self.steps if self.steps else 0.0

    @property
    def peak_running(self) -> int:
        return max(self.running, default=0)

    @property
    def throughput(self) -> float:
        """Generated tokens per step."""
        return self.generated / self.steps if self.steps else 0.0


def simulate_kv_cache(
    requests, capacity: int, policy: str = "paged", block_size: int = 16, max_len: int = 2048
) -> KVCacheSim:
    """Serve ``requests`` (:class:`Request`) with a KV cache of ``capacity`` tokens, one decoding
    step at a time, and count how much of the cache holds real tokens.

    Each step every running request adds one token: in the step it is admitted (its prefill) it
    holds ``prompt + 1`` tokens, ``k`` steps later ``prompt + 1 + k``; after ``output`` steps it
    holds ``prompt + output`` and leaves, freeing its memory. Running requests go first; then
    waiting requests that have arrived are admitted in arrival order while they fit (the first
    that does not fit blocks the ones behind it).

    * ``policy="contiguous"``: each request is given ``max_len`` contiguous slots when admitted,
      the pre-allocation to the maximum length that Kwon et al. 2023 (§3, Fig. 3) measure in
      earlier systems: the slots for tokens not generated yet are reserved, and those beyond the
      request's final length never hold anything (internal fragmentation).
    * ``policy="paged"``: PagedAttention (Kwon et al. 2023, §4): the cache is split into blocks of
      ``block_size`` tokens and a request holds ⌈tokens / block_size⌉ blocks, taking a new block
      only when its last one is full, so at most ``block_size − 1`` slots per request are empty.
      When a running request needs a block and none is free, the most recently admitted request
      is preempted (its blocks freed; it waits at the head of the queue and later resumes with the
      tokens it had, as vLLM's recomputation does; the recomputation time is not modelled).

    Returns a :class:`KVCacheSim`.
    """
    choice("policy", policy, ("paged", "contiguous"))
    capacity = integer("capacity", capacity, 1, MAX_SIM_TOKENS)
    block_size = integer("block_size", block_size, 1, MAX_SIM_TOKENS)
    max_len = integer("max_len", max_len, 1, MAX_SIM_TOKENS)
    reqs = _requests(requests)
    server = _Server(
        reqs,
        capacity,
        block_size if policy == "paged" else max_len,
        policy == "contiguous",
        max_len,
    )
    stored, allocated, n_running = [], [], []
    step = 0
    while server.waiting or server.running:
        server.grow()
        server.admit(step)
        stored.append(sum(r.prompt + k for r, k in server.running))
        allocated.append(server.used)
        n_running.append(len(server.running))
        server.generated += len(server.running)
        server.retire()
        step += 1
    return KVCacheSim(
        policy,
        capacity,
        tuple(stored),
        tuple(allocated),
        tuple(n_running),
        server.generated,
        server.preemptions,
    )


def _requests(requests: object) -> list[Request]:
    """``requests`` checked (:class:`Request` objects of integer fields, at most
    :data:`MAX_REQUESTS`, whose simulation takes at most :data:`MAX_SIM_STEPS` steps), sorted by
    arrival."""
    if isinstance(requests, str | bytes) or not hasattr(requests, "__iter__"):
        raise ValueError(f"requests={requests!r:.60} must be a list of Request")
    reqs = list(requests)
    integer("len(requests)", len(reqs), 0, MAX_REQUESTS)
    for i, r in enumerate(reqs):
        instance(f"requests[{i}]", r, Request, "Request(arrival, prompt, output)")
        integer(f"requests[{i}].arrival", r.arrival, 0, MAX_SIM_STEPS)
        integer(f"requests[{i}].prompt", r.prompt, 1, MAX_SEQ_LEN)
        integer(f"requests[{i}].output", r.output, 1, MAX_SEQ_LEN)
    # each step generates a token of a running request, or waits for the next arrival
    steps = max((r.arrival for r in reqs), default=0) + sum(r.output for r in reqs)
    if steps > MAX_SIM_STEPS:
        raise ValueError(
            f"requests: the simulation would take up to {steps} steps (latest arrival + every "
            f"output token); at most {MAX_SIM_STEPS} are simulated"
        )
    return sorted(reqs, key=lambda r: r.arrival)


class _Server:
    """The state of :func:`simulate_kv_cache`: requests waiting and running (each
    ``[request, tokens generated so far]``, running in admission order) and the slots used."""

    def __init__(
        self, reqs: list[Request], capacity: int, unit: int, contiguous: bool, max_len: int
    ):
        for r in reqs:
            if r.prompt < 1 or r.output < 1 or r.arrival < 0:
                raise ValueError(f"{r}: prompt and output must be >= 1 and arrival >= 0")
            if contiguous and r.length > max_len:
                raise ValueError(f"{r}: prompt + output = {r.length} exceeds max_len={max_len}")
        self.unit, self.contiguous, self.max_len = unit, contiguous, max_len
        self.slots = capacity // unit * unit  # whole blocks (or whole max_len reservations)
        if contiguous and self.slots < max_len:
            raise ValueError(f"capacity={capacity} holds no request of max_len={max_len}")
        if not contiguous and reqs and self.need(max(r.length for r in reqs)) > self.slots:
            raise ValueError(f"capacity={capacity} cannot hold the longest request alone")
        self.waiting: list[list] = [[r, 0] for r in reqs]
        self.running: list[list] = []
        self.used = self.generated = self.preemptions = 0

    def need(self, tokens: int) -> int:
        """Slots a request holding ``tokens`` tokens occupies."""
        return self.max_len if self.contiguous else -(-tokens // self.unit) * self.unit

    def _preempt(self, index: int) -> None:
        victim = self.running.pop(index)
        self.used -= self.need(victim[0].prompt + victim[1])
        self.waiting.insert(0, victim)
        self.preemptions += 1

    def grow(self) -> None:
        """Every running request adds one token (oldest first), preempting the newest when a
        request needs a block and none is free; the newest itself goes back to waiting."""
        i = 0
        while i < len(self.running):
            r, k = self.running[i]
            grow = self.need(r.prompt + k + 1) - self.need(r.prompt + k)
            while grow > self.slots - self.used and self.running[-1] is not self.running[i]:
                self._preempt(-1)
            if grow > self.slots - self.used:
                self._preempt(i)
                continue
            self.used += grow
            self.running[i][1] += 1
            i += 1

    def admit(self, step: int) -> None:
        """Admit arrived requests in arrival order while they fit (its prefill: prompt + 1)."""
        while self.waiting and self.waiting[0][0].arrival <= step:
            r, k = self.waiting[0]
            cost = self.need(r.prompt + k + 1)
            if cost > self.slots - self.used:
                break
            self.waiting.pop(0)
            self.used += cost
            self.running.append([r, k + 1])

    def retire(self) -> None:
        """Finished requests leave and free their slots."""
        for r, k in self.running:
            if k >= r.output:
                self.used -= self.need(r.prompt + k)
        self.running = [e for e in self.running if e[1] < e[0].output]


# ---------------------------------------------------------------------------- parallel layouts
def serving_layout(
    spec: ModelSpec,
    gpu="h100-sxm",
    *,
    tp: int = 1,
    pp: int = 1,
    ep: int = 1,
    cp: int = 1,
    dp: int = 1,
    weight_dtype: str = "fp16",
    kv_dtype: str = "fp16",
    utilization: float = 0.9,
    reserved: int = 0,
) -> dict:
    """Per-GPU weights and KV cache of a serving layout of ``tp·pp·ep·cp·dp`` GPUs, and how many
    tokens of KV cache all of them hold together.

    What each axis does when nothing is trained (no gradients, optimizer states or activation
    stash): ``tp`` splits every weight and the kv heads (Shoeybi et al. 2019 §3; one head,
    duplicated, when t > kv_heads); ``pp`` gives each stage L/p layers (even split, the embedding
    on the first stage and the LM head on the last) and the KV cache of those layers only;
    ``ep`` shards the experts of a mixture-of-experts model over e ranks whose attention runs
    data-parallel, each on its own sequences with every kv head (the dense part replicated);
    ``cp`` splits every sequence's tokens over cp ranks (ring attention, Liu et al. 2023), so each
    keeps 1/cp of the sequence's cache; ``dp`` adds replicas. The KV budget of a GPU is
    ⌊memory · ``utilization``⌋ − ``reserved`` − its weights; a pipeline holds as many tokens as its
    tightest stage allows.

    Returns ``gpus``; ``weights`` (bytes on the busiest GPU); ``kv_per_token`` (bytes one GPU
    keeps for each token it stores); ``kv_tokens`` (tokens of cache the whole layout holds, 0 if
    the weights alone do not fit). Quantised weights (int8/int4) are supported for ``pp = ep =
    1`` (:func:`weight_bytes`).
    """
    _spec(spec)
    dp, cp = integer("dp", dp, 1, MAX_GPUS), integer("cp", cp, 1, MAX_GPUS)
    choice("weight_dtype", weight_dtype, WEIGHT_DTYPES)
    choice("kv_dtype", kv_dtype, KV_DTYPES)
    utilization = number("utilization", utilization, 0, 1, lo_open=True)
    reserved = integer("reserved", reserved, 0, MAX_MEMORY_BYTES)
    tp, ep = integer("tp", tp), integer("ep", ep)
    check_tp(spec, tp, ep)
    bits = WEIGHT_DTYPES[weight_dtype]
    if bits < 16 and (pp > 1 or ep > 1):
        raise ValueError(f"weight_dtype={weight_dtype!r} is supported with pp = ep = 1 only")
    budget = int(device_memory_bytes(gpu) * utilization) - reserved
    pp = integer("pp", pp, 1, MAX_GPUS)
    if pp > spec.layers:
        raise ValueError(f"pp={pp} must be at most layers={spec.layers}")
    split = even_split(spec.layers, pp)
    stages = []
    for i, n in enumerate(split):
        if pp == ep == 1:  # one home for a whole copy's bytes, quantised or not
            w = weight_bytes(spec, weight_dtype, tp=tp)
        else:
            start = sum(split[:i])
            w = sum(stage_params(spec, tp, ep, n, i == 0, i == pp - 1, start=start, mtp=False))
            w = w * bits // 8
        kv = n * layer_kv_values(spec, tp) * KV_DTYPES[kv_dtype]
        stages.append((w, kv))
    tokens = min(max(budget - w, 0) // kv for w, kv in stages)
    return {
        "gpus": tp * pp * ep * cp * dp,
        "weights": max(w for w, _ in stages),
        "kv_per_token": max(kv for _, kv in stages),
        "kv_tokens": tokens * cp * ep * dp,
    }


def decode_step_comm(
    spec: ModelSpec, gpus: int, batch: int = 1, scheme: str = "tp", link: str = "nvlink4"
) -> dict:
    """Bytes each GPU sends, and their alpha-beta time on ``link``, for one decode step of
    ``batch`` sequences (one new token each) on ``gpus`` GPUs, 16-bit weights and activations.

    * ``"tp"``: two all-reduces of the ``batch × h`` hidden states per layer (after attention and
      after the MLP; Shoeybi et al. 2019 §3);
    * ``"pp"``: one ``batch × h`` tensor to the next stage;
    * ``"zero3"``: ZeRO-3/FSDP-style serving, each GPU holding 1/n of the weights and gathering
      every layer (and the embedding and LM head) before using it: an all-gather of all the
      weights per step (Rajbhandari et al. 2020 §5.3, as FSDP runs the forward pass).
    """
    _spec(spec)
    gpus = integer("gpus", gpus, 1, MAX_GPUS)
    batch = integer("batch", batch, 1, MAX_BATCH)
    choice("scheme", scheme, ("tp", "pp", "zero3"))
    if gpus == 1:
        return {"bytes": 0, "seconds": 0.0}
    act = 2 * batch * spec.hidden
    if scheme == "tp":
        ops = [("all_reduce", act)] * (2 * spec.layers)
    elif scheme == "pp":
        ops = [("send_recv", act)]
    else:
        ops = [
            ("all_gather", 2 * sum(layer_params(spec, moe=spec.is_moe_layer(i))))
            for i in range(spec.layers)
        ]
        rest = sum(
            local_numel(spec, x)
            for x in model_tensors(spec)
            if x.place != "layer" and not x.component.startswith("mtp")
        )
        ops.append(("all_gather", 2 * rest))
    return {
        "bytes": sum(collective_bytes(op, size, gpus) for op, size in ops),
        "seconds": sum(collective_time(op, size, gpus, link) for op, size in ops),
    }


def prefill_workspace_bytes(
    spec: ModelSpec, tokens: int, tp: int = 1, sequences: int = 1, act_bytes: int = 2
) -> int:
    """Transient activation bytes of one forward pass over ``tokens`` tokens without autograd: what
    a server must keep free beside the weights and the KV cache.

    Inference frees each layer's intermediates when the next layer starts, so the peak is one
    layer's: the residual stream and its normalised copy (2·T·h), plus the larger of the
    attention block (Q, K, V and the attention output, T·(2·q_dim + 2·kv_dim)/t) and the MLP
    (gate/up and their product, 3·T·f/t for a gated MLP, 2·T·f/t otherwise), at ``act_bytes``
    each; a mixture of experts runs vLLM's fused MoE, whose three caches hold every routed copy,
    T·k·(3·f_e/t + h) (``fused_moe/fused_moe.py: intermediate_cache1..3``); plus the fp32 logits
    of the last token of each of ``sequences`` sequences (4·V each; 0 sequences: none).
    FlashAttention is assumed (no s×s scores). vLLM measures this instead, with a profiling
    forward pass over ``max_num_batched_tokens`` dummy tokens before sizing the cache
    (``Worker.determine_available_memory``; :func:`parmem.serving.profile_peak_bytes` adds its
    sampler warm-up); kernel workspaces are not included.
    """
    _spec(spec)
    tokens = integer("tokens", tokens, 1, MAX_SEQ_LEN)
    sequences = integer("sequences", sequences, 0, MAX_BATCH)
    act_bytes = integer("act_bytes", act_bytes, 1, 8)
    tp = integer("tp", tp)
    check_tp(spec, tp)
    attn = tokens * (2 * spec.q_dim + 2 * spec.kv_dim) // tp
    gated = 3 if spec.ffn_kind == "swiglu" else 2
    mlp = tokens * gated * spec.ffn_hidden // tp
    if spec.num_experts:
        mlp = max(mlp, tokens * spec.top_k * (3 * spec.expert_ffn_hidden // tp + spec.hidden))
    return act_bytes * (2 * tokens * spec.hidden + max(attn, mlp)) + 4 * sequences * spec.vocab_size
