"""The pagedserve services: block manager, scheduler and worker (each a pure core plus a thin ZeroMQ
loop) and the OpenAI-compatible API (a client of the scheduler); checkpoint.py reads a model folder
the same way for all of them. The in-process engine, which wires the three cores in one process, is
pagedserve/engine/: not a service."""
