"""What every pagedserve process and the client SDK share: wire protocol, config, logging, ZeroMQ helpers.

Nothing here imports torch: the SDK depends on this package alone.
"""
