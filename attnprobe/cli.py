"""The ``attnprobe`` command: ``attnprobe models`` and ``attnprobe extract``.

Every command exits non-zero with a one-line message on bad input.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from attnprobe.errors import AttnProbeError
from attnprobe.types import save_maps

TABLE_SUFFIXES = (".csv", ".parquet", ".json")


def _int_list(text: str) -> list[int]:
    """``"0,2,5"`` or ``"0-3"`` -> model indices."""
    values: list[int] = []
    try:
        for part in text.split(","):
            if "-" in part.strip()[1:]:
                lo, hi = part.split("-", 1)
                values.extend(range(int(lo), int(hi) + 1))
            elif part.strip():
                values.append(int(part))
    except ValueError:
        message = f"expected indices like 0,2 or 0-3; got {text!r}"
        raise argparse.ArgumentTypeError(message) from None
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"indices must be non-negative; got {text!r}")
    return values


def _texts(args: argparse.Namespace) -> list[str]:
    texts = list(args.text or [])
    if args.text_file:
        path = Path(args.text_file)
        if not path.is_file():
            raise AttnProbeError(f"text file not found: {path}")
        texts.extend(line.strip() for line in path.read_text(encoding="utf-8").splitlines()
                     if line.strip())
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
        print(f"  {REF_PREFIX}{name:<14} {doc[0] if doc else ''}")
    print("tested HuggingFace families (any local model directory of these loads with --model "
          "PATH):")
    print("  " + ", ".join(TESTED_FAMILIES))
    return 0


def cmd_extract(args: argparse.Namespace) -> int:
    from attnprobe.extraction import check_texts, extract
    from attnprobe.heads.summary import summarize
    from attnprobe.loading import load_model

    texts = check_texts(_texts(args))
    model, tokenizer = load_model(args.model)
    maps = extract(model, tokenizer, texts, layers=args.layers, heads=args.heads,
                   batch_size=args.batch_size, max_length=args.max_length,
                   truncation=args.truncate)
    summary = summarize(maps)
    with pd.option_context("display.max_rows", args.show, "display.width", 120,
                           "display.float_format", "{:.3f}".format):
        print(summary.drop(columns=["stack"]).to_string(index=False, max_rows=args.show))
    out = Path(args.out)
    if out.suffix in TABLE_SUFFIXES:
        write_table(pd.concat([m.to_frame() for m in maps], ignore_index=True), out)
    elif out.suffix == ".npz":
        save_maps(maps, out)
    else:
        raise AttnProbeError(f"--out must end in .npz or {', '.join(TABLE_SUFFIXES)}; got {out}")
    print(f"wrote {len(maps)} maps for {len(texts)} texts to {out}", file=sys.stderr)
    return 0


def _text_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="minilm",
                        help="minilm (default), ref:<name>, or a local HF model directory")
    parser.add_argument("--text", action="append", help="a text (repeatable)")
    parser.add_argument("--text-file", help="a UTF-8 file with one text per line")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnprobe", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    models = sub.add_parser("models", help="list reference models and tested HF families")
    models.set_defaults(run=cmd_models)

    extract = sub.add_parser("extract", help="capture attention maps and print a per-head summary")
    _text_args(extract)
    extract.add_argument("--out", default="maps.npz",
                         help="maps.npz (+ .json sidecar), or a tidy table .csv/.parquet/.json")
    extract.add_argument("--layers", type=_int_list, help="model layer indices, e.g. 0,2 or 0-3")
    extract.add_argument("--heads", type=_int_list, help="head indices, e.g. 0,8")
    extract.add_argument("--batch-size", type=int, default=16)
    extract.add_argument("--max-length", type=int, help="cap on tokens per text")
    extract.add_argument("--truncate", action="store_true",
                         help="cut texts longer than the model allows instead of failing")
    extract.add_argument("--show", type=int, default=20, help="summary rows to print")
    extract.set_defaults(run=cmd_extract)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except (AttnProbeError, KeyError) as exc:
        message = exc.args[0] if exc.args else type(exc).__name__
        print(f"attnprobe: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
