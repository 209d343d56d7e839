"""The type checker over the source folders: basedpyright, configured in pyproject.toml
(`[tool.basedpyright]`: services/, shared/, kernels/ in pyright's "standard" mode, no rule turned off),
with this interpreter's environment, so it reads torch, transformers and the rest as installed.

It takes about a minute on 2 cores, so it carries the packaging marker (tests/conftest.py): in the
default run that CI calls, not in the quick loop. A failure lists every error as path:line: message.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_source_folders_type_check_clean() -> None:
    checker = Path(sys.executable).with_name("basedpyright")
    assert checker.exists() or shutil.which("basedpyright"), (
        f"basedpyright is not installed beside {sys.executable}: it is in the dev extra (bash ops/setup.sh)"
    )
    run = subprocess.run(
        [
            str(checker if checker.exists() else "basedpyright"),
            "--outputjson",
            "--pythonpath",
            sys.executable,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    assert run.stdout, f"basedpyright printed nothing (exit {run.returncode}): {run.stderr[-2000:]}"
    report = json.loads(run.stdout)
    errors = [d for d in report["generalDiagnostics"] if d["severity"] == "error"]
    listed = "\n".join(
        f"{Path(d['file']).relative_to(REPO)}:{d['range']['start']['line'] + 1}: "
        f"{d['message']} [{d.get('rule', '')}]"
        for d in errors
    )
    assert not errors, f"{len(errors)} type errors:\n{listed}"
    assert report["summary"]["filesAnalyzed"] > 100, report["summary"]  # the include list matched the tree
