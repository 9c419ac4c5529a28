"""The `sparseattn` command's entry point. It lives outside the package because importing
sparseattn (and torch with it) takes a second or two, and a Ctrl-C in that time should end in one
line and exit 130, as it does once the command runs, not in a traceback from inside the import.
`python -m sparseattn` runs it too (sparseattn/__main__.py), after the package's own import, which
sparseattn/_start.py covers in the same way."""

import os
import signal
import sys


def _interrupted(signum, frame) -> None:
    # exits at once: a KeyboardInterrupt raised inside third-party imports can be swallowed or
    # turned into another error there (numpy half-imported, then AttributeError or RecursionError)
    sys.stderr.write("sparseattn: interrupted\n")
    sys.stderr.flush()
    os._exit(130)


def main() -> int:
    # during start-up nothing is written yet, so Ctrl-C may end the process without cleanup; a SIGINT
    # that the parent set to ignored stays ignored (under `python -m`, sparseattn/_start.py's handler
    # may already be there)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupted)
    try:
        from sparseattn.train.cli import main as run

        if sys.argv[1:] and sys.argv[1] not in ("-h", "--help"):
            # torch imports this on the first optimizer or custom-op call: here, it is covered too
            import torch._dynamo  # noqa: F401
    finally:
        if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # Python's handler, as at start-up
            signal.signal(signal.SIGINT, signal.default_int_handler)
    return run()


if __name__ == "__main__":
    sys.exit(main())
