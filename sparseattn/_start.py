"""Ctrl-C while `python -m sparseattn` imports this package: one line and exit 130.

`python -m sparseattn` imports the package, and torch with it, before sparseattn/__main__.py
runs, and a KeyboardInterrupt raised inside those imports ends in a traceback of dozens of lines
(numpy half imported, then a RecursionError). The `sparseattn` command catches it before the
package is imported (sparseattn_launcher.py); under `python -m` only the package's first import
can. While Python locates the module that -m names, sys.argv[0] is "-m" (a plain `import
sparseattn` is untouched); then, if SIGINT has Python's default handler (a SIGINT that the parent
ignores, as a shell does for a background job, stays ignored), Ctrl-C exits at once. __main__.py
hands over to sparseattn_launcher.main, which puts Python's handler back once the command's
imports are done. Nothing is written before then, so nothing is left half written.
"""

import os
import signal
import sys


def exit_interrupted(signum, frame) -> None:
    sys.stderr.write("sparseattn: interrupted\n")
    sys.stderr.flush()
    os._exit(130)


if sys.argv[:1] == ["-m"] and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, exit_interrupted)
