"""PyTorch's CUDA caching allocator, simulated on the CPU: reserved versus allocated bytes.

``torch.cuda.memory_allocated()`` counts the blocks handed to live tensors;
``torch.cuda.memory_reserved()`` counts the segments the allocator obtained from CUDA. The gap
between them (rounding, unsplit blocks, cached free blocks, fragments too small or in the wrong
place for the next request) is memory that ``nvidia-smi`` shows as used but no tensor holds.
:class:`CachingAllocator` applies the allocator's documented rules to a sequence of allocations and
frees, so the gap can be computed for any list of tensor sizes, on a machine without a GPU.

Source: PyTorch ``c10/cuda/CUDACachingAllocator.cpp`` (``DeviceCachingAllocator``: ``malloc``,
``round_size``, ``get_pool``, ``get_allocation_size``, ``get_free_block``, ``should_split``,
``alloc_found_block``, ``free_block``/``try_merge_blocks``, ``release_cached_blocks`` and the
``ExpandableSegment`` note), read from a recent copy of the main branch; recent versions define the
constants in ``c10/core/AllocatorConfig.h``, older ones in the .cpp file, with the same values:

=================  ===========  ===============================================================
constant           bytes        meaning
=================  ===========  ===============================================================
kMinBlockSize      512          every request is rounded up to a multiple of 512 bytes
kSmallSize         1 MiB        the largest request served from the small pool
kSmallBuffer       2 MiB        segment size of the small pool (and its expandable page)
kLargeBuffer       20 MiB       segment size for large requests under 10 MiB (and the large
                                pool's expandable page, ``large_segment_size``)
kMinLargeAlloc     10 MiB       from here a request gets a segment of its own size ...
kRoundLarge        2 MiB        ... rounded up to a multiple of 2 MiB
=================  ===========  ===============================================================

The rules, as the simulator applies them (one device, one stream, default settings):

1. **Round.** A request of n bytes becomes ``max(512, ceil(n / 512) · 512)`` bytes
   (``round_size``; ``roundup_power2_divisions`` is off by default).
2. **Pool.** Rounded sizes up to 1 MiB use the small pool, larger ones the large pool
   (``get_pool``).
3. **Best fit.** The smallest cached free block of that pool that is large enough is reused;
   ties go to the lower address (``get_free_block`` with ``max_split_size`` unlimited, the
   default).
4. **New segment.** Otherwise the allocator calls ``cudaMalloc`` for a segment of
   ``get_allocation_size`` bytes: 2 MiB for a small request, 20 MiB for a large request under
   10 MiB, else the request rounded up to 2 MiB.
5. **Split.** The block is split when the remainder is at least 512 bytes (small pool) or more
   than 1 MiB (large pool, ``should_split``); otherwise the whole block is handed out and
   counted in ``allocated`` - a 19.5 MiB request takes all of its 20 MiB segment.
6. **Free.** A freed block returns to its pool and merges with free neighbours of its segment.
   Segments are not given back to CUDA: ``reserved`` does not drop until :meth:`empty_cache`, or
   until a new segment would exceed ``capacity``; then every segment that is entirely free is
   released and the allocation retried once (``release_cached_blocks``). If it still does not fit,
   the allocation fails: :class:`OutOfMemory`, PyTorch's "CUDA out of memory ... reserved by
   PyTorch but unallocated".
7. **Expandable segments** (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``): each pool has
   one segment of virtual addresses that grows by mapping physical pages (2 MiB in the small
   pool, 20 MiB in the large pool) at the lowest free address, so a request that does not fit in
   a cached block extends the segment instead of opening a new one; a block is split whenever the
   remainder is at least 512 bytes. Releasing unmaps the pages no live block touches.

Not modelled: several streams (blocks are per stream), ``record_stream`` and events,
``max_split_size_mb``, ``roundup_power2_divisions``, garbage collection thresholds, CUDA graph
pools, and memory outside the allocator (CUDA context, NCCL's own buffers, cuBLAS workspaces
allocated before the caching allocator sees them).

:func:`replay` runs a list of events (``("alloc", key, nbytes)`` / ``("free", key)``), such as
the ones :mod:`parmem.traces` records from a real PyTorch run or builds for a training step from
the estimator's terms.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ._check import integer
from .units import MIB

__all__ = [
    "K_MIN_BLOCK_SIZE",
    "K_SMALL_SIZE",
    "K_SMALL_BUFFER",
    "K_LARGE_BUFFER",
    "K_MIN_LARGE_ALLOC",
    "K_ROUND_LARGE",
    "round_size",
    "pool_of",
    "segment_size",
    "CachingAllocator",
    "OutOfMemory",
    "ReplayResult",
    "replay",
    "min_capacity",
]

K_MIN_BLOCK_SIZE = 512  # all sizes are rounded to at least 512 bytes
K_SMALL_SIZE = 1 * MIB  # largest "small" allocation
K_SMALL_BUFFER = 2 * MIB  # small allocations are packed in 2 MiB segments
K_LARGE_BUFFER = 20 * MIB  # large allocations under 10 MiB are packed in 20 MiB segments
K_MIN_LARGE_ALLOC = 10 * MIB  # from here a request gets a segment of its own
K_ROUND_LARGE = 2 * MIB  # which is rounded up to 2 MiB

_VA_SIZE = 5 * 2**48  # virtual addresses of one expandable segment: never exhausted,
# a multiple of both page sizes so pages stay aligned


def _check_bytes(name: str, n: object) -> None:
    integer(name, n, 0)


def _ceil(n: int, unit: int) -> int:
    return -(-n // unit) * unit


def round_size(nbytes: int) -> int:
    """The block size a request of ``nbytes`` is served with: a multiple of 512, at least 512
    (``round_size`` in CUDACachingAllocator.cpp)."""
    _check_bytes("nbytes", nbytes)
    return K_MIN_BLOCK_SIZE if nbytes < K_MIN_BLOCK_SIZE else _ceil(nbytes, K_MIN_BLOCK_SIZE)


def pool_of(nbytes: int) -> str:
    """``"small"`` if the rounded request is at most 1 MiB, else ``"large"`` (``get_pool``)."""
    return "small" if round_size(nbytes) <= K_SMALL_SIZE else "large"


def segment_size(nbytes: int) -> int:
    """Bytes of the segment ``cudaMalloc`` is asked for when no cached block fits a request of
    ``nbytes`` (``get_allocation_size`` of the rounded size): 2 MiB for a small request,
    20 MiB for a large one under 10 MiB, else the rounded request rounded up to 2 MiB."""
    size = round_size(nbytes)
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return _ceil(size, K_ROUND_LARGE)


class OutOfMemory(RuntimeError):
    """An allocation that the simulated GPU cannot serve, even after releasing cached segments.

    Carries ``nbytes`` (the request), ``allocated`` and ``reserved`` at the moment of failure and
    ``capacity``, like PyTorch's ``torch.OutOfMemoryError`` message."""

    def __init__(self, nbytes: int, allocated: int, reserved: int, capacity: int | None):
        self.nbytes, self.allocated, self.reserved, self.capacity = (
            nbytes,
            allocated,
            reserved,
            capacity,
        )
        cap = "unlimited" if capacity is None else f"{capacity:,}"
        super().__init__(
            f"out of memory: tried to allocate {nbytes:,} bytes; capacity {cap}, "
            f"allocated {allocated:,}, reserved but unallocated {reserved - allocated:,}"
        )


