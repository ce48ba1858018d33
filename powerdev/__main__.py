"""`python -m powerdev` is the `powerdev` command."""

import sys

from powerdev.cli import main

sys.exit(main())
