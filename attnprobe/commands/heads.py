"""``attnprobe heads`` and ``attnprobe syntax``: the head census from the command line (the
per-head table, and the per-relation syntax table of the same census)."""

from __future__ import annotations

import argparse
import textwrap
from typing import Any

import pandas as pd

from attnprobe.commands.common import (
    check_tables,
    corpus_args,
    corpus_from_args,
    corpus_of,
    count_noun,
    distributed_group,
    positive,
    report_skipped,
    write_table,
    wrote,
)
from attnprobe.errors import AttnProbeError


def _run_census(args: argparse.Namespace, *, syntax: bool, similarity: bool, repeated: bool,
                from_agg: str = "mean", world: int = 1, rank: int = 0,
                probe_length: int | None = None) -> Any:
    """Load the model, read the sentences, run the census; report skipped sentences."""
    from attnprobe.commands.load_args import load_options_of
    from attnprobe.heads.head_census import census
    from attnprobe.loading import load_model

    texts, trees = corpus_from_args(args)
    model, tokenizer = load_model(args.model, **load_options_of(args))
    result = census(model, tokenizer, texts, trees=trees, syntax=syntax if texts else None,
                    similarity=similarity, repeated=repeated, probe_length=probe_length,
                    from_agg=from_agg, corpus=corpus_of(args, world=world))
    if rank == 0:
        report_skipped(result.skipped, "sentence")
    return result


def label_summary(labels: pd.Series) -> list[str]:
    """Lines of the label counts grouped by family (families and labels in precedence order):
    each family with its count, then its labels' counts when it has labels of another name."""
    from attnprobe.heads.labels import RULES

    counts = labels.value_counts()
    lines = []
    for family in RULES.families():
        members = [(label, int(counts.get(label, 0))) for label in RULES.labels_of(family)]
        total = sum(n for _, n in members)
        if not total:
            continue
        lines.append(f"  {family:<18} {total}")
        lines += [f"    {label:<16} {n}" for label, n in members if n and label != family]
    return lines


def cmd_heads(args: argparse.Namespace) -> int:
    out, profile, distances = check_tables(args, ("--out", args.out),
                                           ("--profile", args.profile),
                                           ("--distances", args.distances))
    if distances is not None and args.no_similarity:
        raise AttnProbeError("--distances needs head similarity; drop --no-similarity")
    if args.probe_length is not None and args.no_repeated:
        raise AttnProbeError("--probe-length needs the repeated-token probe; drop --no-repeated")
    with distributed_group(args.distributed) as (rank, world):
        result = _run_census(args, syntax=args.syntax, similarity=not args.no_similarity,
                             repeated=not args.no_repeated, world=world, rank=rank,
                             probe_length=args.probe_length)
        if rank != 0:
            return 0
        table = result.classify()
        write_table(table, out)
        wrote(args, f"{len(table)} heads", out)
        if profile is not None:
            write_table(result.layer_profile(), profile)
            wrote(args, "the layer profile", profile)
        if distances is not None:
            write_table(result.distances(), distances)
            wrote(args, "head distances", distances)
        print(f"{count_noun(result.n_sentences, 'sentence')}, {len(table)} heads"
              + (f" ({len(result.skipped)} skipped)" if result.skipped else "")
              + (f"; probe 2 x {result.probe_length} tokens" if result.probe_length else ""))
        for line in label_summary(table["label"]):
            print(line)
    return 0


def cmd_syntax(args: argparse.Namespace) -> int:
    (out,) = check_tables(args, ("--out", args.out))
    with distributed_group(args.distributed) as (rank, world):
        result = _run_census(args, syntax=True, similarity=False, repeated=False,
                             from_agg=args.from_agg, world=world, rank=rank)
        if rank != 0:
            return 0
        table = result.syntax(args.min_count)
        write_table(table, out)
        wrote(args, f"{len(table)} relations", out)
        rarer = len(result.syntax(1)) - len(table)
        columns = ["relation", "head_id", "accuracy", "baseline", "margin", "count"]
        if table[["stack", "kind"]].drop_duplicates().shape[0] > 1:  # encoder-decoder
            columns = ["stack", "kind", *columns]
        print(count_noun(result.n_sentences, "sentence")
              + (f" ({len(result.skipped)} skipped)" if result.skipped else ""))
        if table.empty:
            print(f"no relation has at least {args.min_count} words")
        else:
            with pd.option_context("display.width", 120, "display.max_rows", None,
                                   "display.float_format", "{:.3f}".format):
                print(table[columns].to_string(index=False))
        if rarer:
            print(f"{count_noun(rarer, 'relation')} with fewer than {args.min_count} words "
                  "left out (--min-count 1 lists every one)")
    return 0


