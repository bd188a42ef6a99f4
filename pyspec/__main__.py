"""`python -m pyspec ...`: see pyspec/apps/cli.py."""

import sys

from .apps.cli import main

sys.exit(main())
