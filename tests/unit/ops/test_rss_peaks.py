"""rss_peaks samples a real process tree: each process's peak RSS with the parts it was made of."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

# A parent that starts a child holding 64 MiB of touched anonymous memory (it writes `ready` once it
# has), both sleeping until killed.
TREE = """
import subprocess, sys, time
child = "b = b'x' * (64 << 20); open(sys.argv[1], 'w').close(); import time; time.sleep(60)"
subprocess.Popen([sys.executable, "-c", "import sys; " + child, sys.argv[1]])
time.sleep(60)
"""


def test_a_childs_peak_is_found_with_its_anonymous_part(tmp_path: Path) -> None:
    out, ready = tmp_path / "peaks.json", tmp_path / "ready"
    tree = subprocess.Popen([sys.executable, "-c", TREE, str(ready)])
    sampler = subprocess.Popen(
        [sys.executable, "-m", "pagedserve.ops.bench.rss_peaks", str(tree.pid), "1", out]
    )
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(2.0)  # a few samples (every 0.5 s) after the child holds its memory
    finally:
        sampler.terminate()  # SIGTERM: it writes the peaks
        sampler.wait(timeout=10)
        subprocess.run(["pkill", "-P", str(tree.pid)], check=False)
        tree.kill()
        tree.wait()
    peaks = json.loads(out.read_text())
    child = next(parts for key, parts in peaks.items() if "import sys; b = " in key)
    assert child["anon_mib"] >= 64
    assert child["rss_mib"] >= child["anon_mib"] + child["file_mib"] - 1  # the parts fit in the whole
    parent = next(parts for key, parts in peaks.items() if key.startswith(f"{tree.pid} "))
    assert parent["anon_mib"] < 64
