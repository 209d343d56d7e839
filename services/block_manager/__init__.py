"""pagedserve block_manager service."""
