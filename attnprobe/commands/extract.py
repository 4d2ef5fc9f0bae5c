"""``attnprobe extract``: capture attention maps, print a per-head summary, save the maps."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from attnprobe.commands.common import (
    TABLE_SUFFIXES,
    corpus_args,
    corpus_of,
    distributed_group,
    generation_args,
    generation_options,
    input_files,
    report_skipped,
    show_rows,
    texts_from_args,
    write_table,
)
from attnprobe.core.files import check_outputs
from attnprobe.errors import OutputError

EXTRACT_EXAMPLE = """examples:
  attnprobe extract --model minilm --text "The cat sat on the mat." --scope layers:0-1 \\
      --out maps.npz
  attnprobe extract --model ref:induction --text "t01 t02 t03 t04 t05 t06 t07 t08 t01 t02" \\
      --generate 6 --out generated.npz

With --generate N (causal language models) every text is a prompt continued by N tokens
(greedy, or sampled with --sample, seeded by --seed); each text gives one map over prompt +
generated tokens, equal to one forward over the whole sequence (its prompt_length marks
where generation began).
"""


def _outputs(args: argparse.Namespace) -> tuple[Path, Path | None]:
    """Check --out (and the .json sidecar of a .npz) and --bertviz together, before the run:
    no collision, no directory, no unrelated file replaced, no input overwritten."""
    from attnprobe.types import is_maps_sidecar, maps_paths

    out = Path(args.out)
    if out.suffix not in (".npz", *TABLE_SUFFIXES):
        raise OutputError(f"--out must end in .npz or {', '.join(TABLE_SUFFIXES)}; got {out}")
    bertviz = Path(args.bertviz) if args.bertviz else None
    if bertviz is not None and bertviz.suffix != ".json":
        raise OutputError(f"--bertviz must end in .json; got {bertviz}")
    sidecars = [(maps_paths(out)[1], is_maps_sidecar)] if out.suffix == ".npz" else []
    check_outputs([("--out", out), ("--bertviz", bertviz)], sidecars=sidecars,
                  inputs=input_files(args))
    return out, bertviz


def cmd_extract(args: argparse.Namespace) -> int:
    from attnprobe.capture import extract
    from attnprobe.commands.load_args import load_options_of
    from attnprobe.heads.summary import in_scope, summarize
    from attnprobe.loading import load_model
    from attnprobe.types import save_maps

    out, bertviz = _outputs(args)
    texts = texts_from_args(args)
    model, tokenizer = load_model(args.model, **load_options_of(args))
    generation = generation_options(args)
    with distributed_group(args.distributed) as (rank, world):
        corpus = corpus_of(args, world=world)
        maps = extract(model, tokenizer, texts, **generation, corpus=corpus)
        if rank != 0:
            return 0
    kept = {m.example_id for m in maps}
    report_skipped([str(i) for i in range(len(texts)) if str(i) not in kept])
    # maps hold the smallest grid around the scope; the tables hold exactly the scope
    summary = summarize(maps, scope=corpus.scope)
    with pd.option_context("display.max_rows", args.show, "display.width", 120,
                           "display.float_format", "{:.3f}".format):
        print(summary.drop(columns=["stack"]).to_string(index=False, max_rows=args.show))
    for amap in maps[:args.show] if generation else []:
        prompt, tokens = amap.prompt_length or 0, amap.readable_tokens()
        print(f"text {amap.example_id}: {' '.join(tokens[:prompt])} -> "
              f"{' '.join(tokens[prompt:])}")
    if out.suffix in TABLE_SUFFIXES:
        frame = pd.concat([m.to_frame() for m in maps], ignore_index=True)
        write_table(in_scope(frame, corpus.scope), out)
    else:
        save_maps(maps, out)
    if bertviz is not None:
        from attnprobe.report.bertviz import save_bertviz

        save_bertviz(maps, bertviz)
        print(f"wrote BertViz data for {len(maps)} maps to {bertviz}", file=sys.stderr)
    print(f"wrote {len(maps)} maps for {len(kept)} texts to {out}", file=sys.stderr)
    return 0


def register(sub: Any) -> None:
    """Add ``extract`` to the ``attnprobe`` sub-command parsers."""
    parser = sub.add_parser("extract", help="capture attention maps and print a per-head summary",
                            epilog=EXTRACT_EXAMPLE,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    corpus_args(parser, seed_help="part of the shared options; extraction draws nothing")
    parser.add_argument("--out", default="maps.npz",
                        help="maps.npz (+ .json sidecar), or a tidy table .csv/.parquet/.json")
    parser.add_argument("--bertviz", metavar="PATH.json",
                        help="also write the maps as BertViz JSON (attnprobe.report.bertviz)")
    parser.add_argument("--show", type=show_rows, default=20, help="summary rows to print")
    generation_args(parser)
    parser.set_defaults(run=cmd_extract)
