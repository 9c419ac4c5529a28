"""Interrupts during training: the first Ctrl-C or SIGTERM lets the step finish, a second one aborts."""

from __future__ import annotations

import signal
import sys
import threading
from contextlib import contextmanager
from typing import Callable


@contextmanager
def deferred_interrupt(then: Callable[[], str] = lambda: "saving a checkpoint"):
    """The first Ctrl-C or SIGTERM (what `timeout` and job schedulers send) sets flag["stop"]: the
    loop finishes its step, saves and exits (`then()` says what follows the step). A second one
    raises at once."""
    flag = {"stop": False}
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def handler(signum, frame):
        if flag["stop"]:
            raise KeyboardInterrupt
        flag["stop"] = True
        name = "SIGTERM" if signum == signal.SIGTERM else "interrupt"
        print(f"\n{name}: finishing this step and {then()} (again to abort)", file=sys.stderr)

    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield flag
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)
