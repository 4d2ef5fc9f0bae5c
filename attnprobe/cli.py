"""The ``attnprobe`` command: models, extract, heads, syntax, compare, faithfulness, perturb,
patch, report.

Every command exits non-zero with a one-line message on bad input (2; 130 on Ctrl-C, also
while the command starts: :mod:`attnprobe.core.interrupt`). Each
command family lives in one module of :mod:`attnprobe.commands` with a ``register(sub)``
function; adding a command is adding its module to :data:`COMMANDS`.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Sequence
from typing import Any

from attnprobe.commands import (
    compare,
    diff,
    extract,
    faithfulness,
    heads,
    models,
    patch,
    perturb,
    report,
)
from attnprobe.commands.common import Parser, distributed_group
from attnprobe.core.interrupt import EXIT_INTERRUPTED, INTERRUPTED, end_startup
from attnprobe.core.version import __version__
from attnprobe.errors import AttnProbeError

__all__ = ["COMMANDS", "build_parser", "distributed_group", "main", "show_warning"]

COMMANDS = (models, extract, heads, compare, faithfulness, perturb, patch, report, diff)


def build_parser() -> Parser:
    parser = Parser(prog="attnprobe", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"attnprobe {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in COMMANDS:
        command.register(sub)
    return parser


def show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                 file: Any = None, line: str | None = None) -> None:
    """A warning as the command prints it: one line on stderr, like its errors (Python's
    default adds the file, line and source line of the code that warned)."""
    print(f"attnprobe: warning: {' '.join(str(message).split())}", file=file or sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        end_startup()  # Ctrl-C raises KeyboardInterrupt from here on (attnprobe.core.interrupt)
        with warnings.catch_warnings():
            warnings.showwarning = show_warning
            args = build_parser().parse_args(argv)
            args.run(args)
    except KeyboardInterrupt:
        print(INTERRUPTED, file=sys.stderr)
        return EXIT_INTERRUPTED
    except AttnProbeError as exc:
        message = exc.args[0] if exc.args else type(exc).__name__
    except OSError as exc:  # unwritable --out, unreadable files
        message = f"{exc.strerror or exc}: {exc.filename}" if exc.filename else str(exc)
    else:
        return 0
    print(f"attnprobe: error: {' '.join(str(message).split())}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
