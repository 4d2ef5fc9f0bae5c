"""``attnprobe patch``: activation, path, attribution, residual-stream and MLP-output patching
with a clean and a corrupted input per example."""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path
from typing import Any

import pandas as pd

from attnprobe.commands.common import (
    corpus_of,
    distributed_group,
    experiment_type,
    ids_value,
    option_args,
    option_keywords,
    positions_type,
    run_args,
    table_path,
    texts_from_args,
    write_table,
    wrote,
)
from attnprobe.commands.load_args import model_args
from attnprobe.core.experiments import experiment_lines
from attnprobe.core.files import check_outputs
from attnprobe.core.metric_kind import metric_forms, metric_help
from attnprobe.core.options import CliOption, option_flag, registered_options
from attnprobe.core.scope import SCOPE_FORMS
from attnprobe.errors import AttnProbeError
from attnprobe.inputs.text import Text
from attnprobe.patch.job import EXPERIMENTS

PATCH_EXAMPLE = """examples:
  attnprobe patch --model ./my-lm --experiment heads --clean "The Eiffel Tower is in" \\
      --corrupt "The Colosseum is in" --metric "logit_diff:Paris,Rome" --out heads.csv
  attnprobe patch --model ref:induction --experiment heads --clean-file clean.txt \\
      --corrupt-file corrupt.txt --metric logit:next --metric-positions all \\
      --positions each --direction noising --out each_position.csv
  attnprobe patch --model ref:induction --experiment path --clean-file clean.txt \\
      --corrupt-file corrupt.txt --metric logit:next --metric-positions all \\
      --senders layer:0 --receivers layer:1 --into k --direction noising --out path.csv
  attnprobe patch --model ./my-lm --experiment attribution --clean-file clean.txt \\
      --corrupt-file corrupt.txt --metric "logit_diff:Paris,Rome" --compare --out attr.csv
  attnprobe patch --model ./my-lm --experiment residual --stream resid_mid \\
      --clean-file clean.txt --corrupt-file corrupt.txt --metric "logit_diff:Paris,Rome" \\
      --ci 0.95 --out resid.csv
  attnprobe patch --model ./my-lm --experiment mlp --clean-file clean.txt \\
      --corrupt-file corrupt.txt --metric "logit_diff:Paris,Rome" --out mlp.csv

experiments:
{experiments}
--compare (with {estimators}) also runs the experiment it estimates and prints their
correlation.
--direction denoising runs the corrupted input with clean activations (what is sufficient),
noising the clean input with corrupted ones (what is necessary). effect = (patched - corrupt)
/ (clean - corrupt) when denoising, (clean - patched) / (clean - corrupt) when noising: 1 when
the patch restores (destroys) the whole difference. Clean and corrupted input i must tokenize
to one length. Sites: output, q, k, v need a transformers model using the attention interface
(LLaMA, GPT-2, BERT, Qwen2, ...) or a reference model; GPT-Neo, Bloom, DeBERTa ... serve
pattern only.
--metric: {metrics}; --metric-positions (last, all, or 0,3,-1) says where
it is read. Scopes: {scopes}; a repeated --scope merges.
Writes one row per example and patch: experiment, example_id, layer, head, position, site,
direction, metric, clean, corrupt, patched, effect (path: + sender_layer, sender_head,
receivers, into; --compare: the activation patching rows follow). --ci 0.95 prints each mean
effect with its bootstrap interval over the examples (--n-boot draws, seeded by --seed).
"""


def _options() -> list[CliOption]:
    return registered_options(EXPERIMENTS.values())


def _estimators() -> list[str]:
    """The experiments ``--compare`` applies to: those that estimate another one."""
    return [spec.name for spec in EXPERIMENTS.values() if spec.params.estimates]


def _scope_refusal(args: argparse.Namespace) -> str | None:
    """Why ``--scope`` cannot be given to this experiment (its heads come from other flags)."""
    spec = EXPERIMENTS.get(args.experiment)
    if not args.scope or not spec.params.instead_of_scope:
        return None
    flags = {f.name: option_flag(f.name, f.metadata) for f in fields(spec.params)}
    named = " and ".join(flags[name] for name in spec.params.instead_of_scope)
    return f"--experiment {spec.name} takes {named}, not --scope"


def _side(args: argparse.Namespace, side: str) -> list[Text]:
    """The inputs of one side (``clean`` / ``corrupt``): ``--SIDE``, ``--SIDE-file``,
    ``--SIDE-ids``, in that order."""
    given = argparse.Namespace(text=getattr(args, side), text_file=getattr(args, f"{side}_file"),
                               ids=getattr(args, f"{side}_ids"), ids_file=None)
    return texts_from_args(given, f"pass --{side} \"...\", --{side}-file FILE (one text a "
                                  f"line) or --{side}-ids \"2 14 15\" (the {side} inputs)")


