"""``attnprobe perturb``: change attention weights and measure how much the output cares."""

from __future__ import annotations

import argparse
from typing import Any

import pandas as pd

from attnprobe.commands.common import (
    check_tables,
    corpus_args,
    corpus_options,
    distributed_group,
    names,
    positive,
    positive_float,
    texts_from_args,
    write_table,
    wrote,
)
from attnprobe.core.scope import SCOPE_FORMS
from attnprobe.errors import AttnProbeError

PERTURB_EXAMPLE = """examples:
  attnprobe perturb --model ref:bilstm-classifier --text "the cat sat on the red mat" \\
      --experiment permute --permutations 100 --out permute.csv
  attnprobe perturb --model minilm --text-file s.txt --experiment uniform --scope layer:3 \\
      --out uniform.csv
  attnprobe perturb --model ref:transformer-classifier --text-file s.txt --experiment erase \\
      --k 3 --out erase.csv
  attnprobe perturb --model ref:bilstm-classifier --text-file s.txt --experiment adversarial \\
      --eps 0.01 --out adversarial.csv
  attnprobe perturb --model minilm --text-file s.txt --experiment importance \\
      --target "similarity:A cat sits on the mat." --out importance.csv

Experiments: permute (Jain & Wallace: N permutations per text, batched), dirichlet (random
re-draws), uniform, ablate (zero the heads), mean (mean-ablation, transformers models),
erase (Serrano & Smith: keys erased by attention, Integrated Gradients and random order),
adversarial (Jain & Wallace: the most different attention within TVD eps), importance
(Michel et al.: head importance and the pruning curve).
Scopes: {scopes}; a repeated --scope merges.
Writes one row per text, perturbation and metric: experiment, perturbation, params, scope,
example_id, step, metric, baseline, perturbed, change.
"""

# options that belong to one experiment: flag -> (experiment, run() keyword)
_ONLY = {
    "--permutations": ("permute/dirichlet", "n_permutations"),
    "--alpha": ("dirichlet", "alpha"),
    "--eps": ("adversarial", "eps"),
    "--adversaries": ("adversarial", "n_adversaries"),
    "--steps": ("adversarial", "steps"),
    "--k": ("erase", "k"),
    "--rankings": ("erase", "rankings"),
    "--prune-steps": ("importance", "prune_steps"),
}


def _experiment(text: str) -> str:
    from attnprobe.perturb.experiments import EXPERIMENTS

    if text not in EXPERIMENTS:
        raise argparse.ArgumentTypeError(f"unknown experiment {text!r}; choose one of "
                                         f"{', '.join(EXPERIMENTS.names())}")
    return text


def _keywords(args: argparse.Namespace) -> dict[str, Any]:
    """run() keywords from the experiment-specific flags; a flag given to another experiment
    is an error, not silently ignored."""
    keywords: dict[str, Any] = {}
    for flag, (owner, keyword) in _ONLY.items():
        value = getattr(args, flag.lstrip("-").replace("-", "_"))
        if value is None:
            continue
        if args.experiment not in owner.split("/"):
            raise AttnProbeError(f"{flag} applies to --experiment {owner}, not "
                                 f"{args.experiment}")
        keywords[keyword] = value
    return keywords


def summary(table: pd.DataFrame) -> pd.DataFrame:
    """Median ``change`` (and the number of rows) per perturbation, scope, step and metric."""
    keys = ["perturbation", "scope", "step", "metric"]
    grouped = table.groupby(keys, sort=False, dropna=False)["change"]
    return grouped.agg(median_change="median", rows="size").reset_index()


def cmd_perturb(args: argparse.Namespace) -> int:
    from attnprobe.loading import load_model
    from attnprobe.perturb.experiments import run

    (out,) = check_tables(("--out", args.out))
    keywords = _keywords(args)
    texts = texts_from_args(args)
    model, tokenizer = load_model(args.model)
    options = corpus_options(args)
    with distributed_group(args.distributed) as (rank, _world):
        table = run(model, tokenizer, texts, args.experiment, output=args.output,
                    target=args.target, **options, **keywords)
        if rank != 0:
            return 0
    write_table(table, out)
    wrote(args, f"{len(table)} rows", out)
    print(f"{len(texts)} texts, experiment {args.experiment}, scope {options['scope']}: "
          "median change per perturbation and metric")
    shown = summary(table)
    with pd.option_context("display.width", 120, "display.max_rows", 40,
                           "display.float_format", "{:.4g}".format):
        print(shown.to_string(index=False, max_rows=40))
    return 0


def register(sub: Any) -> None:
    """Add ``perturb`` to the ``attnprobe`` sub-command parsers."""
    parser = sub.add_parser("perturb", help="perturb attention and measure the output change",
                            epilog=PERTURB_EXAMPLE.format(scopes=SCOPE_FORMS),
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    corpus_args(parser, batch_help="forward rows: texts, or draws / erasure steps of one text")
    parser.add_argument("--experiment", required=True, type=_experiment,
                        help="permute, dirichlet, uniform, ablate, mean, erase, adversarial or "
                             "importance")
    parser.add_argument("--output", default="auto",
                        choices=["auto", "classifier", "lm", "embedding"],
                        help="what is compared: classifier probabilities, the next-token "
                             "distribution, or the mean-pooled embedding (default: auto)")
    parser.add_argument("--permutations", type=positive,
                        help="permute/dirichlet: draws per text (default 100)")
    parser.add_argument("--alpha", type=positive_float,
                        help="dirichlet: concentration (default 1)")
    parser.add_argument("--eps", type=positive_float,
                        help="adversarial: output budget, TVD (default 0.01)")
    parser.add_argument("--adversaries", type=positive,
                        help="adversarial: adversaries per text and layer (default 5)")
    parser.add_argument("--steps", type=positive,
                        help="adversarial: Adam steps (default 500)")
    parser.add_argument("--k", type=positive,
                        help="erase: report k = 1..K erased keys (default 1)")
    parser.add_argument("--rankings", type=names,
                        help="erase: key orders (default attention,integrated_gradients,random;"
                             " any attribution method)")
    parser.add_argument("--prune-steps", type=positive,
                        help="importance: points on the pruning curve (default: every head)")
    parser.add_argument("--target",
                        help="erase: what the attribution ranking explains; importance: the "
                             "loss (class:K, next-token[:ID], similarity:TEXT)")
    parser.add_argument("--out", default="perturb.csv",
                        help="result table: .csv, .parquet or .json (default perturb.csv)")
    parser.set_defaults(run=cmd_perturb)
