"""`python -m pagedserve.ops.bench ...`, the same as `pagedserve bench ...`."""

import sys

from pagedserve.ops.bench.command import main

sys.exit(main())
