"""``attnprobe compare``: attention-derived importance versus gradient attributions."""

from __future__ import annotations

import argparse
from typing import Any

import pandas as pd

from attnprobe.commands.common import (
    check_tables,
    corpus_args,
    corpus_of,
    count_noun,
    distributed_group,
    generation_args,
    generation_options,
    names,
    positive,
    query_value,
    report_skipped,
    texts_from_args,
    write_table,
    wrote,
)


def _example(metrics: tuple[str, ...]) -> str:
    return f"""examples:
  attnprobe compare --model minilm --text-file s.txt --target "similarity:A cat sits." \\
      --out compare.csv --summary summary.csv
  attnprobe compare --model path/to/classifier --text "Great film." --target class:1 \\
      --methods integrated_gradients,leave_one_out --views raw,rollout --scope layers:0,5
  attnprobe compare --model path/to/gpt2 --text-file prompts.txt --target next-token \\
      --generate 5 --out steps.csv

Targets: class:K, prob:K (classifiers), next-token[:ID] (causal LMs), similarity:TEXT
(embedding models: cosine similarity of mean-pooled embeddings). Writes one row per
example, attention view (at each layer) or method, reference method and metric, with
value and p_value; metrics: {", ".join(metrics)}.
--summary writes mean, std and the share of examples with p <= 0.05. --scope picks the
layers of every view and the heads that raw and norm average (rollout, flow and
attn_x_grad run through every head). The views read the row --query says; by default
(auto) the last real token of a causal model (the one that predicts the next token) and
the first ([CLS]) of an encoder. With --generate N (--target next-token) each text is a
prompt continued by N tokens, and every generated token is explained from the prompt and
the tokens generated before it: the table gets step, position and token columns.
"""


def cmd_compare(args: argparse.Namespace) -> int:
    from attnprobe.attribution.comparison import compare
    from attnprobe.commands.load_args import load_options_of
    from attnprobe.loading import load_model

    out, summary_out = check_tables(args, ("--out", args.out), ("--summary", args.summary))
    texts = texts_from_args(args)
    generation = generation_options(args)
    model, tokenizer = load_model(args.model, **load_options_of(args))
    with distributed_group(args.distributed) as (rank, world):
        result = compare(model, tokenizer, texts, args.target, methods=args.methods,
                         views=args.views, query=args.query, n_steps=args.n_steps,
                         **generation, corpus=corpus_of(args, world=world))
        if rank != 0:
            return 0
    report_skipped(result.skipped)
    write_table(result.table, out)
    wrote(args, f"{len(result.table)} agreement rows", out)
    summary = result.summary()
    if summary_out is not None:
        write_table(summary, summary_out)
        wrote(args, "the summary", summary_out)
    shown = summary[summary["metric"] == "kendall_tau"]
    columns = ["source", "method", "mean", "std", "frac_significant"]
    compared = count_noun(len(texts) - len(result.skipped), "text")
    over = f"{count_noun(args.generate, 'generated token')} each" if generation else "texts"
    print(f"{compared}, target {args.target}: Kendall tau (mean over {over})")
    with pd.option_context("display.width", 120, "display.max_rows", 60,
                           "display.float_format", "{:.3f}".format):
        print(shown[columns].to_string(index=False))
    return 0


def register(sub: Any) -> None:
    """Add ``compare`` to the ``attnprobe`` sub-command parsers."""
    from attnprobe.attribution.comparison import DEFAULT_METHODS, DEFAULT_VIEWS
    from attnprobe.attribution.method_base import METHODS
    from attnprobe.attribution.metrics import METRICS
    from attnprobe.attribution.view_base import VIEWS

    others = [name for name in VIEWS.names() if name not in DEFAULT_VIEWS]
    other_methods = [name for name in METHODS.names() if name not in DEFAULT_METHODS]
    parser = sub.add_parser("compare", help="attention views vs gradient attributions",
                            epilog=_example(METRICS),
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    corpus_args(parser, seed_help="seeds the random baselines of GradientSHAP (default 0)")
    parser.add_argument("--target", required=True,
                        help="what to explain: class:K, prob:K, next-token[:ID], "
                             "similarity:TEXT")
    parser.add_argument("--methods", type=names, default=list(DEFAULT_METHODS),
                        help=f"attribution methods (default {','.join(DEFAULT_METHODS)}; also "
                             f"{','.join(other_methods) or 'none'})")
    parser.add_argument("--views", type=names, default=list(DEFAULT_VIEWS),
                        help=f"attention views (default {','.join(DEFAULT_VIEWS)}; also "
                             f"{','.join(others) or 'none'})")
    parser.add_argument("--query", type=query_value, default="auto",
                        help="row the views read: auto (default: last for causal models, cls "
                             "otherwise), cls, last, mean, max, or an index")
    parser.add_argument("--n-steps", type=positive, default=50,
                        help="Integrated Gradients steps (default 50)")
    parser.add_argument("--out", default="compare.csv",
                        help="agreement table: .csv, .parquet or .json (default compare.csv)")
    parser.add_argument("--summary", help="also write the per-view summary table here")
    generation_args(parser)
    parser.set_defaults(run=cmd_compare)
