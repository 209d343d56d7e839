"""Fixtures of the block-manager tests."""

from __future__ import annotations

import pytest
from block_views import BLOCK_SIZE, NUM_BLOCKS, TTL

from pagedserve.services.block_manager.manager import BlockManager


@pytest.fixture
def manager() -> BlockManager:
    """A manager with one pool "w0" of NUM_BLOCKS blocks of BLOCK_SIZE tokens."""
    m = BlockManager(lease_ttl_s=TTL)
    m.add_pool("w0", NUM_BLOCKS, BLOCK_SIZE)
    return m
