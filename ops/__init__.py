"""Operating pagedserve: the `pagedserve` command, the local process supervisor, health views."""
