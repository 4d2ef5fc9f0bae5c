"""``attnprobe diff``: what changed between two checkpoints of one model, head by head."""

from __future__ import annotations

import argparse
import warnings
from typing import Any

import pandas as pd

from attnprobe.commands.common import (
    check_tables,
    corpus_args,
    corpus_from_args,
    corpus_of,
    count_noun,
    distributed_group,
    report_skipped,
    write_table,
    wrote,
)

EXAMPLE = """examples:
  attnprobe diff --model minilm --model-b path/to/finetuned --text-file s.txt --out diff.csv \\
      --layers layers.csv
  attnprobe diff --model before/ --model-b after/ --conllu dev.conllu --scores scores.csv

Both models run the head census and, side by side, the same batches (encoded by --model's
tokenizer; --model-b's must hold the same vocabulary). --out gets one row per head: label_a,
label_b, label_changed, js (mean Jensen-Shannon divergence between the two models' attention
rows, nats, at most ln 2 = 0.693), js_max, cosine (Kovaleva et al.: cosine similarity of the
two maps per example), then <score>_change (B - A) for every census score. --layers: per
layer mean js, its rank, the most changed head, mean cosine and the heads whose label
changed. --scores: every score in long form (score, a, b, change).
"""


def cmd_diff(args: argparse.Namespace) -> int:
    from attnprobe.commands.load_args import load_options_of
    from attnprobe.heads.checkpoint_diff import diff
    from attnprobe.load_options import LoadWarning
    from attnprobe.loading import load_model

    out, layers_out, scores_out = check_tables(args, ("--out", args.out),
                                               ("--layers", args.layers),
                                               ("--scores", args.scores))
    with distributed_group(args.distributed) as (rank, world):
        texts, trees = corpus_from_args(args)
        model_a, tokenizer = load_model(args.model, **load_options_of(args, "a"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", LoadWarning)  # same options: said for model a
            model_b, tokenizer_b = load_model(args.model_b, **load_options_of(args, "b"))
        result = diff(model_a, model_b, tokenizer, texts, trees=trees, tokenizer_b=tokenizer_b,
                      syntax=args.syntax if texts else None, repeated=not args.no_repeated,
                      corpus=corpus_of(args, world=world))
        if rank != 0:
            return 0
        report_skipped(result.census_a.skipped, "sentence")
        heads = result.heads()
        layers = result.layers()
        write_table(heads, out)
        wrote(args, f"{len(heads)} heads", out)
        if layers_out is not None:
            write_table(layers, layers_out)
            wrote(args, "the layer summary", layers_out)
        if scores_out is not None:
            write_table(result.scores(), scores_out)
            wrote(args, "score changes", scores_out)
        print(f"{count_noun(result.n_sentences, 'sentence')}, {len(heads)} heads: mean JS "
              f"{heads['js'].mean():.4g} nats; "
              f"{count_noun(int(heads['label_changed'].sum()), 'label')} changed")
        shown = layers[["layer", "js", "js_rank", "top_head", "js_top", "cosine",
                        "label_changed"]]
        if layers[["stack", "kind"]].drop_duplicates().shape[0] > 1:  # encoder-decoder
            shown = layers[["stack", "kind", *shown.columns]]
        with pd.option_context("display.width", 120, "display.max_rows", None,
                               "display.float_format", "{:.4g}".format):
            print(shown.to_string(index=False))
    return 0


def register(sub: Any) -> None:
    """Add ``diff`` to the ``attnprobe`` sub-command parsers."""
    parser = sub.add_parser("diff", help="compare two checkpoints of one model head by head "
                                         "(labels, scores, JS between their attention)",
                            epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    corpus_args(parser, batch_help="sentences per forward",
                seed_help="seeds the repeated-random-token probe, the same for both models "
                          "(default 0)")
    parser.add_argument("--model-b", required=True,
                        help="the second checkpoint (after), the same shape and kind of "
                             "attention (causal or not) as --model, loaded the same way")
    parser.add_argument("--conllu", help="a CoNLL-U file of dependency trees (instead of text)")
    parser.add_argument("--out", default="diff.csv",
                        help="per-head table: .csv, .parquet or .json (default diff.csv)")
    parser.add_argument("--layers", help="also write the per-layer summary here")
    parser.add_argument("--scores", help="also write every score change in long form here")
    parser.add_argument("--syntax", action="store_true",
                        help="parse --text/--text-file with spaCy so syntax scores are compared "
                             "too (implied by --conllu)")
    parser.add_argument("--no-repeated", action="store_true",
                        help="skip the repeated-random-token probe (no rep_* scores)")
    parser.set_defaults(run=cmd_diff)
