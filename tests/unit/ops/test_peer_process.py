"""A peer's script runs as its own process: its result file becomes a PathResult, its death an error."""

from __future__ import annotations

import sys
from pathlib import Path

from pagedserve.ops.bench.peer_process import run_peer_process

ANSWERS = """import json, sys
request = json.load(open(sys.argv[1]))
json.dump({"name": "x", "output_tokens": len(request["prompts"]), "wall_s": 2.0, "tokens_per_s": 1.0,
           "error": None, "gguf": "model.gguf"}, open(sys.argv[2], "w"))
"""
DIES = "import sys; print('out of memory'); sys.exit(3)\n"


def test_a_peer_result_comes_back_with_its_details(tmp_path: Path) -> None:
    script = tmp_path / "peer.py"
    script.write_text(ANSWERS)
    result = run_peer_process("toy", Path(sys.executable), script, {"prompts": [[1], [2], [3]]}, 60)
    assert (result.name, result.output_tokens, result.wall_s, result.error) == ("toy", 3, 2.0, None)
    assert result.details == {"gguf": "model.gguf"}


def test_a_peer_that_dies_without_a_result_is_that_paths_error(tmp_path: Path) -> None:
    script = tmp_path / "peer.py"
    script.write_text(DIES)
    result = run_peer_process("toy", Path(sys.executable), script, {}, 60)
    assert result.error is not None and "exited 3 without a result" in result.error
    assert "out of memory" in result.error
