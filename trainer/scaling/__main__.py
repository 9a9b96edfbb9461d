"""`python -m trainer.scaling`: the scaling study (trainer/scaling/study.py)."""

from __future__ import annotations

import sys

from trainer.scaling.study import main

if __name__ == "__main__":
    sys.exit(main())
