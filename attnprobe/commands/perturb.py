"""``attnprobe perturb``: change attention weights and measure how much the output cares."""

from __future__ import annotations

import argparse
import math
from typing import Any

import pandas as pd

from attnprobe.commands.common import (
    check_out,
    non_negative,
    positive,
    text_args,
    texts_from_args,
    write_table,
    wrote,
)
from attnprobe.errors import AttnProbeError, InputError

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
Scopes: all, layer:3, layers:2,3, head:3.5, heads:3.5,3.7 (L3H5 and *.5 work too).
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


def _scope(text: str) -> Any:
    from attnprobe.perturb import Scope

    try:
        return Scope.parse(text)
    except InputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number; got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a finite number > 0; got {text}")
    return value


def _names(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated names; got {text!r}")
    return names


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
    if args.batch_size is not None:
        keywords["batch_size"] = args.batch_size
    if args.truncate:
        keywords["truncation"] = True
    return keywords


def summary(table: pd.DataFrame) -> pd.DataFrame:
    """Median ``change`` (and the number of rows) per perturbation, scope, step and metric."""
    keys = ["perturbation", "scope", "step", "metric"]
    grouped = table.groupby(keys, sort=False, dropna=False)["change"]
    return grouped.agg(median_change="median", rows="size").reset_index()


def cmd_perturb(args: argparse.Namespace) -> int:
    from attnprobe.loading import load_model
    from attnprobe.perturb.experiments import run

    out = check_out(args.out, "--out")
    keywords = _keywords(args)
    texts = texts_from_args(args)
    model, tokenizer = load_model(args.model)
    table = run(model, tokenizer, texts, args.experiment, scope=args.scope, output=args.output,
                seed=args.seed, target=args.target, progress=not args.quiet, **keywords)
    write_table(table, out)
    wrote(args, f"{len(table)} rows", out)
    print(f"{len(texts)} texts, experiment {args.experiment}, scope {args.scope}: median change "
          "per perturbation and metric")
    shown = summary(table)
    with pd.option_context("display.width", 120, "display.max_rows", 40,
                           "display.float_format", "{:.4g}".format):
        print(shown.to_string(index=False, max_rows=40))
    return 0


def register(sub: Any) -> None:
    """Add ``perturb`` to the ``attnprobe`` sub-command parsers."""
    parser = sub.add_parser("perturb", help="perturb attention and measure the output change",
                            epilog=PERTURB_EXAMPLE,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    text_args(parser)
    parser.add_argument("--experiment", required=True, type=_experiment,
                        help="permute, dirichlet, uniform, ablate, mean, erase, adversarial or "
                             "importance")
    parser.add_argument("--scope", type=_scope, default="all",
                        help="heads to perturb: all (default), layer:3, layers:2,3, head:3.5, "
                             "heads:3.5,3.7")
    parser.add_argument("--output", default="auto",
                        choices=["auto", "classifier", "lm", "embedding"],
                        help="what is compared: classifier probabilities, the next-token "
                             "distribution, or the mean-pooled embedding (default: auto)")
    parser.add_argument("--permutations", type=positive,
                        help="permute/dirichlet: draws per text (default 100)")
    parser.add_argument("--alpha", type=_positive_float,
                        help="dirichlet: concentration (default 1)")
    parser.add_argument("--eps", type=_positive_float,
                        help="adversarial: output budget, TVD (default 0.01)")
    parser.add_argument("--adversaries", type=positive,
                        help="adversarial: adversaries per text and layer (default 5)")
    parser.add_argument("--steps", type=positive,
                        help="adversarial: Adam steps (default 500)")
    parser.add_argument("--k", type=positive,
                        help="erase: report k = 1..K erased keys (default 1)")
    parser.add_argument("--rankings", type=_names,
                        help="erase: key orders (default attention,integrated_gradients,random;"
                             " any attribution method)")
    parser.add_argument("--prune-steps", type=positive,
                        help="importance: points on the pruning curve (default: every head)")
    parser.add_argument("--seed", type=non_negative, default=0,
                        help="seeds every random choice (default 0)")
    parser.add_argument("--target",
                        help="erase: what the attribution ranking explains; importance: the "
                             "loss (class:K, next-token[:ID], similarity:TEXT)")
    parser.add_argument("--batch-size", type=positive,
                        help="forward rows (texts, or draws / erasure steps of one text)")
    parser.add_argument("--truncate", action="store_true",
                        help="cut texts longer than the model allows instead of failing")
    parser.add_argument("--out", default="perturb.csv",
                        help="result table: .csv, .parquet or .json (default perturb.csv)")
    parser.add_argument("--quiet", action="store_true",
                        help="no progress bar or 'wrote' notes on stderr")
    parser.set_defaults(run=cmd_perturb)
