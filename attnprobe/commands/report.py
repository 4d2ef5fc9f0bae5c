"""``attnprobe report``: one self-contained HTML page from the embedded default (or any) model."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from attnprobe.commands.common import (
    corpus_args,
    corpus_options,
    distributed_group,
    generation_args,
    generation_options,
    input_files,
    positive,
    query_value,
    report_skipped,
    texts_from_args,
)
from attnprobe.core.files import check_outputs
from attnprobe.errors import OutputError

REPORT_EXAMPLE = """examples:
  attnprobe report --model minilm --text-file analyses/data/census_sentences.txt --syntax \\
      --out report.html
  attnprobe report --text "The cat sat on the mat." --text "A dog barked." --out r.html
  attnprobe report --maps maps.npz --out r.html          # maps from attnprobe extract
  attnprobe report --text-file s.txt --target "similarity:A cat." --perturb uniform \
      --scope layer:0 --out r.html
  attnprobe report --model path/to/gpt2 --text-file prompts.txt --target next-token \
      --generate 8 --out r.html

The page holds the model card, every head's label and scores (head grid, layer profile,
clusters), an interactive attention view and model view of the first --view-texts texts,
the syntax table with --syntax (relations of at least 20 words), attention vs attributions
with --target and the effect of a perturbation with --perturb (figures; both computed on the
--view-texts texts, which the page says). The views read the row --query says (auto: the
last real token of a causal model, [CLS] of an encoder). With --generate N (causal language
models) the shown texts are prompts continued by N tokens: the attention view covers prompt +
generated tokens (the generated ones marked) and --target next-token explains every generated
token. It needs no network: open it from disk.
"""


def cmd_report(args: argparse.Namespace) -> int:
    from attnprobe.capture import extract
    from attnprobe.heads.head_census import census
    from attnprobe.loading import load_model
    from attnprobe.report import build

    out = Path(args.out)
    if out.suffix.lower() not in (".html", ".htm"):
        raise OutputError(f"--out must end in .html; got {args.out}")
    check_outputs([("--out", out)], inputs=[*input_files(args), ("--maps", args.maps)])
    if args.maps:  # maps saved by `attnprobe extract --out maps.npz`: no model needed
        from attnprobe.report import report_from_maps

        if args.text or args.text_file:
            raise OutputError("--maps cannot be combined with --text/--text-file")
        page = report_from_maps(args.maps, title=args.title)
        page.save(out)
        print(f"attention view of the maps in {args.maps}: {out}")
        return 0
    texts = texts_from_args(args)
    generation = generation_options(args)
    model, tokenizer = load_model(args.model)
    _check_early(args, model)
    options = corpus_options(args)
    with distributed_group(args.distributed) as (rank, world):
        result = census(model, tokenizer, texts, syntax=args.syntax, distributed=world > 1,
                        max_length=args.max_length, **options)
        if rank != 0:
            return 0
    report_skipped(result.skipped)
    shown = texts[:args.view_texts]
    quiet = {**options, "progress": False, "truncation": "cut", "max_length": args.max_length}
    comparison = perturbation = None
    if args.target:
        from attnprobe.attribution.comparison import compare

        comparison = compare(model, tokenizer, shown, args.target,
                             methods=["integrated_gradients", "saliency", "leave_one_out"],
                             views=["raw", "rollout"], query=args.query, n_steps=args.n_steps,
                             **generation, **quiet)
    # with --generate and --target the view shows the generations that were explained
    maps = comparison.maps if comparison is not None and comparison.maps else \
        extract(model, tokenizer, shown, **generation, **quiet)
    if args.perturb:
        from attnprobe.perturb.experiments import reads_target, run

        # --target is for the attributions; the perturbation gets it only if it reads one
        target = args.target if args.target and reads_target(args.perturb) else None
        perturbation = run(model, tokenizer, shown, args.perturb, target=target, **quiet)
    page = build(maps=maps, census=result, syntax=result.syntax() if args.syntax else None,
                 comparison=comparison, perturbation=perturbation, title=args.title)
    page.save(out)
    if not args.quiet:
        print(f"wrote {page.size_bytes / 1e6:.2f} MB to {out}", file=sys.stderr)
    print(f"{result.n_sentences} sentences, {len(maps)} in the attention view: {out}")
    return 0


def _check_early(args: argparse.Namespace, model: Any) -> None:
    """Refuse a bad --query, or a --generate the model or the target cannot take, before the
    census runs."""
    from attnprobe.attribution.view_common import check_query

    check_query(args.query)
    if args.generate is not None:
        from attnprobe.attribution.comparison import check_generation_target
        from attnprobe.capture.generation import check_generation

        if args.target:
            check_generation_target(model, args.target, None, args.generate)
        else:
            check_generation(model, args.generate)


def register(sub: Any) -> None:
    """Add ``report`` to the ``attnprobe`` sub-command parsers."""
    parser = sub.add_parser("report", help="one self-contained HTML page: heads, labels, "
                                           "attention view", epilog=REPORT_EXAMPLE,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    corpus_args(parser, batch_help="census sentences per forward")
    parser.add_argument("--out", default="report.html", help="the page (default report.html)")
    parser.add_argument("--syntax", action="store_true",
                        help="parse the texts with spaCy: syntax scores and table")
    parser.add_argument("--view-texts", type=positive, default=3,
                        help="texts shown in the attention view (default 3)")
    parser.add_argument("--target",
                        help="also compare attention with attributions on the shown texts "
                             "(class:K, next-token, similarity:TEXT ...)")
    parser.add_argument("--n-steps", type=positive, default=20,
                        help="Integrated Gradients steps for --target (default 20)")
    parser.add_argument("--query", type=query_value, default="auto",
                        help="row the attention views of --target read: auto (default: last "
                             "for causal models, cls otherwise), cls, last, mean, max, or an "
                             "index")
    generation_args(parser)
    parser.add_argument("--perturb", metavar="EXPERIMENT",
                        help="also run a perturbation experiment on the shown texts "
                             "(uniform, ablate, permute, ...)")
    parser.add_argument("--maps", help="build from maps saved by `attnprobe extract --out "
                                       "maps.npz` instead of running a model")
    parser.add_argument("--title", default="attnprobe report", help="page title")
    parser.set_defaults(run=cmd_report)
