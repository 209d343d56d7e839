"""Result files name no machine: paths under the model cache, the repository, the temp folder or the
home folder are written from there (ops/results.py), and the committed results hold none."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

from pagedserve.ops.results import REPO, portable, write_json

# Absolute paths of the kinds a run leaves behind: home folders, temp folders, this machine's ones.
MACHINE_PATH = re.compile(
    "|".join(
        [
            r"/(?:root|home|Users|tmp|var/folders)/",
            re.escape(str(Path.home())) + "/",
            re.escape(tempfile.gettempdir()) + "/",
            re.escape(str(REPO)) + "/",  # this checkout's own place
        ]
    )
)


def test_paths_are_written_from_the_cache_the_repo_the_temp_folder_or_home(tmp_path, monkeypatch) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("PAGEDSERVE_CACHE", str(cache))
    report = {
        "model_path": str(cache / "smollm2-135m"),
        "source": [str(REPO / "bench" / "results" / "bench.json")],
        "log_dir": Path(tempfile.gettempdir()) / "pagedserve-chaos-x",
        "config": str(Path.home() / "models" / "tiny"),
        "route": "/v1/completions",  # not under any of them: as it is
        "count": 3,
    }
    assert portable(report) == {
        "model_path": "$PAGEDSERVE_CACHE/smollm2-135m",
        "source": ["bench/results/bench.json"],  # relative to the repository
        "log_dir": "$TMPDIR/pagedserve-chaos-x",
        "config": "~/models/tiny",
        "route": "/v1/completions",
        "count": 3,
    }


def test_command_lines_and_logs_are_written_from_the_bases_too(tmp_path, monkeypatch) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("PAGEDSERVE_CACHE", str(cache))
    line = f"2511 {REPO}/.venv/bin/python3.11 -m pagedserve.ops.cli worker --model {cache}/m.gguf"
    assert portable({line: 61.5}) == {
        "2511 ./.venv/bin/python3.11 -m pagedserve.ops.cli worker --model $PAGEDSERVE_CACHE/m.gguf": 61.5
    }
    log = f"srv load_model: loading model '{Path.home()}/models/x.gguf'"
    assert portable(log) == "srv load_model: loading model '~/models/x.gguf'"


def test_a_written_result_holds_no_machine_path(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PAGEDSERVE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "result.json"
    write_json(out, {"model": str(tmp_path / "cache" / "m"), "log_dir": str(tmp_path / "logs")})
    assert not MACHINE_PATH.search(out.read_text()), out.read_text()
    assert json.loads(out.read_text())["model"] == "$PAGEDSERVE_CACHE/m"


def test_the_committed_results_hold_no_machine_path() -> None:
    files = sorted(
        p for p in (REPO / "bench" / "results").iterdir() if p.suffix in (".json", ".txt", ".md", ".log")
    )
    assert files, "bench/results/ holds no result files"
    found = [f"{p.name}: {m.group(0)}" for p in files for m in MACHINE_PATH.finditer(p.read_text())]
    assert not found, "\n".join(found)
