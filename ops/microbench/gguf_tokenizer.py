"""What a GGUF's tokenizer costs a process at start, three ways, each in a fresh interpreter.

    /work/tools/cpulock bench .venv/bin/python -m pagedserve.ops.microbench.gguf_tokenizer [FILE.gguf] [--repeats 3]

  transformers   AutoTokenizer.from_pretrained(dir, gguf_file=...): transformers' own reader and builders
  derived        services/gguf_tokenizer.derive_tokenizer: our metadata reader, transformers' builders
  cached         AutoTokenizer.from_pretrained(<the cached folder>): what every process after the first pays

Seconds for the call alone (the imports it needs are made before the clock starts), min and median of
the repeats. Default file: the bundled model's GGUF.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile

CHILD = """
import sys, time
from pathlib import Path
import transformers
from transformers import AutoTokenizer
from pagedserve.services.gguf_tokenizer import derive_tokenizer, load_gguf_tokenizer
path, how = Path(sys.argv[1]), sys.argv[2]
if how == "cached":
    load_gguf_tokenizer(path)  # fills the cache (a fresh one per run), not timed
    from pagedserve.services.gguf_tokenizer import _cache_folder
    folder = _cache_folder(path)
started = time.perf_counter()
if how == "transformers":
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
elif how == "derived":
    tokenizer = derive_tokenizer(path)
else:
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
print(time.perf_counter() - started, len(tokenizer))
"""


def main() -> None:
    from pagedserve.services.worker.weights.bundled import find_bundled_gguf

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf", nargs="?", default=None)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    path = args.gguf or str(find_bundled_gguf())
    result: dict[str, object] = {"gguf": path}
    for how in ("transformers", "derived", "cached"):
        times = []
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory() as cache:
                env = {"PAGEDSERVE_CACHE": cache, "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
                out = subprocess.run(
                    [sys.executable, "-c", CHILD, path, how],
                    capture_output=True,
                    text=True,
                    env=env,
                    check=True,
                ).stdout.split()
                times.append(float(out[0]))
        result[how] = {"min_s": round(min(times), 3), "median_s": round(statistics.median(times), 3)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
