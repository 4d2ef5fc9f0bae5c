"""``attnprobe report``: one self-contained HTML page from the embedded default (or any) model."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from attnprobe.commands.common import (
    corpus_args,
    corpus_of,
    distributed_group,
    experiment_type,
    generation_args,
    generation_options,
    input_files,
    option_args,
    option_keywords,
    positions_type,
    positive,
    query_value,
    report_skipped,
    texts_from_args,
)
from attnprobe.core.files import check_outputs
from attnprobe.core.metric_kind import metric_forms
from attnprobe.core.options import CliOption, registered_options
from attnprobe.errors import AttnProbeError, OutputError

REPORT_EXAMPLE = """examples:
  attnprobe report --model minilm --text-file analyses/data/census_sentences.txt --syntax \\
      --out report.html
  attnprobe report --text "The cat sat on the mat." --text "A dog barked." --out r.html
  attnprobe report --maps maps.npz --out r.html          # maps from attnprobe extract
  attnprobe report --text-file s.txt --target "similarity:A cat." --perturb uniform \\
      --scope layer:0 --out r.html
  attnprobe report --model path/to/gpt2 --text-file prompts.txt --target next-token \\
      --generate 8 --out r.html
  attnprobe report --model ref:induction --text-file clean.txt --corrupt-file corrupt.txt \\
      --metric logit:next --metric-positions all --out r.html      # + patching

