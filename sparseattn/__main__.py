"""`python -m sparseattn <command>`: the application's command line (sparseattn/train/cli.py)."""

import sys

from .train.cli import main

if __name__ == "__main__":
    sys.exit(main())
