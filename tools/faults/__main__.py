"""`python -m tools.faults`: the fault-injection suite (tools/faults/suite.py)."""

import sys

from tools.faults.suite import main

sys.exit(main())
