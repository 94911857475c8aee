"""The caching-allocator simulator against PyTorch's documented rules, case by case by hand, and
its replay of a training step's allocations.

Constants: c10/cuda/CUDACachingAllocator.cpp (kMinBlockSize 512, kSmallSize 1 MiB, kSmallBuffer
2 MiB, kLargeBuffer 20 MiB, kMinLargeAlloc 10 MiB, kRoundLarge 2 MiB). Every expected number below
is worked out from those rules in the comment next to it, not taken from the simulator.
"""

import random

import pytest

from parmem import ModelSpec, ParallelConfig, TrainingSetup
from parmem.allocator import (
    CachingAllocator,
    OutOfMemory,
    min_capacity,
    pool_of,
    replay,
    round_size,
    segment_size,
)
from parmem.traces import training_step_events

KiB, MiB = 2**10, 2**20


@pytest.mark.parametrize("n,rounded", [(0, 512), (1, 512), (512, 512), (513, 1024),
                                       (1000, 1024), (MiB, MiB), (MiB + 1, MiB + 512)])
def test_round_size(n, rounded):
    assert round_size(n) == rounded


def test_pool_boundary_is_one_mib_after_rounding():
    assert pool_of(MiB) == "small"
    assert pool_of(MiB - 100) == "small"   # rounds to exactly 1 MiB
    assert pool_of(MiB + 1) == "large"     # rounds to 1 MiB + 512


@pytest.mark.parametrize("n,seg", [
    (1, 2 * MiB),                 # small: a 2 MiB segment
    (MiB, 2 * MiB),
    (MiB + 1, 20 * MiB),          # large and < 10 MiB: a 20 MiB segment
    (10 * MiB - 512, 20 * MiB),
    (10 * MiB, 10 * MiB),         # >= 10 MiB: its own size, rounded up to 2 MiB
    (10 * MiB + 1, 12 * MiB),     # 10 MiB + 512 -> 12 MiB
    (21 * MiB, 22 * MiB),
])
def test_segment_size(n, seg):
    assert segment_size(n) == seg


def test_small_pool_packs_four_500k_tensors_per_2mib_segment():
    # 500 KiB = 512,000 bytes, a multiple of 512; 4 of them = 2,048,000 <= 2,097,152: one segment.
    a = CachingAllocator()
    for _ in range(4):
        a.malloc(500 * KiB)
    assert (a.allocated, a.reserved, a.segments) == (4 * 512_000, 2 * MiB, 1)
    a.malloc(500 * KiB)  # the fifth opens a second segment
    assert (a.allocated, a.reserved, a.segments) == (5 * 512_000, 4 * MiB, 2)


def test_unsplit_large_remainder_is_counted_as_allocated():
    # 19.5 MiB >= 10 MiB: segment = ceil(19.5, 2) = 20 MiB; remainder 0.5 MiB is not > 1 MiB,
    # so the block is not split and the whole 20 MiB is "allocated".
    a = CachingAllocator()
    a.malloc(19 * MiB + 512 * KiB)
    assert a.allocated == 20 * MiB
    assert a.requested == 19 * MiB + 512 * KiB
    assert a.reserved == 20 * MiB


def test_split_reuse_and_new_segment():
    a = CachingAllocator()
    a.malloc(3 * MiB)            # 20 MiB segment, split: 3 used, 17 free
    a.malloc(17 * MiB)           # best fit is the 17 MiB remainder: no new segment
    assert (a.allocated, a.reserved, a.segments) == (20 * MiB, 20 * MiB, 1)
    a.malloc(MiB + 1)            # nothing free: a second 20 MiB segment
    assert (a.allocated, a.reserved, a.segments) == (21 * MiB + 512, 40 * MiB, 2)


def test_remainder_of_an_own_size_segment_serves_a_later_request():
    # 12 MiB + 1 -> 12 MiB + 512, segment 14 MiB, remainder 2 MiB - 512 > 1 MiB: split.
    a = CachingAllocator()
    a.malloc(12 * MiB + 1)
    assert (a.allocated, a.reserved) == (12 * MiB + 512, 14 * MiB)
    a.malloc(MiB + 512 * KiB)    # 1.5 MiB, large pool, fits the 2 MiB - 512 remainder
    assert (a.reserved, a.segments) == (14 * MiB, 1)


def test_free_merges_neighbours_then_unsplit_rule():
    a = CachingAllocator()
    h = [a.malloc(5 * MiB) for _ in range(4)]   # four 5 MiB blocks fill one 20 MiB segment
    assert (a.reserved, a.segments) == (20 * MiB, 1)
    a.free(h[1])
    a.free(h[2])                                 # merged into one free 10 MiB block
    assert a.inactive_split == 10 * MiB
    a.malloc(9 * MiB)                            # remainder 1 MiB is not > 1 MiB: unsplit
    assert a.allocated == 5 * MiB + 10 * MiB + 5 * MiB
    assert a.reserved == 20 * MiB
    a.empty_cache()                              # the segment is in use: nothing released
    assert a.reserved == 20 * MiB


