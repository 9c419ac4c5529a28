"""python -m benchmarks.pages [--check]: render the benchmark pages (see benchmarks/pages/__init__.py)."""

import sys

from . import main

sys.exit(main())
