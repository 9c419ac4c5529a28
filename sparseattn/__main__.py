"""`python -m sparseattn <command>`: the application's command line (sparseattn/train/cli.py),
started as the `sparseattn` command starts it, so Ctrl-C before the command runs is one line."""

import sys

from sparseattn_launcher import main

if __name__ == "__main__":
    sys.exit(main())
