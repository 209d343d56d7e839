"""The in-process engine: scheduler, block manager and model runner cores wired in one process."""

from pagedserve.engine.llm import LLM, RequestOutput

__all__ = ["LLM", "RequestOutput"]
