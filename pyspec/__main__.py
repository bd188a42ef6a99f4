"""`python -m pyspec ...`: see pyspec/cli.py."""

import sys

from .cli import main

sys.exit(main())