@dataclass(eq=False)
class _Block:
    pool: str
    segment: int
    addr: int
    size: int
    allocated: bool = False
    mapped: bool = True
    requested: int = 0
    prev: _Block | None = None
    next: _Block | None = None

    @property
    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None


class CachingAllocator:
    """The caching allocator of one CUDA device and one stream, in pure Python.

    ``expandable_segments`` switches rule 7 on (module docstring). ``capacity`` is the memory the
    allocator may reserve (the GPU's memory minus what lives outside the allocator, such as the
    CUDA context); ``None`` means unlimited. :meth:`malloc` returns a handle for :meth:`free`.

    Counters follow ``torch.cuda.memory_stats()``: ``allocated`` (``allocated_bytes.all``: the
    sizes of blocks in use, after rounding and unsplit remainders), ``requested``
    (``requested_bytes.all``: the bytes asked for), ``reserved`` (``reserved_bytes.all``: segments,
    or mapped pages of expandable segments), each with its ``peak_*``; ``segments``,
    ``num_device_alloc`` (cudaMalloc or page-mapping calls), ``num_alloc_retries`` and
    ``num_ooms``.

    Example (rules 4 and 5; see ``tests/test_allocator.py`` for more, derived by hand)::

        >>> a = CachingAllocator()
        >>> h = a.malloc(3 * 2**20)          # 3 MiB: a 20 MiB segment, split
        >>> a.allocated, a.reserved
        (3145728, 20971520)
        >>> a.free(h); a.allocated, a.reserved
        (0, 20971520)
    """

    def __init__(self, expandable_segments: bool = False, capacity: int | None = None):
        if capacity is not None:
            _check_bytes("capacity", capacity)
        self.expandable_segments = bool(expandable_segments)
        self.capacity = capacity
        self._free: dict[str, list[tuple[int, int]]] = {"small": [], "large": []}
        self._by_addr: dict[int, _Block] = {}  # free mapped blocks, by address
        self._live: dict[int, _Block] = {}  # allocated blocks, by handle
        self._handles = itertools.count(1)
        self._next_addr = 0
        self._segments: dict[int, tuple[str, int]] = {}  # id -> (pool, size) (classic segments)
        self._segment_ids = itertools.count()
        self._expandable: dict[str, _Block] = {}  # pool -> first block of its VA range
        self.allocated = self.requested = self.reserved = 0
        self.peak_allocated = self.peak_requested = self.peak_reserved = 0
        self.num_device_alloc = self.num_alloc_retries = self.num_ooms = 0

    # ------------------------------------------------------------------ public API
    @property
    def segments(self) -> int:
        """Live segments (classic) or contiguous mapped ranges (expandable)."""
        if not self.expandable_segments:
            return len(self._segments)
        n = 0
        for head in self._expandable.values():
            b: _Block | None = head
            prev_mapped = False
            while b is not None:
                if b.mapped and not prev_mapped:
                    n += 1
                prev_mapped = b.mapped
                b = b.next
        return n

    @property
    def inactive_split(self) -> int:
        """Bytes of free blocks inside partly used segments (``inactive_split_bytes.all``):
        memory that only a request of the right size can use."""
        return sum(b.size for b in self._by_addr.values() if b.is_split and b.mapped)

    def malloc(self, nbytes: int) -> int:
        """Serve a request of ``nbytes`` bytes; returns a handle. Raises :class:`OutOfMemory`."""
        _check_bytes("nbytes", nbytes)
        size = round_size(nbytes)
        pool = "small" if size <= K_SMALL_SIZE else "large"
        block = self._take_free(pool, size)
        if block is None:
            block = self._new_block(pool, size)
            if block is None:
                self.num_alloc_retries += 1
                self.empty_cache()
                block = self._new_block(pool, size)
            if block is None:
                self.num_ooms += 1
                raise OutOfMemory(nbytes, self.allocated, self.reserved, self.capacity)
        remaining = block.size - size
        if pool == "small" or self.expandable_segments:
            split = remaining >= K_MIN_BLOCK_SIZE
        else:
            split = remaining > K_SMALL_SIZE
        if split:
            rest = _Block(
                pool, block.segment, block.addr + size, remaining, prev=block, next=block.next
            )
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            self._insert_free(rest)
        block.allocated, block.requested = True, nbytes
        handle = next(self._handles)
        self._live[handle] = block
        self.allocated += block.size
        self.requested += nbytes
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_requested = max(self.peak_requested, self.requested)
        return handle

    def free(self, handle: int) -> None:
        """Return a block to its pool (rule 6)."""
        if handle not in self._live:
            raise ValueError(f"handle={handle!r} is not a live allocation")
        block = self._live.pop(handle)
        block.allocated = False
        self.allocated -= block.size
        self.requested -= block.requested
        block.requested = 0
        for other in (block.prev, block.next):
            self._try_merge(block, other)
        self._insert_free(block)

    def empty_cache(self) -> None:
        """Give every fully free segment (or, expandable, every page no live block touches) back
        to CUDA, as ``torch.cuda.empty_cache()`` and the out-of-memory retry do."""
        if not self.expandable_segments:
            for b in [b for b in self._by_addr.values() if not b.is_split]:
                self._remove_free(b)
                del self._segments[b.segment]
                self.reserved -= b.size
            return
        page = {"small": K_SMALL_BUFFER, "large": K_LARGE_BUFFER}
        for b in [b for b in self._by_addr.values() if b.mapped]:
            unit = page[b.pool]
            lo, hi = _ceil(b.addr, unit), (b.addr + b.size) // unit * unit
            if hi <= lo:
                continue
            self._remove_free(b)
            pieces = [
                (b.addr, lo - b.addr, True),
                (lo, hi - lo, False),
                (hi, b.addr + b.size - hi, True),
            ]
            self._replace(b, [p for p in pieces if p[1] > 0])
            self.reserved -= hi - lo

    def memory_stats(self) -> dict[str, int]:
        """The counters under the names ``torch.cuda.memory_stats()`` uses."""
        return {
            "allocated_bytes.all.current": self.allocated,
            "allocated_bytes.all.peak": self.peak_allocated,
            "requested_bytes.all.current": self.requested,
            "requested_bytes.all.peak": self.peak_requested,
            "reserved_bytes.all.current": self.reserved,
            "reserved_bytes.all.peak": self.peak_reserved,
            "inactive_split_bytes.all.current": self.inactive_split,
            "segment.all.current": self.segments,
            "num_device_alloc": self.num_device_alloc,
            "num_alloc_retries": self.num_alloc_retries,
            "num_ooms": self.num_ooms,
        }

    # ------------------------------------------------------------------ internals
    def _insert_free(self, b: _Block) -> None:
        if b.mapped:
            bisect.insort(self._free[b.pool], (b.size, b.addr))
        self._by_addr[b.addr] = b

    def _remove_free(self, b: _Block) -> None:
        if b.mapped:
            lst = self._free[b.pool]
            i = bisect.bisect_left(lst, (b.size, b.addr))
            del lst[i]
        del self._by_addr[b.addr]

    def _take_free(self, pool: str, size: int) -> _Block | None:
        lst = self._free[pool]
        i = bisect.bisect_left(lst, (size, -1))
        if i == len(lst):
            return None
        b = self._by_addr[lst[i][1]]
        self._remove_free(b)
        return b

    def _try_merge(self, dst: _Block, src: _Block | None) -> None:
        if src is None or self._by_addr.get(src.addr) is not src or src.mapped != dst.mapped:
            return
        self._remove_free(src)
        if self._expandable.get(src.pool) is src:
            self._expandable[src.pool] = dst
        if src is dst.prev:
            dst.addr, dst.prev = src.addr, src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size

    def _replace(self, b: _Block, pieces: Sequence[tuple[int, int, bool]]) -> None:
        """Put contiguous free pieces ``(addr, size, mapped)`` in the place of free block ``b``
        (already out of the free lists) and merge each with free neighbours of its kind."""
        prev, nxt, new = b.prev, b.next, []
        if not pieces:
            raise ValueError("pieces must not be empty")
        for addr, size, mapped in pieces:
            nb = _Block(b.pool, b.segment, addr, size, mapped=mapped, prev=prev)
            if prev is not None:
                prev.next = nb
            new.append(nb)
            prev = nb
        assert prev is not None  # pieces is not empty
        prev.next = nxt
        if nxt is not None:
            nxt.prev = prev
        if self._expandable.get(b.pool) is b:
            self._expandable[b.pool] = new[0]
        for nb in new:
            self._insert_free(nb)
        for nb in new:
            if self._by_addr.get(nb.addr) is nb:  # not absorbed by a neighbour yet
                self._remove_free(nb)
                for other in (nb.prev, nb.next):
                    self._try_merge(nb, other)
                self._insert_free(nb)

    def _fits(self, nbytes: int) -> bool:
        return self.capacity is None or self.reserved + nbytes <= self.capacity

    def _grow_reserved(self, nbytes: int) -> None:
        self.reserved += nbytes
        self.num_device_alloc += 1
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def _new_block(self, pool: str, size: int) -> _Block | None:
        if self.expandable_segments:
            return self._expand(pool, size)
        seg = segment_size(size)
        if not self._fits(seg):
            return None
        sid = next(self._segment_ids)
        self._segments[sid] = (pool, seg)
        addr = self._next_addr
        self._next_addr += seg
        self._grow_reserved(seg)
        return _Block(pool, sid, addr, seg)

    def _expand(self, pool: str, size: int) -> _Block | None:
        """Rule 7: map pages at the lowest address where the free blocks and unmapped space
        around an unmapped block span ``size`` bytes (``find_expandable_block`` and
        ``map_block``); returns the resulting free block, out of the free lists."""
        unit = K_SMALL_BUFFER if pool == "small" else K_LARGE_BUFFER
        if pool not in self._expandable:
            head = _Block(pool, -1, self._next_addr, _VA_SIZE, mapped=False)
            self._next_addr += _VA_SIZE
            self._expandable[pool] = head
            self._insert_free(head)
        b: _Block | None = self._expandable[pool]
        start: _Block | None = None
        while b is not None and start is None:
            if not b.mapped:  # unmapped blocks are never allocated
                first = b.prev if (b.prev is not None and not b.prev.allocated) else b
                span = 0
                c: _Block | None = first
                while c is not None and not c.allocated and span < size:
                    span, c = span + c.size, c.next
                if span >= size:
                    start = first
            b = b.next
        if start is None:
            return None
        plan, need, c = [], size, start
        while need > 0:
            assert c is not None  # the span found above covers the request
            if c.mapped:
                need -= c.size
            else:
                grow = min(_ceil(need, unit), c.size)
                plan.append((c, grow))
                need -= grow
            c = c.next
        if not self._fits(sum(g for _, g in plan)):
            return None
        addr = start.addr
        for c, grow in plan:
            self._remove_free(c)
            rest = [(c.addr + grow, c.size - grow, False)] if c.size > grow else []
            self._replace(c, [(c.addr, grow, True), *rest])
            self._grow_reserved(grow)
        block = self._by_addr[addr]
        self._remove_free(block)
        return block


