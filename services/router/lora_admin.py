"""LoRA adapters across shards: the router's ops endpoint takes the API's LoRA calls (list, load,
unload) and makes them on every shard's scheduler, so that a request placed on any shard finds its
adapter. Every shard holds the same set: the list is shard 0's; a load or an unload that one shard
refuses (a bad file, an adapter in use there) is undone on the shards that did it."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from pagedserve.shared.ops_server import json_response

_TIMEOUT_S = 30.0  # a load reads and checks the adapter's files


def _call(url: str, body: Any | None, token: str | None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {token}"} if token else {})
    request = urllib.request.Request(
        url, data=data, headers=headers, method="GET" if body is None else "POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.loads(e.read() or b"{}")
        except ValueError:
            return e.code, {"error": f"HTTP {e.code}"}
    except (OSError, ValueError) as e:
        return 502, {"error": f"unreachable: {e}"}


def listing(shards: list[str], token: str | None) -> tuple[int, str, bytes]:
    status, body = _call(shards[0] + "/loras", None, token)
    return json_response(body, status)


def _undo(shards: list[str], action: str, body: Any, token: str | None) -> tuple[str, Any] | None:
    """The call that puts a shard back as it was before `action`: an unload after a load; after an
    unload, a load of the same adapter from the path shard 0 lists for it now (None: it has none)."""
    name = body.get("lora_name") if isinstance(body, dict) else None
    if action == "load":
        return "/loras/unload", {"lora_name": name}
    _, listed = _call(shards[0] + "/loras", None, token)
    paths = {a.get("name"): a.get("path") for a in listed.get("adapters", []) if isinstance(a, dict)}
    return None if paths.get(name) is None else ("/loras/load", {"lora_name": name, "lora_path": paths[name]})


def everywhere(shards: list[str], action: str, body: Any, token: str | None) -> tuple[int, str, bytes]:
    """`action` ("load" or "unload") on every shard; one answer for all, naming the shards that refused.
    When some shards refuse, the ones that did it are put back, so every shard keeps the same set."""
    undo = _undo(shards, action, body, token)
    answers = [_call(f"{url}/loras/{action}", body, token) for url in shards]
    refused = [(i, status, reply) for i, (status, reply) in enumerate(answers) if status != 200]
    if not refused:
        return json_response({**answers[0][1], "shards": len(shards)})
    if undo is not None:
        for i, (status, _) in enumerate(answers):
            if status == 200:
                _call(shards[i] + undo[0], undo[1], token)
    said = "; ".join(f"shard {i}: {reply.get('error', reply)}" for i, _, reply in refused)
    return json_response({"error": said, "shards_refused": [i for i, _, _ in refused]}, refused[0][1])
