"""Shared fixtures: one pool of ``torch.distributed`` ranks per test session, and one small plan
for the tests of the planner's outputs and of its figure."""

import pytest
from helpers import WORLD_SIZE

from parmem import Cluster, ModelSpec, plan


@pytest.fixture(scope="session")
def pool():
    """A started :class:`parmem.distributed.Pool` of ``WORLD_SIZE`` ranks, shared by every test of a
    session (of an xdist worker) and closed at its end: starting ranks is the expensive part."""
    pytest.importorskip("torch")
    from parmem.distributed import Pool

    with Pool(world_size=WORLD_SIZE) as p:
        yield p


@pytest.fixture(scope="module")
def small_plan():
    return plan(ModelSpec.preset("llama-2-13b"), Cluster("h100-sxm", 8, 4), 128, 4096, top=5)
