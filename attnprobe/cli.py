"""The ``attnprobe`` command: models, extract, heads, syntax, compare, perturb, report.

Every command exits non-zero with a one-line message on bad input. Commands beyond
``models`` and ``extract`` live in :mod:`attnprobe.commands`, one module per family.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from attnprobe.commands import census as census_commands
from attnprobe.commands import compare as compare_commands
from attnprobe.commands import perturb as perturb_commands
from attnprobe.commands import report as report_commands
from attnprobe.commands.common import (
    TABLE_SUFFIXES,
    Parser,
    distributed_group,
    int_list,
    non_negative,
    text_args,
    texts_from_args,
    write_table,
)
from attnprobe.errors import AttnProbeError
from attnprobe.types import save_maps

__all__ = ["build_parser", "distributed_group", "main"]


def cmd_models(args: argparse.Namespace) -> int:
    from attnprobe.loading import DEFAULT_MODEL, REF_PREFIX, TESTED_FAMILIES
    from attnprobe.models import REFERENCE_MODELS

    print(f"default: {DEFAULT_MODEL} (all-MiniLM-L6-v2, packaged, offline)")
    print("reference models:")
    for name in REFERENCE_MODELS.names():
        doc = (REFERENCE_MODELS.get(name).__doc__ or "").strip().splitlines()
        print(f"  {REF_PREFIX}{name:<18} {doc[0] if doc else ''}")
    print("tested HuggingFace families (any local model directory of these loads with --model "
          "PATH):")
    print("  " + ", ".join(TESTED_FAMILIES))
    return 0


def cmd_extract(args: argparse.Namespace) -> int:
    from attnprobe.extraction import check_texts, extract
    from attnprobe.heads.summary import summarize
    from attnprobe.loading import load_model

    texts = check_texts(texts_from_args(args))
    out = Path(args.out)
    if out.suffix not in (".npz", *TABLE_SUFFIXES):
        raise AttnProbeError(f"--out must end in .npz or {', '.join(TABLE_SUFFIXES)}; got {out}")
    out.parent.mkdir(parents=True, exist_ok=True)  # fail before the run, not after
    model, tokenizer = load_model(args.model)
    maps = extract(model, tokenizer, texts, layers=args.layers, heads=args.heads,
                   batch_size=args.batch_size, max_length=args.max_length,
                   truncation=args.truncate)
    summary = summarize(maps)
    with pd.option_context("display.max_rows", args.show, "display.width", 120,
                           "display.float_format", "{:.3f}".format):
        print(summary.drop(columns=["stack"]).to_string(index=False, max_rows=args.show))
    if out.suffix in TABLE_SUFFIXES:
        write_table(pd.concat([m.to_frame() for m in maps], ignore_index=True), out)
    else:
        save_maps(maps, out)
    if args.bertviz:
        from attnprobe.report.bertviz import save_bertviz

        save_bertviz(maps, args.bertviz)
        print(f"wrote BertViz data for {len(maps)} maps to {args.bertviz}", file=sys.stderr)
    print(f"wrote {len(maps)} maps for {len(texts)} texts to {out}", file=sys.stderr)
    return 0


EXTRACT_EXAMPLE = """example:
  attnprobe extract --model minilm --text "The cat sat on the mat." --layers 0-1 --out maps.npz
"""


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="attnprobe", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    models = sub.add_parser("models", help="list reference models and tested HF families")
    models.set_defaults(run=cmd_models)

    extract = sub.add_parser("extract", help="capture attention maps and print a per-head summary",
                             epilog=EXTRACT_EXAMPLE,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    text_args(extract)
    extract.add_argument("--out", default="maps.npz",
                         help="maps.npz (+ .json sidecar), or a tidy table .csv/.parquet/.json")
    extract.add_argument("--bertviz", metavar="PATH",
                         help="also write the maps as BertViz JSON (attnprobe.report.bertviz)")
    extract.add_argument("--layers", type=int_list, help="model layer indices, e.g. 0,2 or 0-3")
    extract.add_argument("--heads", type=int_list, help="head indices, e.g. 0,8")
    extract.add_argument("--batch-size", type=non_negative, default=16)
    extract.add_argument("--max-length", type=non_negative, help="cap on tokens per text")
    extract.add_argument("--truncate", action="store_true",
                         help="cut texts longer than the model allows instead of failing")
    extract.add_argument("--show", type=non_negative, default=20, help="summary rows to print")
    extract.set_defaults(run=cmd_extract)
    census_commands.register(sub)
    compare_commands.register(sub)
    report_commands.register(sub)
    perturb_commands.register(sub)

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.run(args)
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
