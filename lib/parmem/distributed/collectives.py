"""Collectives, and the bytes each rank sends for them, counted on real sends.

gloo and NCCL do not report how many bytes a collective moved. So this module implements each
collective the textbook way, with point-to-point ``send``/``recv`` between ranks, counts the bytes
of every tensor a rank hands to ``send``, and checks that the result equals the library's own
collective (``dist.all_reduce`` and friends). The counts are therefore *measured on the algorithm
run here*, and they equal the bandwidth-optimal bounds (Patarasuk & Yuan 2009; Thakur, Rabenseifner
& Gropp 2005) that :mod:`parmem.comm` uses. A message of S bytes on n ranks:

==================  =====================  =================================================
collective          bytes sent per rank    algorithm here
==================  =====================  =================================================
all-reduce          2(n-1)/n · S           ring: reduce-scatter, then all-gather
reduce-scatter      (n-1)/n · S            ring, S = the full (input) tensor
all-gather          (n-1)/n · S            ring, S = the full (output) tensor
all-to-all          (n-1)/n · S            pairwise exchange, S = one rank's input
broadcast           S (root and relays),   chain (pipeline) from the root; the last rank
                    0 (last rank)          sends nothing; n-1 sends of S in total
==================  =====================  =================================================

What gloo itself does can differ (it picks ring, halving-doubling or bcube by size); NCCL uses
rings and trees. The bound for all-reduce is the same for ring and for Rabenseifner's algorithm,
which is why it is the number to plan with; a tree all-reduce sends more per rank.
"""

from __future__ import annotations

from parmem.distributed.launcher import device, rank, world_size

__all__ = [
    "all_gather_tensor",
    "reduce_scatter_tensor",
    "ring_all_reduce",
    "ring_reduce_scatter",
    "ring_all_gather",
    "pairwise_all_to_all",
    "chain_broadcast",
    "demo",
    "expected_bytes",
    "demo_send_recv",
]


def all_gather_tensor(out, x, group=None):
    """``out`` = concatenation of every rank's ``x`` (``all_gather_single``, torch >= 2.10,
    else ``all_gather_into_tensor``)."""
    import torch.distributed as dist

    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(out, x, group=group)


def reduce_scatter_tensor(out, x, group=None):
    """``out`` = this rank's chunk of the sum of every rank's ``x`` (``reduce_scatter_single``
    where it exists, else ``reduce_scatter_tensor``)."""
    import torch.distributed as dist

    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return fn(out, x, group=group)


class _Counter:
    """Bytes handed to ``send`` by this rank."""

    def __init__(self):
        self.bytes = 0

    def exchange(self, send_t, dst: int, recv_t, src: int) -> None:
        import torch.distributed as dist

        ops = [
            dist.P2POp(dist.isend, send_t.contiguous(), dst),
            dist.P2POp(dist.irecv, recv_t, src),
        ]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        self.bytes += send_t.numel() * send_t.element_size()


def _check_divisible(numel: int, n: int) -> None:
    if numel % n:
        raise ValueError(f"numel={numel} must be divisible by world size={n} for the ring")


def ring_reduce_scatter(x, counter: _Counter | None = None):
    """Sum ``x`` over ranks; return this rank's 1/n chunk (chunk ``rank``). n-1 ring steps."""
    counter = counter or _Counter()
    n, r = world_size(), rank()
    _check_divisible(x.numel(), n)
    chunks = [c.clone() for c in x.reshape(n, -1)]
    buf = chunks[0].clone()
    for step in range(n - 1):
        send_i = (r - step - 1) % n  # the partial sum this rank forwards
        recv_i = (r - step - 2) % n
        counter.exchange(chunks[send_i], (r + 1) % n, buf, (r - 1) % n)
        chunks[recv_i] += buf
    return chunks[r].reshape(-1)


def ring_all_gather(chunk, counter: _Counter | None = None):
    """Concatenate every rank's ``chunk`` in rank order. n-1 ring steps."""
    import torch

    counter = counter or _Counter()
    n, r = world_size(), rank()
    out = [torch.empty_like(chunk) for _ in range(n)]
    out[r] = chunk.clone()
    for step in range(n - 1):
        send_i, recv_i = (r - step) % n, (r - step - 1) % n
        counter.exchange(out[send_i], (r + 1) % n, out[recv_i], (r - 1) % n)
    return torch.cat(out)


def ring_all_reduce(x, counter: _Counter | None = None):
    """Ring all-reduce (sum) = ring reduce-scatter + ring all-gather: 2(n-1) steps of S/n."""
    counter = counter or _Counter()
    return ring_all_gather(ring_reduce_scatter(x, counter), counter).reshape(x.shape)


def pairwise_all_to_all(x, counter: _Counter | None = None):
    """Chunk j of rank i goes to rank j (equal splits); n-1 pairwise exchange steps."""
    import torch

    counter = counter or _Counter()
    n, r = world_size(), rank()
    _check_divisible(x.numel(), n)
    chunks = list(x.reshape(n, -1))
    out = [torch.empty_like(chunks[0]) for _ in range(n)]
    out[r] = chunks[r].clone()
    for step in range(1, n):
        dst, src = (r + step) % n, (r - step) % n
        counter.exchange(chunks[dst], dst, out[src], src)
    return torch.cat(out).reshape(x.shape)