@dataclass(frozen=True)
class ReplayResult:
    """What :func:`replay` observed: counters after every event and the final statistics.

    ``allocated``, ``reserved``, ``requested``: one value per event (bytes). ``oom_at``: the index
    of the event that failed with :class:`OutOfMemory` (``None`` if every allocation succeeded;
    replay stops there). ``stats``: :meth:`CachingAllocator.memory_stats` at the end.
    """

    allocated: tuple[int, ...]
    reserved: tuple[int, ...]
    requested: tuple[int, ...]
    peak_allocated: int
    peak_reserved: int
    peak_requested: int
    oom_at: int | None = None
    stats: dict = field(default_factory=dict, compare=False)

    @property
    def overhead(self) -> int:
        """Peak reserved minus peak requested: what the allocator costs on top of the tensors."""
        return self.peak_reserved - self.peak_requested

    @property
    def ratio(self) -> float:
        """Peak reserved / peak requested (1.0 = no overhead)."""
        return self.peak_reserved / self.peak_requested if self.peak_requested else 1.0


def replay(
    events: Iterable[tuple], expandable_segments: bool = False, capacity: int | None = None
) -> ReplayResult:
    """Run allocation events through a fresh :class:`CachingAllocator`.

    ``events``: ``("alloc", key, nbytes)`` and ``("free", key)`` tuples (extra trailing fields,
    such as the operator name :func:`parmem.traces.record_allocations` adds, are ignored); ``key`` is any
    hashable name of the tensor. An ``alloc`` of 0 bytes allocates nothing (as in PyTorch).
    """
    a = CachingAllocator(expandable_segments=expandable_segments, capacity=capacity)
    handles: dict = {}
    alloc_t, res_t, req_t = [], [], []
    oom_at = None
    for i, ev in enumerate(events):
        kind = ev[0]
        if kind == "alloc":
            key, n = ev[1], ev[2]
            if key in handles:
                raise ValueError(f"event {i}: key {key!r} is allocated twice")
            try:
                handles[key] = a.malloc(n) if n else None
            except OutOfMemory:
                oom_at = i
                break
        elif kind == "free":
            if ev[1] not in handles:
                raise ValueError(f"event {i}: key {ev[1]!r} is freed but not allocated")
            h = handles.pop(ev[1])
            if h is not None:
                a.free(h)
        else:
            raise ValueError(f"event {i}: kind={kind!r} must be 'alloc' or 'free'")
        alloc_t.append(a.allocated)
        res_t.append(a.reserved)
        req_t.append(a.requested)
    return ReplayResult(
        tuple(alloc_t),
        tuple(res_t),
        tuple(req_t),
        a.peak_allocated,
        a.peak_reserved,
        a.peak_requested,
        oom_at,
        a.memory_stats(),
    )


