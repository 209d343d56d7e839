"""pagedserve scheduler service."""
