"""Named API keys: each key says who is calling, and that name is the user the scheduler's per-user
in-flight limit counts.

A keys file (`--api-keys-file`, TOML or JSON by its suffix) maps names to keys:

    alice = "sk-alice-..."
    batch-jobs = "sk-batch-..."

A caller named by its key cannot choose another identity: the OpenAI `user` field is ignored for
limits then (it would let one key spread its load over any number of made-up users). With the single
`api_key` (or none) the `user` field stays the identity, as before.
"""

from __future__ import annotations

import hmac
import json
import tomllib
from pathlib import Path


class KeysFileError(ValueError):
    """The keys file cannot be used; the message names the file and what is wrong."""


def load_api_keys(path: str | Path) -> dict[str, str]:
    """name -> key from a TOML or JSON file; every problem is a KeysFileError naming the file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise KeysFileError(f"api keys file {path}: cannot be read ({exc.strerror})") from exc
    try:
        table = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        kind = "JSON" if path.suffix == ".json" else "TOML"
        raise KeysFileError(f"api keys file {path}: not valid {kind} ({exc})") from exc
    return check_keys(table, path)


def check_keys(table: object, path: Path) -> dict[str, str]:
    if not isinstance(table, dict) or not table:
        raise KeysFileError(f'api keys file {path}: want a table of name = "key" entries, got {table!r}')
    owners: dict[str, str] = {}
    for name, key in table.items():
        if not isinstance(key, str) or len(key.strip()) < 8:
            raise KeysFileError(
                f"api keys file {path}: the key of {name!r} must be a string of 8+ characters"
            )
        if key in owners:
            raise KeysFileError(f"api keys file {path}: {owners[key]!r} and {name!r} have the same key")
        owners[key] = name
    return {name: key.strip() for name, key in table.items()}


def key_owner(keys: dict[str, str], token: str) -> str | None:
    """The name whose key is `token`, or None. Every key is compared (in constant time each), so
    the time taken does not tell which name came close."""
    owner = None
    for name, key in keys.items():
        if hmac.compare_digest(token.encode(), key.encode()):
            owner = name
    return owner