def test_growing_sizes_strand_cached_segments():
    # The "N+1" case of PyTorch's expandable-segments note: ten 10 MiB tensors (ten 10 MiB
    # segments), freed, then ten 11 MiB tensors: no cached block is large enough, so ten new
    # 12 MiB segments (11 MiB rounds to 12, remainder 1 MiB unsplit: allocated 12 each).
    a = CachingAllocator()
    for h in [a.malloc(10 * MiB) for _ in range(10)]:
        a.free(h)
    for _ in range(10):
        a.malloc(11 * MiB)
    assert (a.allocated, a.reserved) == (120 * MiB, 220 * MiB)
    # with 200 MiB of capacity the 9th segment (100 + 9*12 = 208 > 200) triggers one release of
    # the ten free 10 MiB segments and a retry; no out-of-memory
    b = CachingAllocator(capacity=200 * MiB)
    for h in [b.malloc(10 * MiB) for _ in range(10)]:
        b.free(h)
    for _ in range(10):
        b.malloc(11 * MiB)
    assert (b.reserved, b.num_alloc_retries, b.num_ooms) == (120 * MiB, 1, 0)


def test_expandable_segments_tile_the_growing_sizes():
    # Expandable: 100 MiB of 10 MiB tensors map five 20 MiB pages. Freed, they merge into one
    # 100 MiB free block that holds nine 11 MiB tensors (99 MiB); the tenth uses the 1 MiB tail
    # and maps one more page: 120 MiB reserved, 110 MiB allocated (splits down to 512 bytes).
    a = CachingAllocator(expandable_segments=True)
    for h in [a.malloc(10 * MiB) for _ in range(10)]:
        a.free(h)
    assert a.reserved == 100 * MiB
    for _ in range(10):
        a.malloc(11 * MiB)
    assert (a.allocated, a.reserved, a.segments) == (110 * MiB, 120 * MiB, 1)


def test_expandable_small_pool_pages():
    # three 1 MiB tensors: small pool, 2 MiB pages; two fill the first page, the third maps a
    # second page
    a = CachingAllocator(expandable_segments=True)
    for _ in range(3):
        a.malloc(MiB)
    assert (a.allocated, a.reserved) == (3 * MiB, 4 * MiB)


