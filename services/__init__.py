"""The three pagedserve services; each is a pure core plus a thin ZeroMQ loop."""
