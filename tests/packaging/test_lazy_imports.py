"""Every `from pagedserve... import name` under ops/ resolves: the module imports and has the name.

The type checker (test_types.py) reads services/, shared/ and kernels/ only, and ops/ imports most of
what it uses inside functions (to keep a tool's start light), so a name moved by a refactor broke
`ops/microbench/weights_rss.py` after its rows were printed, and nothing noticed. This walks each
file's syntax tree for the imports wherever they sit, then imports them in a child process (torch and
the rest stay out of the test process).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CHECK = """
import importlib, json, sys
failures = []
for where, module, names in json.loads(sys.stdin.read()):
    try:
        found = importlib.import_module(module)
    except Exception as error:
        failures.append(f"{where}: {module}: {error!r}")
        continue
    for name in names:
        if hasattr(found, name):
            continue
        try:
            importlib.import_module(f"{module}.{name}")
        except ImportError:
            failures.append(f"{where}: {module} has no {name}")
print(json.dumps(failures))
"""


def pagedserve_imports(folder: Path) -> list[tuple[str, str, list[str]]]:
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            where = f"{path.relative_to(REPO)}:{getattr(node, 'lineno', 0)}"
            if (
                isinstance(node, ast.ImportFrom)
                and node.level == 0
                and (node.module or "").startswith("pagedserve")
            ):
                found.append((where, node.module or "", [a.name for a in node.names if a.name != "*"]))
            elif isinstance(node, ast.Import):
                found += [(where, a.name, []) for a in node.names if a.name.startswith("pagedserve")]
    return found


def test_every_pagedserve_import_in_ops_resolves() -> None:
    imports = pagedserve_imports(REPO / "ops")
    assert len(imports) > 100, "the walk found too few imports to mean anything"
    run = subprocess.run(
        [sys.executable, "-c", CHECK], input=json.dumps(imports), capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == []
