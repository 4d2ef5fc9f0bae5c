"""The ``attnprobe`` command: models, extract, heads, syntax, compare, perturb, report.

Every command exits non-zero with a one-line message on bad input (2; 130 on Ctrl-C). Each
command family lives in one module of :mod:`attnprobe.commands` with a ``register(sub)``
function; adding a command is adding its module to :data:`COMMANDS`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from attnprobe.commands import census, compare, diff, extract, models, perturb, report
from attnprobe.commands.common import Parser, distributed_group
from attnprobe.core.version import __version__
from attnprobe.errors import AttnProbeError

__all__ = ["COMMANDS", "build_parser", "distributed_group", "main"]

COMMANDS = (models, extract, census, compare, perturb, report, diff)


def build_parser() -> Parser:
    parser = Parser(prog="attnprobe", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"attnprobe {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in COMMANDS:
        command.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.run(args)
    except KeyboardInterrupt:
        print("attnprobe: interrupted", file=sys.stderr)
        return 130
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
