"""`python -m experiments [NAME]`: experiments/run.py's main."""

import sys

from .run import main

sys.exit(main())
