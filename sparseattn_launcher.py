"""The `sparseattn` command's entry point. It lives outside the package because importing
sparseattn (and torch with it) takes a second or two, and a Ctrl-C in that time should end in one
line and exit 130, as it does once the command runs, not in a traceback from inside the import."""

import sys


def main() -> int:
    try:
        from sparseattn.train.cli import main as run
    except KeyboardInterrupt:
        print("sparseattn: interrupted", file=sys.stderr)
        return 130
    return run()


if __name__ == "__main__":
    sys.exit(main())