def _print(table: pd.DataFrame, experiment: str, args: argparse.Namespace) -> None:
    from attnprobe.patch import summary

    means = summary(table, ci=args.ci, n_boot=args.n_boot, seed=args.seed)
    shown = means.sort_values("effect", ascending=False, key=lambda s: s.abs())
    columns = [c for c in ("layer", "head", "position", "sender_layer", "sender_head", "into",
                           "effect", "ci_low", "ci_high", "patched", "clean", "corrupt",
                           "n_examples")
               if c in shown.columns]
    first = means.iloc[0]
    print(f"{table['example_id'].nunique()} example pair(s), {experiment} patching of "
          f"{first['site']} ({first['direction']}), metric {first['metric']}: mean effect per "
          "patch, largest first")
    with pd.option_context("display.width", 160, "display.float_format", "{:.3g}".format):
        print(shown[columns].to_string(index=False, max_rows=30))


def cmd_patch(args: argparse.Namespace) -> int:
    from attnprobe.commands.load_args import load_options_of
    from attnprobe.loading import load_model
    from attnprobe.patch import agreement, run
    from attnprobe.patch.bootstrap import check_ci

    out = Path(args.out)
    table_path(args.out, "--out")
    check_outputs([("--out", out)], inputs=[(f"--{s}-file", getattr(args, f"{s}_file"))
                                            for s in ("clean", "corrupt")])
    estimated = EXPERIMENTS.get(args.experiment).params.estimates
    if args.compare and estimated is None:
        raise AttnProbeError(f"--compare applies to --experiment {'/'.join(_estimators())}")
    if args.ci is not None:
        check_ci(args.ci, args.n_boot, args.seed)  # before loading the model
    keywords = option_keywords(args, _options(), args.experiment)
    refusal = _scope_refusal(args)
    if refusal is not None:
        raise AttnProbeError(refusal)
    clean, corrupt = _side(args, "clean"), _side(args, "corrupt")
    model, tokenizer = load_model(args.model, **load_options_of(args))
    with distributed_group(args.distributed) as (rank, world):
        corpus = corpus_of(args, world=world)  # every head unless --scope (refused above)
        table = run(model, tokenizer, clean, corrupt, args.metric, args.experiment,
                    corpus=corpus, metric_positions=args.metric_positions, **keywords)
        real = None
        if args.compare:  # the same options: site, positions and direction mean the same
            real = run(model, tokenizer, clean, corrupt, args.metric, estimated,
                       corpus=corpus, metric_positions=args.metric_positions, **keywords)
        if rank != 0:
            return 0
    written = pd.concat([table, real], ignore_index=True) if real is not None else table
    write_table(written, out)
    wrote(args, f"{len(written)} rows", out)
    _print(table, args.experiment, args)
    if real is not None:
        found = agreement(table, real)
        print(f"attribution vs activation patching over {found.n} patches: Pearson "
              f"{found.pearson:.3f}, Spearman {found.spearman:.3f}")
    return 0


def register(sub: Any) -> None:
    """Add ``patch`` to the ``attnprobe`` sub-command parsers."""
    epilog = PATCH_EXAMPLE.format(scopes=SCOPE_FORMS, experiments=experiment_lines(EXPERIMENTS),
                                  estimators="/".join(_estimators()), metrics=metric_forms())
    parser = sub.add_parser("patch", help="activation, path and attribution patching of heads, "
                            "residual-stream and MLP patching (clean vs corrupted inputs)",
                            epilog=epilog,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    model_args(parser)
    parser.add_argument("--experiment", required=True, type=experiment_type(EXPERIMENTS),
                        help=", ".join(spec.name for spec in EXPERIMENTS.values())
                        + " (below)")
    for side in ("clean", "corrupt"):
        parser.add_argument(f"--{side}", action="append", metavar="TEXT",
                            help=f"a {side} input (repeatable; input i pairs with the other "
                                 "side's input i)")
        parser.add_argument(f"--{side}-file", help=f"a UTF-8 file with one {side} input a line")
        parser.add_argument(f"--{side}-ids", action="append", type=ids_value, metavar="IDS",
                            help=f"a {side} input as token ids, e.g. \"2 14 15\" (repeatable)")
    parser.add_argument("--metric", required=True, help=metric_help())
    parser.add_argument("--metric-positions", type=positions_type("--metric-positions"),
                        default="last",
                        help="where the metric reads: last (default), all, or positions "
                             "such as 0,3,-1")
    run_args(parser, scope_help="heads patched by heads and attribution, layers by residual "
             "and mlp",
             batch_help="forward rows: examples x patches (attribution: examples)",
             seed_help="seeds the --ci bootstrap draws (default 0); patching itself draws "
             "nothing at random",
             truncate_help="cut pairs longer than the model allows (both inputs alike)",
             skip_help="leave out pairs longer than the model allows",
             length_help="cap on tokens per input")
    option_args(parser, _options())
    parser.add_argument("--compare", action="store_true",
                        help="attribution: also run activation patching (heads) with the "
                             "same options, write its rows too and print the correlation")
    parser.add_argument("--ci", type=float, metavar="LEVEL",
                        help="print each mean effect with its bootstrap confidence interval "
                             "at this level (e.g. 0.95), resampling the examples")
    parser.add_argument("--n-boot", type=int, default=1000, metavar="N",
                        help="bootstrap draws for --ci (default 1000)")
    parser.add_argument("--out", default="patch.csv",
                        help="result table: .csv, .parquet or .json (default patch.csv)")
    parser.set_defaults(run=cmd_patch)
