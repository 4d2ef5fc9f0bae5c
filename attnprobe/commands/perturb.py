"""``attnprobe perturb``: change attention weights and measure how much the output cares."""

from __future__ import annotations

import argparse
from typing import Any

import pandas as pd

from attnprobe.commands.common import (
    check_tables,
    corpus_args,
    corpus_of,
    distributed_group,
    experiment_type,
    option_args,
    option_keywords,
    positions_type,
    texts_from_args,
    write_table,
    wrote,
)
from attnprobe.core.experiments import experiment_lines
from attnprobe.core.metric_kind import metric_forms, metric_help
from attnprobe.core.options import CliOption, registered_options
from attnprobe.core.scope import SCOPE_FORMS
from attnprobe.perturb.job import EXPERIMENTS, SWEEPS
from attnprobe.perturb.run_checks import reads_metric

PERTURB_EXAMPLE = """examples:
  attnprobe perturb --model ref:bilstm-classifier --text "the cat sat on the red mat" \\
      --experiment permute --permutations 100 --out permute.csv
  attnprobe perturb --model minilm --text-file s.txt --experiment uniform --scope layer:3 \\
      --out uniform.csv
  attnprobe perturb --model minilm --text-file s.txt --experiment ablate --sweep head \\
      --out ablate_each_head.csv
  attnprobe perturb --model ref:transformer-classifier --text-file s.txt --experiment erase \\
      --max-erased 3 --out erase.csv
  attnprobe perturb --model ref:bilstm-classifier --text-file s.txt --experiment adversarial \\
      --eps 0.01 --out adversarial.csv
  attnprobe perturb --model minilm --text-file s.txt --experiment importance \\
      --target "similarity:A cat sits on the mat." --out importance.csv
  attnprobe perturb --model ./my-lm --text-file s.txt --experiment knockout --edges "to:0" \\
      --metric "logit:next" --positions all --sweep layer --out knockout.csv
  attnprobe perturb --model ./my-lm --text-file s.txt --experiment ablate --sweep head \\
      --metric "logit_diff:Paris,Rome" --out ablate_logit_diff.csv

experiments:
{experiments}
knockout's --edges: to:POSITIONS, from:POSITIONS, last-to:POSITIONS, edge:Q>K[,Q>K]; positions
count each text's real tokens, -1 or last = the last one; a token's edge to itself is kept by
the named kinds.
--metric: next-token (default: the distributional change of the output: tvd, jsd, flip,
top_prob) or one number per text read before and after the perturbation: {metrics}; tokens
are one token's string or its id. --positions (last, all, or a list such as 0,3,-1) says
where it is read. {metric_takers} take a metric.
Scopes: {scopes}; a repeated --scope merges.
--sweep head ({sweepers}) perturbs every head of the scope alone,
batched: one row per head, text and metric, the rows of one run per head; --sweep layer does
each layer's scoped heads together. --batch-size then counts texts x heads per forward.
Each experiment's own options are the flags whose help names it; a flag of another experiment
is an error, and so is a flag that would change nothing (--target for an experiment that reads
no target, --n-steps without an integrated_gradients ranking). permute and dirichlet show a
bar over the draws of every text with the time left: a run that would take hours says so at
once (lower --permutations / --draws). Under torchrun, --distributed splits the texts over the
processes (same table).
Writes one row per text, perturbation and metric: experiment, perturbation, scope, layer,
head, example_id, step, metric, baseline, perturbed, change, then one column per parameter
(and positions, with a metric other than next-token).
"""


def _options() -> list[CliOption]:
    """One flag per experiment option, made from the experiments' parameter dataclasses."""
    return registered_options(EXPERIMENTS.values())


def _epilog() -> str:
    """The examples and notes, with every list of experiments read off the registry."""
    names = [spec.name for spec in EXPERIMENTS.values()]
    takers = [name for name in names if reads_metric(name)]
    return PERTURB_EXAMPLE.format(
        scopes=SCOPE_FORMS, experiments=experiment_lines(EXPERIMENTS),
        metric_takers=f"{', '.join(takers[:-1])} and {takers[-1]}",
        sweepers=", ".join(_sweepers()), metrics=metric_forms())


def _sweepers() -> list[str]:
    return [spec.name for spec in EXPERIMENTS.values() if spec.sweeps]


MAIN_METRICS = ("tvd", "cosine_distance")  # the metric a head grid shows, first one present


