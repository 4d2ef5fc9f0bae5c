"""The ``attnprobe`` command: ``models``, ``extract``, ``heads`` and ``syntax``.

Every command exits non-zero with a one-line message on bad input.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import textwrap
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from attnprobe.errors import AttnProbeError
from attnprobe.types import save_maps

TABLE_SUFFIXES = (".csv", ".parquet", ".json")


_INDEX_ITEM = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")
MAX_INDICES = 4096  # no model has more layers or heads; stops "0-99999999" early
MAX_SKIPPED_SHOWN = 10  # ids of skipped sentences listed on stderr


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


def _texts(args: argparse.Namespace,
           hint: str = "pass --text \"...\" or --text-file FILE (one text a line)") -> list[str]:
    texts = list(args.text or [])
    if args.text_file:
        path = Path(args.text_file)
        if not path.is_file():
            raise AttnProbeError(f"text file not found: {path}")
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError:
            raise AttnProbeError(f"{path} is not UTF-8 text") from None
        found = [line.strip() for line in lines if line.strip()]
        if not found:
            raise AttnProbeError(f"text file {path} has no text (every line is blank)")
        texts.extend(found)
    if not texts:
        raise AttnProbeError(f"no text: {hint}")
    return texts


def _corpus(args: argparse.Namespace) -> tuple[list[str] | None, list[Any] | None]:
    """``(texts, None)`` from --text/--text-file, or ``(None, trees)`` from --conllu."""
    if args.conllu is None:
        return _texts(args, "pass --text \"...\", --text-file FILE or --conllu FILE"), None
    if args.text or args.text_file:
        raise AttnProbeError("--conllu cannot be combined with --text/--text-file; give one "
                             "source of sentences")
    from attnprobe.heads.trees import read_conllu

    return None, read_conllu(Path(args.conllu))


def _check_out(out: str | None, option: str) -> Path | None:
    """A table path (``.csv``/``.parquet``/``.json``) whose folder exists; checked before
    the run, so a typo does not cost a census."""
    if out is None:
        return None
    path = Path(out)
    if path.suffix not in TABLE_SUFFIXES:
        raise AttnProbeError(f"{option} must end in {', '.join(TABLE_SUFFIXES)}; got {out}")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def write_table(frame: pd.DataFrame, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".csv":
        frame.to_csv(out, index=False)
    elif out.suffix == ".parquet":
        try:
            frame.to_parquet(out, index=False)
        except ImportError:
            raise AttnProbeError("writing .parquet needs pyarrow (pip install pyarrow); "
                                 "or use .csv/.json") from None
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


@contextlib.contextmanager
def distributed_group(enabled: bool) -> Iterator[tuple[int, int]]:
    """``(rank, world_size)`` of this process; with ``enabled`` and ``WORLD_SIZE > 1`` in the
    environment (as ``torchrun`` sets it) a gloo ``torch.distributed`` process group is
    initialised from the environment variables and destroyed on exit, also on error.
    Otherwise nothing is initialised and this is ``(0, 1)``."""
    raw = os.environ.get("WORLD_SIZE", "1") if enabled else "1"
    try:
        world = int(raw)
    except ValueError:
        raise AttnProbeError(f"WORLD_SIZE must be a whole number; got {raw!r}") from None
    if world <= 1:
        yield 0, 1
        return
    import torch.distributed as dist

    if not dist.is_available():
        raise AttnProbeError("--distributed: this torch build has no torch.distributed")
    if dist.is_initialized():  # someone else owns the group; use it, leave it alone
        yield dist.get_rank(), dist.get_world_size()
        return
    try:
        dist.init_process_group("gloo")
    except (ValueError, RuntimeError) as exc:
        raise AttnProbeError(f"--distributed: cannot start the process group "
                             f"(run under torchrun): {exc}") from None
    try:
        yield dist.get_rank(), dist.get_world_size()
    finally:
        dist.destroy_process_group()


def _run_census(args: argparse.Namespace, *, syntax: bool, similarity: bool, repeated: bool,
                from_agg: str = "mean", world: int = 1, rank: int = 0) -> Any:
    """Load the model, read the sentences, run the census; report skipped sentences."""
    from attnprobe.heads.head_census import census
    from attnprobe.loading import load_model

    texts, trees = _corpus(args)
    model, tokenizer = load_model(args.model)
    result = census(model, tokenizer, texts, trees=trees, syntax=syntax if texts else None,
                    similarity=similarity, repeated=repeated, batch_size=args.batch_size,
                    max_length=args.max_length, on_long="skip" if args.skip_long else "error",
                    from_agg=from_agg, distributed=world > 1, progress=not args.quiet)
    if result.skipped and rank == 0:
        shown = ", ".join(result.skipped[:MAX_SKIPPED_SHOWN])
        more = len(result.skipped) - MAX_SKIPPED_SHOWN
        print(f"skipped {_count(len(result.skipped), 'sentence')} longer than the model allows "
              f"(ids: {shown}{f', ... and {more} more' if more > 0 else ''})", file=sys.stderr)
    return result


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _wrote(args: argparse.Namespace, what: str, path: Path) -> None:
    if not args.quiet:
        print(f"wrote {what} to {path}", file=sys.stderr)


def cmd_heads(args: argparse.Namespace) -> int:
    from attnprobe.heads.labels import PRECEDENCE

    out = _check_out(args.out, "--out")
    profile = _check_out(args.profile, "--profile")
    distances = _check_out(args.distances, "--distances")
    if distances is not None and args.no_similarity:
        raise AttnProbeError("--distances needs head similarity; drop --no-similarity")
    with distributed_group(args.distributed) as (rank, world):
        result = _run_census(args, syntax=args.syntax, similarity=not args.no_similarity,
                             repeated=not args.no_repeated, world=world, rank=rank)
        if rank != 0:
            return 0
        table = result.classify()
        write_table(table, out)
        _wrote(args, f"{len(table)} heads", out)
        if profile is not None:
            write_table(result.layer_profile(), profile)
            _wrote(args, "the layer profile", profile)
        if distances is not None:
            write_table(result.distances(), distances)
            _wrote(args, "head distances", distances)
        counts = table["label"].value_counts()
        print(f"{_count(result.n_sentences, 'sentence')}, {len(table)} heads"
              + (f" ({len(result.skipped)} skipped)" if result.skipped else ""))
        for label in PRECEDENCE:
            if counts.get(label, 0):
                print(f"  {label:<18} {counts[label]}")
    return 0


def cmd_syntax(args: argparse.Namespace) -> int:
    out = _check_out(args.out, "--out")
    with distributed_group(args.distributed) as (rank, world):
        result = _run_census(args, syntax=True, similarity=False, repeated=False,
                             from_agg=args.from_agg, world=world, rank=rank)
        if rank != 0:
            return 0
        table = result.syntax(args.min_count)
        write_table(table, out)
        _wrote(args, f"{len(table)} relations", out)
        columns = ["relation", "head_id", "accuracy", "baseline", "margin", "count"]
        if table[["stack", "kind"]].drop_duplicates().shape[0] > 1:  # encoder-decoder
            columns = ["stack", "kind", *columns]
        print(_count(result.n_sentences, "sentence")
              + (f" ({len(result.skipped)} skipped)" if result.skipped else ""))
        if table.empty:
            print(f"no relation has at least {args.min_count} words")
        else:
            with pd.option_context("display.width", 120, "display.max_rows", None,
                                   "display.float_format", "{:.3f}".format):
                print(table[columns].to_string(index=False))
    return 0


def _text_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="minilm",
                        help="minilm (default), ref:<name>, or a local HF model directory")
    parser.add_argument("--text", action="append", help="a text (repeatable)")
    parser.add_argument("--text-file", help="a UTF-8 file with one text per line")


def _census_args(parser: argparse.ArgumentParser) -> None:
    """Options shared by ``heads`` and ``syntax``."""
    _text_args(parser)
    parser.add_argument("--conllu", help="a CoNLL-U file of dependency trees (instead of text)")
    parser.add_argument("--batch-size", type=_positive, default=32, help="sentences per batch")
    parser.add_argument("--max-length", type=_positive, help="cap on tokens per sentence")
    parser.add_argument("--skip-long", action="store_true",
                        help="leave out sentences longer than the model allows (listed on "
                             "stderr) instead of failing")
    parser.add_argument("--distributed", action="store_true",
                        help="under torchrun (WORLD_SIZE > 1): split the batches over the "
                             "processes (gloo); rank 0 writes and prints. No-op otherwise")
    parser.add_argument("--quiet", action="store_true",
                        help="no progress bar or 'wrote' notes on stderr")


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


def _positive(text: str) -> int:
    value = _non_negative(text)
    if value == 0:
        raise argparse.ArgumentTypeError("expected a number >= 1; got 0")
    return value


EXTRACT_EXAMPLE = """example:
  attnprobe extract --model minilm --text "The cat sat on the mat." --layers 0-1 --out maps.npz
