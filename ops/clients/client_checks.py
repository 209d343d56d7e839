"""What every client script here shares: its flags (where the API is) and its report, one line
`PASS name: detail` or `FAIL name: reason` a check and the failure count for the exit status.

The scripts import it as a file beside them (`from client_checks import ...`): they run in the
clients' venv, which has the frameworks and not pagedserve.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Awaitable, Callable, Mapping


def parse_args(doc: str | None, argv: list[str] | None, *, model: str | None) -> argparse.Namespace:
    """--base-url, --api-key, and --model (`model` by default; None: the script asks /v1/models)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    ap.add_argument("--api-key", default="none")
    ap.add_argument(
        "--model", default=model, help="default: the first of /v1/models" if model is None else None
    )
    return ap.parse_args(argv)


async def report(checks: Mapping[str, Callable[[], Awaitable[object]]]) -> int:
    """Run every check in order, print its line; the number that raised."""
    failures = 0
    for name, check in checks.items():
        try:
            print(f"PASS {name}: {await check()}", flush=True)
        except Exception as exc:  # each check reports and the next one runs
            failures += 1
            print(f"FAIL {name}: {exc!r}", flush=True)
            traceback.print_exc(file=sys.stderr)
    return failures
