"""`python -m pagedserve.ops.cli ...`: how the supervisor starts each service as a child process."""

import sys

from pagedserve.ops.cli.command import main

sys.exit(main())