def chain_broadcast(x, src: int = 0, counter: _Counter | None = None):
    """Pipeline broadcast along the chain src -> src+1 -> ... ; every rank but the last sends x."""
    import torch.distributed as dist

    counter = counter or _Counter()
    n, r = world_size(), rank()
    pos = (r - src) % n
    out = x.clone()
    if pos > 0:
        dist.recv(out, (r - 1) % n)
    if pos < n - 1:
        dist.send(out, (r + 1) % n)
        counter.bytes += out.numel() * out.element_size()
    return out


def expected_bytes(collective: str, size_bytes: int, n: int, pos: int = 0) -> int:
    """Bytes one rank sends in this module's algorithms (``pos``: chain position, broadcast)."""
    if collective == "all_reduce":
        return 2 * (n - 1) * size_bytes // n
    if collective in ("reduce_scatter", "all_gather", "all_to_all"):
        return (n - 1) * size_bytes // n
    if collective == "broadcast":
        return size_bytes if pos < n - 1 else 0
    raise ValueError(
        f"collective={collective!r} is not one of all_reduce, reduce_scatter, "
        "all_gather, all_to_all, broadcast"
    )


def demo(numel: int = 3840, dtype: str = "float32") -> dict:
    """Run every collective both ways (counted ring vs. the backend's own); per-rank bytes.

    Inputs are small integers, so float sums are exact in any order and ``equal`` is exact
    equality, not a tolerance. Returns ``{collective: {"bytes_sent", "size_bytes", "equal"}}``,
    and ``rs_then_ag``: ``{"size_bytes", "equal"}``, whether the backend's own reduce-scatter
    followed by its own all-gather returns exactly its all-reduce (nothing is counted there).
    """
    import torch
    import torch.distributed as dist

    n, r, dev = world_size(), rank(), device()
    if numel < 1 or numel % n:
        raise ValueError(f"numel={numel} must be a positive multiple of world size={n}")
    dt = getattr(torch, dtype, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"dtype={dtype!r} is not a torch dtype name")
    g = torch.Generator().manual_seed(1234 + r)
    x = torch.randint(-8, 8, (numel,), generator=g).to(dev, dt)
    esz = x.element_size()
    out: dict = {}

    def record(name, counter, mine, ref, size):
        out[name] = {
            "bytes_sent": counter.bytes,
            "size_bytes": size,
            "equal": bool(torch.equal(mine, ref)),
        }

    c = _Counter()
    ref = x.clone()
    dist.all_reduce(ref)
    record("all_reduce", c, ring_all_reduce(x, c), ref, numel * esz)

    c = _Counter()
    ref = torch.empty(numel // n, dtype=dt, device=dev)
    reduce_scatter_tensor(ref, x)
    record("reduce_scatter", c, ring_reduce_scatter(x, c), ref, numel * esz)

    c = _Counter()
    part = x[: numel // n]
    ref = torch.empty(numel, dtype=dt, device=dev)
    all_gather_tensor(ref, part)
    record("all_gather", c, ring_all_gather(part, c), ref, numel * esz)

    # the decomposition with the backend's own collectives: reduce-scatter, then all-gather
    ar = x.clone()
    dist.all_reduce(ar)
    mine = torch.empty(numel // n, dtype=dt, device=dev)
    reduce_scatter_tensor(mine, x)
    both = torch.empty(numel, dtype=dt, device=dev)
    all_gather_tensor(both, mine)
    out["rs_then_ag"] = {"size_bytes": numel * esz, "equal": bool(torch.equal(both, ar))}

    c = _Counter()
    ref = torch.empty_like(x)
    dist.all_to_all_single(ref, x)
    record("all_to_all", c, pairwise_all_to_all(x, c), ref, numel * esz)

    c = _Counter()
    ref = x.clone()
    dist.broadcast(ref, 0)
    record("broadcast", c, chain_broadcast(x, 0, c), ref, numel * esz)
    return out


def demo_send_recv(numel: int = 3840, dtype: str = "float32") -> dict:
    """Point-to-point, as between pipeline stages: rank i sends a tensor of ``numel`` values to
    rank i + 1 (the last rank sends nothing) with ``dist.send``/``dist.recv``.

    Every rank can rebuild the tensor its predecessor sent (it is drawn from that rank's seed), so
    ``received_ok`` checks the transfer exactly. Returns ``bytes_sent`` (S on every rank but the
    last, 0 there: :func:`parmem.comm.send_recv_bytes`), ``bytes_received`` and ``size_bytes``.
    """
    import torch
    import torch.distributed as dist

    n, r, dev = world_size(), rank(), device()
    if numel < 1:
        raise ValueError(f"numel={numel} must be >= 1")
    dt = getattr(torch, dtype, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"dtype={dtype!r} is not a torch dtype name")

    def payload(of_rank: int):
        g = torch.Generator().manual_seed(4321 + of_rank)
        return torch.randint(-8, 8, (numel,), generator=g).to(dev, dt)

    sent = received = 0
    ok = True
    if r > 0:
        buf = torch.empty(numel, dtype=dt, device=dev)
        dist.recv(buf, r - 1)
        received = buf.numel() * buf.element_size()
        ok = bool(torch.equal(buf, payload(r - 1)))
    if r < n - 1:
        x = payload(r)
        dist.send(x, r + 1)
        sent = x.numel() * x.element_size()
    size = numel * torch.empty((), dtype=dt).element_size()
    return {"bytes_sent": sent, "bytes_received": received, "size_bytes": size, "received_ok": ok}
