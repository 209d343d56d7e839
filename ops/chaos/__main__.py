"""`python -m pagedserve.ops.chaos ...`, the same as `pagedserve chaos ...`."""

import sys

from pagedserve.ops.chaos.command import main

sys.exit(main())
