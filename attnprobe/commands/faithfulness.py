"""``attnprobe faithfulness``: which explanation the model agrees with — erasure tests of
attention views and attribution methods, ranked with confidence intervals."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import pandas as pd

from attnprobe.commands.common import (
    corpus_args,
    corpus_of,
    count_noun,
    distributed_group,
    input_files,
    names,
    positive,
    query_value,
    report_skipped,
    table_path,
    texts_from_args,
    write_table,
    wrote,
)
from attnprobe.core.files import atomic_write, check_outputs
from attnprobe.core.optional import require
from attnprobe.errors import AttnProbeError, OutputError

PLOT_SUFFIXES = (".png", ".svg", ".pdf")
SHOWN_METRICS = ("aopc_comprehensiveness", "aopc_sufficiency", "abpc", "tau_loo")


def _example(metrics: str) -> str:
    return f"""examples:
  attnprobe faithfulness --model path/to/classifier --text-file s.txt --target class:1 \\
      --out rows.csv --summary summary.csv --curves curves.csv --plot faithfulness.svg
  attnprobe faithfulness --model minilm --text-file s.txt --target "similarity:A cat." \\
      --methods saliency,leave_one_out --views raw,value_zeroing --levels 0.1,0.2,0.5 \\
      --removal replace --curve-steps 5 --sanity

Every source ranks the real tokens of each text (special tokens are never removed); the
tokens are then removed in that order (--removal: delete, the default of ERASER and ferret;
replace by the mask/pad/unk token; or mask them out of attention) and the explained output
(--target: class:K, prob:K, next-token, similarity:TEXT) is read again. --out gets one row
per text, source, metric and level ({metrics}); --summary per source
the mean of AOPC comprehensiveness, AOPC sufficiency, ABPC and Kendall tau with
leave-one-out, each with its 95 % bootstrap interval over the texts, ranked (1 = highest
AOPC comprehensiveness); --curves the deletion (MoRF, LeRF) and insertion curves per text;
--plot the mean curves with bands and the ranking with CI whiskers. The source "random"
is the random-order baseline under the same removal. --sanity re-initialises the top
layers of a copy of the model and flags a source whose ranking barely changes.
"""


def levels_value(text: str) -> tuple[float, ...]:
    """``--levels 0.1,0.2``: shares of the real tokens (the library checks the range)."""
    try:
        found = tuple(float(part) for part in names(text))
    except (ValueError, argparse.ArgumentTypeError):  # names() refuses an empty list
        raise argparse.ArgumentTypeError(f"expected comma-separated shares such as "
                                         f"0.1,0.2; got {text!r}") from None
    if not all(math.isfinite(v) for v in found):
        raise argparse.ArgumentTypeError(f"levels must be finite numbers; got {text!r}")
    return found


def steps_value(text: str) -> int | str:
    """``--curve-steps N`` or ``all`` (every count of tokens)."""
    return "all" if text.strip() == "all" else positive(text)


def _plot_path(value: str | None) -> Path | None:
    if value is None:
        return None
    path = Path(value)
    if path.suffix.lower() not in PLOT_SUFFIXES:
        raise OutputError(f"--plot must end in {', '.join(PLOT_SUFFIXES)}; got {value}")
    return path


def _save_plot(result: Any, path: Path) -> None:
    from attnprobe.plot.erasure import faithfulness

    fig = faithfulness(result)
    atomic_write(path, lambda tmp: fig.savefig(tmp, format=path.suffix.lower()[1:]))


def _options(args: argparse.Namespace) -> dict[str, Any]:
    """``evaluate()``'s own keywords from the flags (defaults left to the library)."""
    given = {"levels": args.levels, "removal": args.removal, "fill": args.fill,
             "view_layers": args.view_layers, "query": args.query, "n_steps": args.n_steps,
             "randomize": args.randomize, "sanity_threshold": args.sanity_threshold}
    out = {k: v for k, v in given.items() if v is not None}
    if not args.sanity:
        flags = [f for f, v in (("--randomize", args.randomize),
                                ("--sanity-threshold", args.sanity_threshold)) if v is not None]
        if flags:
            raise AttnProbeError(f"{flags[0]} applies to the sanity check: add --sanity")
    if args.fill is not None and args.removal != "replace":
        raise AttnProbeError("--fill applies to --removal replace")
    if args.curve_steps is not None:  # "all": every count of tokens
        out["curve_steps"] = None if args.curve_steps == "all" else args.curve_steps
    return {**out, "magnitude": args.magnitude, "sanity": args.sanity}


def _shown(summary: pd.DataFrame) -> pd.DataFrame:
    """The printed ranking: per metric ``mean [low, high]``."""
    out = summary[["rank", "source", "source_kind", "n"]].copy()
    for metric in SHOWN_METRICS:
        out[metric] = [f"{m:.3f} [{lo:.3f}, {hi:.3f}]" for m, lo, hi in zip(
            summary[metric], summary[f"{metric}_low"], summary[f"{metric}_high"], strict=True)]
    if "sanity_flag" in summary.columns:
        out["sanity_flag"] = summary["sanity_flag"]
    return out


