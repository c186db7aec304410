"""Ctrl-C that is never lost.

Python turns SIGINT into a KeyboardInterrupt wherever the main thread happens to be. When that is
inside a ``__del__`` (the ``regex`` module's, while a tokenizer is trained) or a callback a library
calls, Python prints "Exception ignored in ..." and carries on: the run goes on as if nothing had
been pressed. :func:`watch` (the command line installs it) records every SIGINT and SIGTERM as well
as raising; :func:`check` raises KeyboardInterrupt when one was recorded, and the places where a long
run can stop cleanly call it (every progress update, every demo stage), so a lost interrupt still
stops the run there. :func:`seen` tells the command line, once the command returned, that it was
interrupted all the same.
"""

from __future__ import annotations

import contextlib
import signal
import threading

_seen = threading.Event()


def _on_signal(signum, frame) -> None:
    _seen.set()
    raise KeyboardInterrupt  # a kill (SIGTERM) unwinds like Ctrl-C: partial files are removed on the way out


@contextlib.contextmanager
def watch():
    """Record SIGINT and SIGTERM while the block runs (the process's handlers come back after it).
    Outside the main thread, where handlers cannot be set, nothing is installed."""
    _seen.clear()
    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[sig] = signal.signal(sig, _on_signal)
        except ValueError:  # not the main thread
            pass
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _seen.clear()  # what the block did not act on does not outlive it


def seen() -> bool:
    """Whether an interrupt arrived since :func:`watch` started (even one that something swallowed)."""
    return _seen.is_set()


def check() -> None:
    """Raise KeyboardInterrupt if an interrupt arrived (one swallowed where it landed included); in the
    main thread only, where the command can unwind (other threads carry on until it does)."""
    if _seen.is_set() and threading.current_thread() is threading.main_thread():
        raise KeyboardInterrupt
