"""`pagedserve router`: a stateless process in front of several schedulers (shards) that places each
request on one of them and relays the replies."""