def cmd_faithfulness(args: argparse.Namespace) -> int:
    from attnprobe.commands.load_args import load_options_of
    from attnprobe.faithfulness.evaluate import evaluate
    from attnprobe.loading import load_model

    tables = (("--out", args.out), ("--summary", args.summary), ("--curves", args.curves))
    out, summary_out, curves_out = (table_path(value, option) for option, value in tables)
    plot = _plot_path(args.plot)
    check_outputs([*tables, ("--plot", args.plot)], inputs=input_files(args))
    if plot is not None:
        require("matplotlib.figure")  # a missing extra is refused before the run
    options = _options(args)
    texts = texts_from_args(args)
    model, tokenizer = load_model(args.model, **load_options_of(args))
    with distributed_group(args.distributed) as (rank, world):
        corpus = corpus_of(args, world=world)
        if args.budget is not None:
            corpus = corpus.replace(budget=args.budget)
        result = evaluate(model, tokenizer, texts, args.target, methods=args.methods,
                          views=args.views, corpus=corpus, **options)
        if rank != 0:
            return 0
    report_skipped(result.skipped)
    write_table(result.table, out)
    wrote(args, f"{len(result.table)} faithfulness rows", out)
    summary = result.summary()
    if summary_out is not None:
        write_table(summary, summary_out)
        wrote(args, "the summary", summary_out)
    if curves_out is not None:
        write_table(result.curves_table, curves_out)
        wrote(args, f"{len(result.curves_table)} curve points", curves_out)
    if plot is not None:
        _save_plot(result, plot)
        wrote(args, "the figure", plot)
    tested = count_noun(len(texts) - len(result.skipped), "text")
    removal = ", ".join(map(str, result.table["removal"].unique()))
    print(f"{tested}, target {args.target}, removal {removal}: mean [95 % CI], ranked by "
          "AOPC comprehensiveness")
    with pd.option_context("display.width", 200, "display.max_rows", 60,
                           "display.max_columns", 20):
        print(_shown(summary).to_string(index=False))
    return 0


def register(sub: Any) -> None:
    """Add ``faithfulness`` to the ``attnprobe`` sub-command parsers."""
    from attnprobe.attribution.method_base import METHODS
    from attnprobe.attribution.view_base import VIEWS
    from attnprobe.faithfulness.evaluate import PASS_TOKENS
    from attnprobe.faithfulness.options import DEFAULT_METHODS, DEFAULT_VIEWS, VIEW_LAYERS
    from attnprobe.faithfulness.removal import KINDS
    from attnprobe.faithfulness.result import TABLE_COLUMNS

    others = [name for name in VIEWS.names() if name not in DEFAULT_VIEWS]
    other_methods = [name for name in METHODS.names() if name not in DEFAULT_METHODS]
    parser = sub.add_parser("faithfulness", help="which explanation is faithful: erasure "
                                                 "tests of attention views and attributions",
                            epilog=_example(", ".join(TABLE_COLUMNS)),
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    corpus_args(parser, batch_help=f"perturbed inputs per forward (default: about "
                                   f"{PASS_TOKENS} tokens a forward)",
                seed_help="seeds the random baseline (text i: seed + i) and GradientSHAP "
                          "(default 0)", batch_default=None)
    parser.add_argument("--budget", type=positive,
                        help="the most token-forwards the tests of one text may cost (a text "
                             "over it is refused, naming the knob)")
    parser.add_argument("--target", required=True,
                        help="what to explain: class:K, prob:K, next-token, similarity:TEXT")
    parser.add_argument("--methods", type=names, default=list(DEFAULT_METHODS),
                        help=f"attribution methods (default {','.join(DEFAULT_METHODS)}; also "
                             f"{','.join(other_methods) or 'none'})")
    parser.add_argument("--views", type=names, default=list(DEFAULT_VIEWS),
                        help=f"attention views (default {','.join(DEFAULT_VIEWS)}: those the "
                             f"model serves; also {','.join(others) or 'none'})")
    parser.add_argument("--levels", type=levels_value,
                        help="shares of the real tokens removed for comprehensiveness and "
                             "sufficiency (default 0.01,0.05,0.1,0.2,0.5)")
    parser.add_argument("--removal", choices=KINDS,
                        help="how a token is removed: delete (default), replace (mask/pad/"
                             "unk token) or attention (masked out of attention)")
    parser.add_argument("--fill", choices=("mask", "pad", "unk"),
                        help="with --removal replace: the filler token (default: the first "
                             "the tokenizer has)")
    parser.add_argument("--curve-steps", type=steps_value, metavar="N",
                        help="points of the deletion/insertion curves beyond 0 (default 10), "
                             "or all (every count of tokens)")
    parser.add_argument("--view-layers", choices=VIEW_LAYERS,
                        help="last (default): each view at the last layer of --scope; all: "
                             "at every layer")
    parser.add_argument("--magnitude", action="store_true",
                        help="rank attribution scores by |score| instead of the signed score")
    parser.add_argument("--query", type=query_value,
                        help="row the views read: auto (default), cls, last, mean, max, or "
                             "an index")
    parser.add_argument("--n-steps", type=positive,
                        help="Integrated Gradients steps (default 50)")
    parser.add_argument("--sanity", action="store_true",
                        help="model-randomisation check: flag sources whose ranking barely "
                             "changes on a copy with the top layers re-initialised")
    parser.add_argument("--randomize", type=positive, metavar="N",
                        help="with --sanity: top layers re-initialised (default: top half)")
    parser.add_argument("--sanity-threshold", type=float,
                        help="with --sanity: flag a source whose mean Spearman correlation "
                             "is above this (default 0.5)")
    parser.add_argument("--out", default="faithfulness.csv",
                        help="per-example table: .csv, .parquet or .json (default "
                             "faithfulness.csv)")
    parser.add_argument("--summary", help="also write the ranked summary with CIs here")
    parser.add_argument("--curves", help="also write the deletion/insertion curve points here")
    parser.add_argument("--plot", help="also draw the curves and the ranking: .png, .svg or "
                                       ".pdf")
    parser.set_defaults(run=cmd_faithfulness)