def summary(table: pd.DataFrame) -> pd.DataFrame:
    """Median ``change`` (and the number of rows) per perturbation, scope, step and metric."""
    keys = ["perturbation", "scope", "step", "metric"]
    grouped = table.groupby(keys, sort=False, dropna=False)["change"]
    return grouped.agg(median_change="median", rows="size").reset_index()


def head_grid(table: pd.DataFrame) -> tuple[str, pd.DataFrame] | None:
    """For a table whose rows are each about one head, of several (a head sweep): the metric and
    its median ``change`` over the texts per head, layers as rows and heads as columns;
    ``None`` for other tables."""
    if table["head"].isna().any() or len(table[["layer", "head"]].drop_duplicates()) < 2:
        return None
    metric = next((m for m in MAIN_METRICS if m in set(table["metric"])),
                  table["metric"].iloc[0])
    chosen = table[table["metric"] == metric]
    grid = chosen.pivot_table(index="layer", columns="head", values="change",
                              aggfunc="median")
    grid.index.name, grid.columns.name = "layer", "head"
    return metric, grid


def cmd_perturb(args: argparse.Namespace) -> int:
    from attnprobe.commands.load_args import load_options_of
    from attnprobe.loading import load_model
    from attnprobe.perturb.experiments import run

    (out,) = check_tables(args, ("--out", args.out))
    keywords = option_keywords(args, _options(), args.experiment)
    texts = texts_from_args(args)
    model, tokenizer = load_model(args.model, **load_options_of(args))
    with distributed_group(args.distributed) as (rank, world):
        corpus = corpus_of(args, world=world)
        table = run(model, tokenizer, texts, args.experiment, corpus=corpus,
                    output=args.output, target=args.target, metric=args.metric,
                    positions=args.positions, sweep=args.sweep, **keywords)
        if rank != 0:
            return 0
    write_table(table, out)
    wrote(args, f"{len(table)} rows", out)
    grid = head_grid(table)
    with pd.option_context("display.width", 160, "display.max_rows", 40,
                           "display.float_format", "{:.3g}".format):
        if grid is None:
            print(f"{len(texts)} texts, experiment {args.experiment}, scope "
                  f"{corpus.scope}: median change per perturbation and metric")
            print(summary(table).to_string(index=False, max_rows=40))
            return 0
        metric, shown = grid
        others = [m for m in dict.fromkeys(table["metric"]) if m != metric]
        print(f"{len(texts)} texts, experiment {args.experiment}, scope {corpus.scope}, "
              f"each head alone: median {metric} change per head")
        print(f"(rows: layers, columns: heads; {', '.join(others)} are in the table)")
        print(shown.to_string(max_rows=40))
    return 0


def register(sub: Any) -> None:
    """Add ``perturb`` to the ``attnprobe`` sub-command parsers."""
    parser = sub.add_parser("perturb", help="perturb attention and measure the output change",
                            epilog=_epilog(),
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    corpus_args(parser, batch_help="forward rows: texts, or draws / erasure steps of one text "
                                   "(adversarial: see --adversaries)",
                seed_help="seeds permute, dirichlet, erase's random order and adversarial "
                          "(default 0); the other experiments draw nothing")
    parser.add_argument("--experiment", required=True, type=experiment_type(EXPERIMENTS),
                        help=", ".join(spec.name for spec in EXPERIMENTS.values())
                        + " (below)")
    parser.add_argument("--sweep", choices=SWEEPS,
                        help="/".join(_sweepers()) + ": perturb each head (or each layer's "
                             "scoped heads) of the scope alone, batched; one row per head and "
                             "text")
    parser.add_argument("--output", default="auto",
                        choices=["auto", "classifier", "lm", "embedding"],
                        help="what the default metric compares: classifier probabilities, the "
                             "next-token distribution, or the mean-pooled embedding (default: "
                             "auto)")
    parser.add_argument("--metric", default="next-token", metavar="SPEC",
                        help=metric_help("next-token (default: the distributional change)"))
    parser.add_argument("--positions", type=positions_type("--positions"), metavar="WHERE",
                        help="where a --metric other than next-token is read: last "
                             "(default; all for loss), all, or positions such as 0,3,-1 "
                             "(counting real tokens)")
    option_args(parser, _options())
    parser.add_argument("--target",
                        help="erase: what the attribution ranking explains; importance: the "
                             "loss (class:K, next-token[:ID], similarity:TEXT); refused by "
                             "the experiments that read none")
    parser.add_argument("--out", default="perturb.csv",
                        help="result table: .csv, .parquet or .json (default perturb.csv)")
    parser.set_defaults(run=cmd_perturb)