def _census_args(parser: argparse.ArgumentParser) -> None:
    """Options shared by ``heads`` and ``syntax``."""
    corpus_args(parser, batch_help="sentences per forward",
                seed_help="seeds the repeated-random-token probe (default 0)")
    parser.add_argument("--conllu", help="a CoNLL-U file of dependency trees (instead of text)")


HEADS_EXAMPLE = """examples:
  attnprobe heads --model minilm --text-file sentences.txt --out heads.csv
  attnprobe heads --model minilm --conllu en_ewt-ud-dev.conllu --skip-long --out heads.parquet \\
      --profile layers.csv --distances distances.csv

{about}
Under torchrun:
  torchrun --nproc-per-node 2 -m attnprobe.cli heads --distributed --text-file s.txt --out h.csv
"""
SYNTAX_EXAMPLE = """examples:
  attnprobe syntax --model minilm --conllu en_ewt-ud-dev.conllu --out syntax.csv
  attnprobe syntax --model minilm --text "The cat chased a small mouse." --min-count 1 \\
      --out syntax.csv

Writes one row per relation of at least --min-count words (plus 'all', every non-root word):
the best head and direction, its accuracy, the best fixed-offset baseline (baseline,
baseline_offset), margin = accuracy - baseline, and count (words with the relation). Text is
parsed with spaCy (spaCy labels).
"""


def register(sub: Any) -> None:
    """Add ``heads`` and ``syntax`` to the ``attnprobe`` sub-command parsers."""
    from attnprobe.heads.head_census import MIN_COUNT
    from attnprobe.heads.labels import PRECEDENCE, RULES

    heads = sub.add_parser("heads", help="label every head from its scores over a corpus",
                           epilog=HEADS_EXAMPLE.format(about=textwrap.fill(
                               "Writes one row per head: label (the first rule that fired, in "
                               f"this order: {', '.join(PRECEDENCE)}), family (its coarse "
                               f"class: {', '.join(RULES.families())}), evidence, also (other "
                               "rules that fired) and every score. Labels are judged on the "
                               "mass left after each head's sink keys (first token, BOS/CLS, "
                               "column sinks); 'sink' only when nothing else fires.", 90)),
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
                       help="skip the repeated-random-token probe (no rep_* scores; the "
                            "induction/duplicate labels then read the texts' own copies)")
    heads.add_argument("--probe-length", type=positive, metavar="N",
                       help="tokens per copy of the repeated-token probe, built with the "
                            "tokenizer's own special tokens (default: what fits the context "
                            "the model was trained on, at most 32)")
    heads.add_argument("--profile", help="also write the per-layer profile table here")
    heads.add_argument("--distances", help="also write head-pair JS distances here")
    heads.set_defaults(run=cmd_heads)

    syntax = sub.add_parser("syntax", help="best head per dependency relation vs an offset "
                                           "baseline", epilog=SYNTAX_EXAMPLE,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    _census_args(syntax)
    syntax.add_argument("--out", default="syntax.csv",
                        help="per-relation table: .csv, .parquet or .json (default syntax.csv)")
    syntax.add_argument("--min-count", type=positive, default=MIN_COUNT,
                        help=f"leave out relations with fewer words (default {MIN_COUNT}, "
                             "as the syntax labels and the report)")
    syntax.add_argument("--from-agg", choices=("mean", "first", "max"), default="mean",
                        help="attention from a word split into pieces: mean (default), "
                             "first piece, or max over its pieces")
    syntax.set_defaults(run=cmd_syntax)
