"""Shared fixtures: one pool of ``torch.distributed`` ranks per test module."""

import os

import pytest

#: ranks for the distributed tests: $PARMEM_WORLD_SIZE (2 in CI and ``make test``)
WORLD_SIZE = int(os.environ.get("PARMEM_WORLD_SIZE", "2"))


@pytest.fixture(scope="module")
def pool():
    """A started :class:`parmem.dist.Pool` of ``WORLD_SIZE`` ranks, shared by a module's tests
    and closed after them (starting ranks is the expensive part)."""
    pytest.importorskip("torch")
    from parmem.dist import Pool

    with Pool(world_size=WORLD_SIZE) as p:
        yield p
