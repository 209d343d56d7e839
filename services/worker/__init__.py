"""pagedserve worker service."""
