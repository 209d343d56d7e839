"""LoRA adapters across shards: the router's ops endpoint takes the API's LoRA calls (list, load,
unload) and makes them on every shard's scheduler, so that a request placed on any shard finds its
adapter. Every shard holds the same set: the list is shard 0's; a load refused by one shard is undone
on those that took it, so no shard serves an adapter the others refuse."""

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


def everywhere(shards: list[str], action: str, body: Any, token: str | None) -> tuple[int, str, bytes]:
    """`action` ("load" or "unload") on every shard; one answer for all, naming the shards that refused."""
    answers = [_call(f"{url}/loras/{action}", body, token) for url in shards]
    refused = [(i, status, reply) for i, (status, reply) in enumerate(answers) if status != 200]
    if not refused:
        return json_response({**answers[0][1], "shards": len(shards)})
    if action == "load":  # undo it where it was taken
        name = body.get("lora_name") if isinstance(body, dict) else None
        for i, (status, _) in enumerate(answers):
            if status == 200:
                _call(f"{shards[i]}/loras/unload", {"lora_name": name}, token)
    said = "; ".join(f"shard {i}: {reply.get('error', reply)}" for i, _, reply in refused)
    return json_response({"error": said, "shards_refused": [i for i, _, _ in refused]}, refused[0][1])