def test_expandable_without_frees_wastes_less_than_one_page_per_pool():
    rng = random.Random(0)
    sizes = [rng.choice([rng.randrange(1, MiB), rng.randrange(MiB + 1, 64 * MiB)])
             for _ in range(300)]
    a = CachingAllocator(expandable_segments=True)
    for n in sizes:
        a.malloc(n)
    small = sum(round_size(n) for n in sizes if pool_of(n) == "small")
    large = sum(round_size(n) for n in sizes if pool_of(n) == "large")
    ceil = lambda n, u: -(-n // u) * u  # noqa: E731
    assert a.allocated == small + large
    assert a.reserved == ceil(small, 2 * MiB) + ceil(large, 20 * MiB)


def test_empty_cache_unmaps_only_whole_free_pages():
    a = CachingAllocator(expandable_segments=True)
    h = [a.malloc(15 * MiB) for _ in range(4)]   # 60 MiB: three 20 MiB pages
    assert a.reserved == 60 * MiB
    a.free(h[1])
    a.free(h[2])                                 # free [15, 45) MiB: page [20, 40) is empty
    a.empty_cache()
    assert a.reserved == 40 * MiB
    a.malloc(30 * MiB)                           # the lowest gap that fits: maps the page back
    assert (a.reserved, a.segments) == (60 * MiB, 1)


def test_out_of_memory_after_retry():
    a = CachingAllocator(capacity=30 * MiB)
    a.malloc(20 * MiB)                           # segment of 20 MiB
    with pytest.raises(OutOfMemory) as err:
        a.malloc(12 * MiB)                       # needs a 12 MiB segment: 32 > 30 MiB
    assert (err.value.allocated, err.value.reserved, err.value.capacity) == (20 * MiB, 20 * MiB,
                                                                            30 * MiB)
    assert (a.num_alloc_retries, a.num_ooms) == (1, 1)


def test_replay_timeline_and_errors():
    events = [("alloc", "x", 3 * MiB), ("alloc", "y", 100), ("alloc", "z", 0), ("free", "x"),
              ("free", "z")]
    r = replay(events)
    assert r.allocated == (3 * MiB, 3 * MiB + 512, 3 * MiB + 512, 512, 512)
    assert r.reserved == (20 * MiB, 22 * MiB, 22 * MiB, 22 * MiB, 22 * MiB)
    assert r.requested[-1] == 100
    assert (r.peak_requested, r.peak_reserved, r.oom_at) == (3 * MiB + 100, 22 * MiB, None)
    assert replay([("alloc", 1, 20 * MiB), ("alloc", 2, 20 * MiB)],
                  capacity=30 * MiB).oom_at == 1
    for bad, msg in [([("alloc", 1, 1), ("alloc", 1, 1)], "allocated twice"),
                     ([("free", 1)], "not allocated"), ([("grow", 1)], "kind='grow'")]:
        with pytest.raises(ValueError, match=msg):
            replay(bad)
    with pytest.raises(ValueError, match="nbytes=-1"):
        CachingAllocator().malloc(-1)
    with pytest.raises(ValueError, match="not a live allocation"):
        CachingAllocator().free(7)


@pytest.mark.parametrize("expandable", [False, True])
def test_random_traffic_keeps_the_books_balanced(expandable):
    # Invariants of any allocator state: live blocks never overlap, allocated is the sum of the
    # live blocks (each at least its rounded request), reserved covers them, reserved is whole
    # segments (multiples of 2 MiB) and, once everything is freed and the cache emptied, zero.
    rng = random.Random(1 if expandable else 2)
    a = CachingAllocator(expandable_segments=expandable, capacity=400 * MiB)
    live: dict[int, int] = {}
    for _ in range(2000):
        if live and rng.random() < 0.45:
            h = rng.choice(list(live))
            a.free(h)
            del live[h]
        else:
            n = rng.choice([rng.randrange(1, 4096), rng.randrange(1, 2 * MiB),
                            rng.randrange(MiB, 30 * MiB)])
            try:
                live[a.malloc(n)] = n
            except OutOfMemory:
                continue
        blocks = sorted((b.addr, b.size) for b in a._live.values())
        assert all(x + s <= y for (x, s), (y, _) in zip(blocks, blocks[1:], strict=False))
        assert a.allocated == sum(s for _, s in blocks)
        assert all(b.size >= round_size(live[h]) for h, b in a._live.items())
        assert a.requested == sum(live.values())
        assert a.allocated <= a.reserved <= 400 * MiB
        assert a.reserved % (2 * MiB) == 0
    for h in list(live):
        a.free(h)
    assert (a.allocated, a.requested) == (0, 0)
    a.empty_cache()
    assert (a.reserved, a.segments) == (0, 0)


def test_expandable_segments_absorb_a_growing_sequence_length():
    # the N+1 case of the expandable-segments note, on a real model's terms: a shorter step then
    # a longer one leaves the default allocator holding segments that are each slightly too small
    spec = ModelSpec.preset("llama-2-7b")
    setup = TrainingSetup(seq_len=4096, flash_attention=True, dropout=False)
    ev = training_step_events(spec, ParallelConfig(), setup, seq_lens=[3072, 4096])
    default, expandable = replay(ev), replay(ev, expandable_segments=True)
    assert default.peak_requested == expandable.peak_requested
    assert default.peak_reserved - default.peak_requested > 2 * 2**30
    # expandable: at most one page per pool beyond the tensors
    assert expandable.peak_reserved - expandable.peak_requested < 22 * 2**20
    same = replay(training_step_events(spec, ParallelConfig(), setup, seq_lens=[4096, 4096]))
    assert same.peak_reserved < default.peak_reserved


def test_min_capacity_counts_cache_as_reclaimable():
    # A 30 MiB tensor gets its own 30 MiB segment (rule 4: >= 10 MiB, rounded to 2 MiB) and is
    # freed; a 40 MiB tensor then needs a new 40 MiB segment. Unlimited, 70 MiB stay reserved;
    # with 40 MiB of capacity the allocator releases the free 30 MiB segment and retries (rule 6),
    # so 40 MiB, the largest live tensor, is enough, and 39 MiB is not.
    events = [("alloc", "a", 30 * MiB), ("free", "a"), ("alloc", "b", 40 * MiB)]
    assert replay(events).peak_reserved == 70 * MiB
    assert min_capacity(events) == 40 * MiB
    fits = replay(events, capacity=40 * MiB)
    assert fits.oom_at is None and fits.stats["num_alloc_retries"] == 1
    assert replay(events, capacity=39 * MiB).oom_at == 2
    # a live neighbour keeps its segment: 30 MiB + 40 MiB must both be reserved
    held = [("alloc", "a", 30 * MiB), ("alloc", "b", 40 * MiB)]
    assert min_capacity(held) == 70 * MiB
    with pytest.raises(ValueError, match="resolution"):
        min_capacity(events, resolution=0)
