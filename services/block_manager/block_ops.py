"""The batched RPC: the ops of one engine step, applied in order, one result each.

Arguments arrive from the wire, so each op is checked here (types, arity) before the core sees
it; the core trusts in-process callers. A bad op becomes `{"error": ...}` in its slot and the
batch goes on: one malformed op must never kill the service or skip its neighbours.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pagedserve.shared.protocol.blocks import (
    OP_ALLOC,
    OP_ARITY,
    OP_FORK,
    OP_FREE,
    OP_GROW,
    OP_OPTIONAL,
    OP_RESUME,
    UNCHANGED,
    BlockAnswers,
    error_result,
)

if TYPE_CHECKING:
    from pagedserve.services.block_manager.manager import BlockManager


class MalformedOpError(ValueError):
    pass


def apply_ops(manager: BlockManager, ops: list[list[Any]], now: float) -> BlockAnswers:
    results: list[Any] = []
    append = results.append
    for op in ops:
        name = op[0] if type(op) is list and op and type(op[0]) is str else None
        handler = _HANDLERS.get(name) if name is not None else None
        if name is None or handler is None:
            append(
                error_result(
                    f"malformed op {_short(op)}: expected a list starting with one of {list(OP_ARITY)}"
                )
            )
            continue
        optional = OP_OPTIONAL.get(name, 0)
        if not OP_ARITY[name] <= len(op) <= OP_ARITY[name] + optional:
            expected = f"{OP_ARITY[name] - 1}" + (f" to {OP_ARITY[name] - 1 + optional}" if optional else "")
            append(error_result(f"{name}: expected {expected} arguments, got {len(op) - 1}"))
            continue
        try:
            append(handler(manager, op, now))
        except ValueError as exc:  # the core's refusals (BlockManagerError) and bad arguments
            append(error_result(f"{name}: {exc}"))
        except Exception as exc:  # anything else is still this op's failure, not the service's
            append(error_result(f"{name}: {type(exc).__name__}: {exc}"))
    return BlockAnswers(results, manager.free_blocks())


def _alloc(manager: BlockManager, op: list[Any], now: float) -> Any:
    _, pool_id, request_id, owner, token_ids, max_new_tokens, use_prefix_cache, *rest = op
    namespace = rest[0] if rest else None
    if namespace is not None:
        _need_str("cache_namespace", namespace)
    _need_str("pool_id", pool_id)
    _need_str("request_id", request_id)
    _need_str("owner", owner)
    _need_tokens("token_ids", token_ids)
    _need_count("max_new_tokens", max_new_tokens)
    if type(use_prefix_cache) is not bool:
        raise MalformedOpError(f"use_prefix_cache must be a bool, got {type(use_prefix_cache).__name__}")
    allocation = manager.allocate(
        pool_id,
        request_id,
        owner,
        token_ids,
        max_new_tokens,
        now,
        use_prefix_cache=use_prefix_cache,
        cache_namespace=namespace,
    )
    return None if allocation is None else allocation.to_wire()


def _grow(manager: BlockManager, op: list[Any], now: float) -> Any:
    # The per-step op (one per running request): checks inlined, no wire conversion when unchanged.
    _, request_id, num_new_tokens, new_token_ids = op
    if type(request_id) is not str:
        _need_str("request_id", request_id)
    if type(num_new_tokens) is not int:
        _need_count("num_new_tokens", num_new_tokens)
    if new_token_ids or type(new_token_ids) not in _TOKEN_LISTS:
        _need_tokens("new_token_ids", new_token_ids)
    growth = manager.grow(request_id, num_new_tokens, new_token_ids, now)
    if growth is UNCHANGED:
        return [[], [], []]
    return None if growth is None else growth.to_wire()


def _fork(manager: BlockManager, op: list[Any], now: float) -> Any:
    _, parent_id, child_id, owner = op
    _need_str("parent_id", parent_id)
    _need_str("child_id", child_id)
    _need_str("owner", owner)
    return True if manager.fork(parent_id, child_id, owner, now) else None


def _free(manager: BlockManager, op: list[Any], now: float) -> Any:
    _, request_id, num_computed = op
    _need_str("request_id", request_id)
    if num_computed is not None:
        _need_count("num_computed", num_computed)
    return manager.free(request_id, num_computed)


def _resume(manager: BlockManager, op: list[Any], now: float) -> Any:
    _, request_id, num_slots, num_new_tokens, new_token_ids = op
    _need_str("request_id", request_id)
    _need_count("num_slots", num_slots)
    _need_count("num_new_tokens", num_new_tokens)
    _need_tokens("new_token_ids", new_token_ids)
    growth = manager.resume(request_id, num_slots, num_new_tokens, new_token_ids, now)
    if growth is None:
        return None
    return [manager.table(request_id), [list(c) for c in growth.copies]]


_HANDLERS: dict[str, Callable[[BlockManager, list[Any], float], Any]] = {
    OP_ALLOC: _alloc,
    OP_GROW: _grow,
    OP_FORK: _fork,
    OP_FREE: _free,
    OP_RESUME: _resume,
}

_INT_ONLY = {int}
_TOKEN_LISTS = (list, tuple)  # tuples only from in-process callers; msgpack gives lists


def _need_str(field: str, value: Any) -> None:
    if type(value) is not str or not value:
        raise MalformedOpError(f"{field} must be a non-empty string, got {_short(value)}")


def _need_count(field: str, value: Any) -> None:
    if type(value) is not int or value < 0:
        raise MalformedOpError(f"{field} must be an int >= 0, got {_short(value)}")


def _need_tokens(field: str, value: Any) -> None:
    # set(map(type, ...)) runs in C: a few microseconds for a long prompt, nothing for a decode.
    if type(value) not in _TOKEN_LISTS or not set(map(type, value)) <= _INT_ONLY:
        raise MalformedOpError(f"{field} must be a list of ints, got {_short(value)}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
