"""Output constraints (JSON schema, regex, choice, grammar, structural tag) compiled with xgrammar."""

from __future__ import annotations

import importlib
import threading


def preload() -> threading.Thread:
    """Import xgrammar on a side thread. It pulls in torch and transformers (seconds on a busy CPU),
    which the scheduler and the API would otherwise pay inside their loop on the first constrained
    request; a request that comes sooner simply waits for the import to finish."""
    thread = threading.Thread(
        target=importlib.import_module, args=("xgrammar",), name="preload-xgrammar", daemon=True
    )
    thread.start()
    return thread
