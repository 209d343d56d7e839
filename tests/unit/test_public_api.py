"""The public package: the names users import, and the SDK's promise not to pull in torch."""

from __future__ import annotations

import subprocess
import sys


def test_client_sdk_imports_without_torch():
    code = (
        "import sys; from pagedserve import Client, AsyncClient, SamplingParams, RequestError; "
        "assert 'torch' not in sys.modules and 'services' not in sys.modules, sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_public_names_resolve():
    import pagedserve

    for name in pagedserve.__all__:
        assert getattr(pagedserve, name) is not None