"""
HEADS_EXAMPLE = """examples:
  attnprobe heads --model minilm --text-file sentences.txt --out heads.csv
  attnprobe heads --model minilm --conllu en_ewt-ud-dev.conllu --skip-long --out heads.parquet \\
      --profile layers.csv --distances distances.csv

{about}
Under torchrun:
  torchrun --nproc-per-node 2 -m attnprobe.cli heads --distributed --text-file s.txt --out h.csv
"""
SYNTAX_EXAMPLE = """examples:
  attnprobe syntax --model minilm --conllu en_ewt-ud-dev.conllu --min-count 20 --out syntax.csv
  attnprobe syntax --model minilm --text "The cat chased a small mouse." --out syntax.csv

Writes one row per relation (plus 'all', every non-root word): the best head and direction,
its accuracy, the best fixed-offset baseline (baseline, baseline_offset), margin = accuracy -
baseline, and count (words with the relation). Text is parsed with spaCy (spaCy labels).
"""


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="attnprobe", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    models = sub.add_parser("models", help="list reference models and tested HF families")
    models.set_defaults(run=cmd_models)

    extract = sub.add_parser("extract", help="capture attention maps and print a per-head summary",
                             epilog=EXTRACT_EXAMPLE,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
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

    from attnprobe.heads.labels import PRECEDENCE

    heads = sub.add_parser("heads", help="label every head from its scores over a corpus",
                           epilog=HEADS_EXAMPLE.format(about=textwrap.fill(
                               "Writes one row per head: label (the first rule that fired, in "
                               f"this order: {', '.join(PRECEDENCE)}), evidence, also (other "
                               "rules that fired) and every score.", 90)),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    _census_args(heads)
    heads.add_argument("--out", default="heads.csv",
                       help="per-head table: .csv, .parquet or .json (default heads.csv)")
    heads.add_argument("--syntax", action="store_true",
                       help="parse --text/--text-file with spaCy so syntax scores join the "
                            "table (implied by --conllu)")
    heads.add_argument("--no-similarity", action="store_true",
                       help="skip head-to-head Jensen-Shannon distances (faster)")
    heads.add_argument("--no-repeated", action="store_true",
                       help="skip the repeated-random-token probe (no rep_* scores, no "
                            "induction/duplicate labels)")
    heads.add_argument("--profile", help="also write the per-layer profile table here")
    heads.add_argument("--distances", help="also write head-pair JS distances here")
    heads.set_defaults(run=cmd_heads)

    syntax = sub.add_parser("syntax", help="best head per dependency relation vs an offset "
                                           "baseline", epilog=SYNTAX_EXAMPLE,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    _census_args(syntax)
    syntax.add_argument("--out", default="syntax.csv",
                        help="per-relation table: .csv, .parquet or .json (default syntax.csv)")
    syntax.add_argument("--min-count", type=_positive, default=1,
                        help="leave out relations with fewer words (default 1)")
    syntax.add_argument("--from-agg", choices=("mean", "first", "max"), default="mean",
                        help="attention from a word split into pieces: mean (default), "
                             "first piece, or max over its pieces")
    syntax.set_defaults(run=cmd_syntax)
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