def min_capacity(
    events: Sequence[tuple], expandable_segments: bool = False, resolution: int = MIB
) -> int:
    """The smallest capacity, a multiple of ``resolution`` bytes, at which :func:`replay` runs
    ``events`` without :class:`OutOfMemory`.

    Reserved memory beyond the tensors is mostly cache: when a new segment would exceed the
    capacity, the allocator releases every entirely free segment and retries (rule 6,
    ``release_cached_blocks``), so a run whose peak *reserved* is far above its peak *allocated*
    may still fit a much smaller GPU, at the price of the ``cudaFree``/``cudaMalloc`` calls
    (``num_alloc_retries``, ``num_device_alloc`` of the replay at that capacity). The answer lies
    between the peak allocated bytes (no allocator can do with less) and the peak reserved bytes
    of the unlimited replay; a binary search finds it (completion is monotone in the capacity for
    the traces tested, not in general).
    """
    resolution = integer("resolution", resolution)
    events = list(events)
    free = replay(events, expandable_segments)
    lo = _ceil(free.peak_allocated, resolution) // resolution - 1  # fails (or is below the need)
    hi = _ceil(free.peak_reserved, resolution) // resolution  # works: the unlimited replay's peak
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if replay(events, expandable_segments, capacity=mid * resolution).oom_at is None:
            hi = mid
        else:
            lo = mid
    return hi * resolution
