"""Ctrl-C while the ``attnprobe`` command starts: one line and exit 130, as later on.

Starting the command imports torch, pandas and every command module, which takes seconds.
Python's own handler would turn a Ctrl-C there into a traceback through the imports and end
the process by the signal (exit −2). So this module, the first that ``import attnprobe``
loads, calls :func:`guard_startup` when imported: in the ``attnprobe`` command (and
``python -m attnprobe.cli``) only, it installs a handler that prints
``attnprobe: interrupted`` and exits 130. Once :func:`attnprobe.cli.main` runs,
:func:`end_startup` gives Ctrl-C back to Python, whose ``KeyboardInterrupt`` ``main`` turns
into the same line and code. A library import (a script, a notebook) is left alone.
Standard library only: this runs before anything heavy.
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from types import FrameType

__all__ = ["EXIT_INTERRUPTED", "INTERRUPTED", "end_startup", "guard_startup", "is_command"]

EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for a process ended by Ctrl-C
INTERRUPTED = "attnprobe: interrupted"
COMMAND_NAMES = frozenset({"attnprobe", "attnprobe.exe", "attnprobe-script.py"})


def is_command() -> bool:
    """Whether this process is the ``attnprobe`` command: its console script, or
    ``python -m attnprobe.cli`` (whose package is imported while ``argv[0]`` is ``-m``)."""
    first = sys.argv[0] if sys.argv else ""
    if Path(first).name in COMMAND_NAMES:
        return True
    return first == "-m" and "attnprobe.cli" in getattr(sys, "orig_argv", ())


def _interrupted(signum: int, frame: FrameType | None) -> None:
    print(INTERRUPTED, file=sys.stderr, flush=True)
    raise SystemExit(EXIT_INTERRUPTED)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def guard_startup() -> None:
    """In the ``attnprobe`` command, make Ctrl-C during start-up one line and exit 130 (a
    handler of the caller's own, or a library import, is left as it is)."""
    if is_command() and _in_main_thread() and \
            signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupted)


def end_startup() -> None:
    """Start-up is over: Ctrl-C raises ``KeyboardInterrupt`` again (the command catches it)."""
    if _in_main_thread() and signal.getsignal(signal.SIGINT) is _interrupted:
        signal.signal(signal.SIGINT, signal.default_int_handler)


guard_startup()  # on import: attnprobe/__init__ imports this module before anything heavy