The page holds the model card, every head's label and scores (head grid, layer profile,
clusters), an interactive attention view and model view of the first --view-texts texts, the
syntax table with --syntax (relations of at least 20 words), attention vs attributions with
--target (with --faithfulness also which of them the model agrees with: erasure tests, ranked
with confidence intervals) and the effect of a perturbation with --perturb (figures; all
computed on the --view-texts texts, which the page says). The views read the row --query says
(auto: the last real token of a causal model, [CLS] of an encoder). With --generate N (causal
language models) the shown texts are prompts continued by N tokens: the attention view covers
prompt + generated tokens (the generated ones marked) and --target next-token explains every
generated token. Pre-norm language models whose layout attnprobe knows (GPT-2, LLaMA-layout
decoders, the reference models; not MiniLM or BERT) also get the direct logit attribution of
logit:next at every position of the first --causal-texts texts (layer x head, top heads) and
the Q/K/V composition of their heads over the random baseline (from the weights);
--no-logit-attribution and --no-composition leave them out. With --corrupt-file (one
corrupted text per text, each of the same token length) the page adds a patching experiment
(--patch: heads, path or attribution; options as for `attnprobe patch`) on the first
--causal-texts pairs, measuring --metric (default logit:next: the clean text's next token,
read in every run) at --metric-positions (default: every position with a next token for
logit:next and loss, the last for other metrics). Texts of one token have no next token: the
causal sections leave them out and say so. It needs no network: open it from disk.
"""


def cmd_report(args: argparse.Namespace) -> int:
    """Parse the options, run :func:`attnprobe.report.from_model` (or read saved maps), write
    the page."""
    from attnprobe.commands.load_args import load_options_of
    from attnprobe.loading import load_model
    from attnprobe.report import from_model

    out = Path(args.out)
    if out.suffix.lower() not in (".html", ".htm"):
        raise OutputError(f"--out must end in .html; got {args.out}")
    check_outputs([("--out", out)], inputs=[*input_files(args), ("--maps", args.maps),
                                            ("--corrupt-file", args.corrupt_file)])
    if args.maps:  # maps saved by `attnprobe extract --out maps.npz`: no model needed
        return _from_maps(args, out)
    texts = texts_from_args(args)
    generation = generation_options(args)
    patching = _patching(args)
    model, tokenizer = load_model(args.model, **load_options_of(args))
    with distributed_group(args.distributed) as (rank, world):
        page = from_model(model, tokenizer, texts, corpus=corpus_of(args, world=world),
                          syntax=args.syntax, view_texts=args.view_texts, target=args.target,
                          n_steps=args.n_steps, faithfulness=args.faithfulness,
                          query=args.query, perturb=args.perturb,
                          logit_attribution=args.logit_attribution,
                          composition=args.composition, causal_texts=args.causal_texts,
                          title=args.title, **generation, **patching)
        if rank != 0:
            return 0
    result, maps = page.contents.census, page.contents.maps
    report_skipped(result.skipped)
    page.save(out)
    if not args.quiet:
        print(f"wrote {page.size_bytes / 1e6:.2f} MB to {out}", file=sys.stderr)
    print(f"{result.n_sentences} sentences, {len(maps)} in the attention view: {out}")
    return 0


def _patch_options() -> list[CliOption]:
    """The options of every patching experiment, as ``attnprobe patch`` has them."""
    from attnprobe.patch import EXPERIMENTS

    return registered_options(EXPERIMENTS.values())


def _patching(args: argparse.Namespace) -> dict[str, Any]:
    """``from_model``'s patching keywords (none without --corrupt-file); a patching flag
    without it, or an option of another experiment, is an error."""
    options = _patch_options()
    if args.corrupt_file is None:
        flags = [flag for flag, value in (("--patch", args.patch), ("--metric", args.metric),
                                          ("--metric-positions", args.metric_positions))
                 if value is not None]
        flags += [item.flag for item in options if getattr(args, item.name) is not None]
        if flags:
            raise AttnProbeError(f"{flags[0]} applies to patching: give --corrupt-file (one "
                                 "corrupted text per text)")
        return {}
    experiment = args.patch or "heads"
    given = option_keywords(args, options, experiment, "--patch")
    corrupt = texts_from_args(
        argparse.Namespace(text=None, text_file=args.corrupt_file, ids=None, ids_file=None),
        "pass --corrupt-file FILE (one corrupted text a line)")
    return {"corrupt": corrupt, "patch": experiment, "patch_options": given,
            "metric": args.metric or "logit:next",
            "metric_positions": args.metric_positions}  # None: the metric's default


def _from_maps(args: argparse.Namespace, out: Path) -> int:
    from attnprobe.report import report_from_maps

    if args.text or args.text_file:
        raise OutputError("--maps cannot be combined with --text/--text-file")
    if args.corrupt_file:
        raise OutputError("--maps cannot be combined with --corrupt-file (patching runs the "
                          "model)")
    page = report_from_maps(args.maps, title=args.title)
    page.save(out)
    print(f"attention view of the maps in {args.maps}: {out}")
    return 0


def register(sub: Any) -> None:
    """Add ``report`` to the ``attnprobe`` sub-command parsers."""
    from attnprobe.patch import EXPERIMENTS
    from attnprobe.report.causal import DEFAULT_CAUSAL_TEXTS

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
    parser.add_argument("--faithfulness", action="store_true",
                        help="with --target: also test which of the compared sources the "
                             "model agrees with (erasure tests on the shown texts: ranked "
                             "summary with CIs, deletion curves)")
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
    causal = parser.add_argument_group("causal sections (pre-norm language models)")
    causal.add_argument("--no-logit-attribution", dest="logit_attribution",
                        action="store_false",
                        help="leave out the direct logit attribution section")
    causal.add_argument("--no-composition", dest="composition", action="store_false",
                        help="leave out the composition section")
    causal.add_argument("--causal-texts", type=positive, default=DEFAULT_CAUSAL_TEXTS,
                        metavar="N", help="texts read by the direct logit attribution and "
                        f"patching: the first N (default {DEFAULT_CAUSAL_TEXTS})")
    causal.add_argument("--corrupt-file", metavar="FILE",
                        help="one corrupted text a line, one per text (same token length): "
                             "add a patching section")
    causal.add_argument("--patch", type=experiment_type(EXPERIMENTS, "patching experiment"),
                        metavar="EXPERIMENT",
                        help="with --corrupt-file: heads (default: activation patching), "
                             "path or attribution")
    causal.add_argument("--metric", metavar="SPEC",
                        help=f"with --corrupt-file: what patching measures ({metric_forms()}; "
                             "default logit:next)")
    causal.add_argument("--metric-positions", type=positions_type("--metric-positions"),
                        metavar="WHERE",
                        help="where --metric reads: last, all, or positions such as 0,3,-1 "
                             "(default: all for logit:next and loss, last for the others)")
    option_args(causal, _patch_options())
    parser.add_argument("--maps", help="build from maps saved by `attnprobe extract --out "
                                       "maps.npz` instead of running a model")
    parser.add_argument("--title", default="attnprobe report", help="page title")
    parser.set_defaults(run=cmd_report)
