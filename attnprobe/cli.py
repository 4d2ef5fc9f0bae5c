"""The ``attnprobe`` command: ``attnprobe models`` and ``attnprobe extract``.

Every command exits non-zero with a one-line message on bad input.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from attnprobe.errors import AttnProbeError
from attnprobe.types import save_maps

TABLE_SUFFIXES = (".csv", ".parquet", ".json")


_INDEX_ITEM = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")
MAX_INDICES = 4096  # no model has more layers or heads; stops "0-99999999" early


def _int_list(text: str) -> list[int]:
    """``"0,2,5"`` or ``"0-3"`` -> model indices."""
    values: list[int] = []
    for part in text.split(","):
        match = _INDEX_ITEM.match(part)
        if not match:
            raise argparse.ArgumentTypeError(f"expected indices like 0,2 or 0-3; got {text!r}")
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) is not None else low
        if high < low or high - low >= MAX_INDICES:
            raise argparse.ArgumentTypeError(f"bad range {part.strip()!r} in {text!r}")
        values.extend(range(low, high + 1))
    return values


def _texts(args: argparse.Namespace) -> list[str]:
    texts = list(args.text or [])
    if args.text_file:
        path = Path(args.text_file)
        if not path.is_file():
            raise AttnProbeError(f"text file not found: {path}")
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError:
            raise AttnProbeError(f"{path} is not UTF-8 text") from None
        texts.extend(line.strip() for line in lines if line.strip())
    if not texts:
        raise AttnProbeError("no text: pass --text \"...\" or --text-file FILE (one text a line)")
    return texts


def write_table(frame: pd.DataFrame, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".csv":
        frame.to_csv(out, index=False)
    elif out.suffix == ".parquet":
        frame.to_parquet(out, index=False)
    elif out.suffix == ".json":
        frame.to_json(out, orient="records", indent=1)
    else:
        raise AttnProbeError(f"unsupported output suffix {out.suffix!r}; use "
                             f"{', '.join(TABLE_SUFFIXES)}")


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

    texts = check_texts(_texts(args))
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
    print(f"wrote {len(maps)} maps for {len(texts)} texts to {out}", file=sys.stderr)
    return 0


def _text_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="minilm",
                        help="minilm (default), ref:<name>, or a local HF model directory")
    parser.add_argument("--text", action="append", help="a text (repeatable)")
    parser.add_argument("--text-file", help="a UTF-8 file with one text per line")


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line (the usage is in --help)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"attnprobe: error: {message}\n")


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number; got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0; got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="attnprobe", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    models = sub.add_parser("models", help="list reference models and tested HF families")
    models.set_defaults(run=cmd_models)

    extract = sub.add_parser("extract", help="capture attention maps and print a per-head summary")
    _text_args(extract)
    extract.add_argument("--out", default="maps.npz",
                         help="maps.npz (+ .json sidecar), or a tidy table .csv/.parquet/.json")
    extract.add_argument("--layers", type=_int_list, help="model layer indices, e.g. 0,2 or 0-3")
    extract.add_argument("--heads", type=_int_list, help="head indices, e.g. 0,8")
    extract.add_argument("--batch-size", type=_non_negative, default=16)
    extract.add_argument("--max-length", type=_non_negative, help="cap on tokens per text")
    extract.add_argument("--truncate", action="store_true",
                         help="cut texts longer than the model allows instead of failing")
    extract.add_argument("--show", type=_non_negative, default=20, help="summary rows to print")
    extract.set_defaults(run=cmd_extract)
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
