"""What every ``attnprobe`` command shares: the corpus options (model, texts or token ids,
scope, batch size, truncation, seed, ``--distributed``, ``--quiet``), reading texts, checking
outputs before the run and writing tables atomically, and one-line usage errors."""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from attnprobe.commands.load_args import model_args
from attnprobe.core.corpus_options import CorpusOptions
from attnprobe.core.distributed import start_group, torchrun_env
from attnprobe.core.files import atomic_write, check_outputs
from attnprobe.core.lines import read_lines
from attnprobe.core.options import CliOption
from attnprobe.core.registry import Registry
from attnprobe.core.scope import SCOPE_FORMS, Scope
from attnprobe.errors import AttnProbeError, InputError, OutputError
from attnprobe.inputs.text import DEFAULT_BATCH_SIZE, Text, TokenIds

TABLE_SUFFIXES = (".csv", ".parquet", ".json")
MAX_SKIPPED_SHOWN = 10  # ids of skipped sentences listed on stderr


class Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line (the usage is in --help)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"attnprobe: error: {message}\n")


# ------------------------------------------------------------------------------- value types
def non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number; got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0; got {value}")
    return value


def positive(text: str) -> int:
    value = non_negative(text)
    if value == 0:
        raise argparse.ArgumentTypeError("expected a number >= 1; got 0")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number; got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a finite number > 0; got {text}")
    return value


def names(text: str) -> list[str]:
    """``"a,b"`` -> ``["a", "b"]``."""
    found = [part.strip() for part in text.split(",") if part.strip()]
    if not found:
        raise argparse.ArgumentTypeError(f"expected comma-separated names; got {text!r}")
    return found


def ids_value(text: str) -> TokenIds:
    """``--ids "2 14 15"`` (spaces or commas between the ids)."""
    try:
        return ids_of(text)
    except InputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def ids_of(line: str, where: str = "--ids") -> TokenIds:
    """Whitespace- (or comma-) separated token ids as :class:`TokenIds`."""
    parts = line.replace(",", " ").split()
    if not parts:
        raise InputError(f"{where} holds no token id")
    bad = next((p for p in parts if not (p.isascii() and p.isdigit())), None)
    if bad is not None:
        raise InputError(f"{where}: {bad!r} is not a token id (a whole number >= 0)")
    return TokenIds(tuple(int(p) for p in parts))


def positions_type(flag: str) -> Callable[[str], str | list[int]]:
    """An argparse type for a positions flag (``flag``, for its message): ``last``, ``all``
    or comma-separated integers."""
    def value(text: str) -> str | list[int]:
        text = text.strip()
        if text in ("last", "all"):
            return text
        try:
            return [int(part) for part in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must be 'last', 'all' or integers such "
                                             f"as 0,3,-1; got {text!r}") from None

    return value


def checked_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An option's own check (``parse``, raising InputError) as an argparse type: its
    one-line message."""
    def value(text: str) -> Any:
        try:
            return parse(text)
        except InputError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return value


def scope_value(text: str) -> Scope:
    try:
        return Scope.parse(text)
    except InputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# ------------------------------------------------------------------------------- options
def text_args(parser: argparse.ArgumentParser) -> None:
    model_args(parser)  # --model and how it is loaded (--dtype, --device-map ...)
    parser.add_argument("--text", action="append", help="a text (repeatable); a tab inside "
                        "makes it a sentence pair when the tokenizer has a pair template "
                        "(BERT's [CLS] a [SEP] b [SEP]), else the tab is kept")
    parser.add_argument("--text-file", help="a UTF-8 file with one text per line")
    parser.add_argument("--ids", action="append", type=ids_value, metavar="IDS",
                        help="a text as token ids, e.g. \"2 14 15\" (repeatable): given to "
                             "the model as they are, no special token added")
    parser.add_argument("--ids-file", help="a file with one text per line as whitespace-"
                        "separated token ids")


def corpus_args(parser: argparse.ArgumentParser, *, batch_help: str = "texts per forward",
                seed_help: str = "seeds every random choice (default 0)",
                batch_default: int | None = DEFAULT_BATCH_SIZE) -> None:
    """The options of every corpus command, with the same names, meanings and defaults as
    the Python signature ``(model, tokenizer, texts, *, scope, batch_size, truncation, seed,
    progress)``."""
    text_args(parser)
    run_args(parser, batch_help=batch_help, seed_help=seed_help, batch_default=batch_default)


def run_args(parser: argparse.ArgumentParser, *, scope_help: str = "heads to analyse",
             batch_help: str = "texts per forward",
             seed_help: str = "seeds every random choice (default 0)",
             truncate_help: str = "cut texts longer than the model allows instead of failing",
             skip_help: str = "leave out texts longer than the model allows (listed on stderr)",
             length_help: str = "cap on tokens per text",
             batch_default: int | None = DEFAULT_BATCH_SIZE) -> None:
    """The options of :func:`corpus_args` but the inputs (``--scope`` ... ``--quiet``), for
    a command that reads its inputs its own way (``patch``: clean and corrupted ones).
    ``batch_default`` None: the analysis picks (``batch_help`` says how)."""
    parser.add_argument("--scope", action="append", type=scope_value, metavar="SCOPE",
                        help=f"{scope_help} (repeatable, merged): {SCOPE_FORMS}; default all")
    parser.add_argument("--batch-size", type=positive, default=batch_default,
                        help=batch_help if batch_default is None
                        else f"{batch_help} (default {batch_default})")
    long = parser.add_mutually_exclusive_group()
    long.add_argument("--truncate", action="store_true", help=truncate_help)
    long.add_argument("--skip-long", action="store_true", help=skip_help)
    parser.add_argument("--max-length", type=positive, help=length_help)
    parser.add_argument("--seed", type=non_negative, default=0, help=seed_help)
    parser.add_argument("--distributed", action="store_true",
                        help="under torchrun (WORLD_SIZE > 1): split the work over the "
                             "processes (gloo); rank 0 writes and prints; the processes wait "
                             "ATTNPROBE_RENDEZVOUS_TIMEOUT seconds (default 120) for each "
                             "other. No-op otherwise")
    parser.add_argument("--quiet", action="store_true",
                        help="no progress bar or 'wrote' notes on stderr")


def scope_of(args: argparse.Namespace) -> Scope:
    """The merged ``--scope`` options (every head when none is given)."""
    return Scope.parse(args.scope) if args.scope else Scope()


def truncation_of(args: argparse.Namespace) -> str:
    return "cut" if args.truncate else "skip" if args.skip_long else "error"


def corpus_options(args: argparse.Namespace) -> dict[str, Any]:
    """Keyword arguments of the shared corpus signature, from the parsed options."""
    return {"scope": scope_of(args), "batch_size": args.batch_size,
            "truncation": truncation_of(args), "seed": args.seed, "progress": not args.quiet}


def corpus_of(args: argparse.Namespace, *, world: int = 1) -> CorpusOptions:
    """The :class:`~attnprobe.core.corpus_options.CorpusOptions` of the parsed options
    (``--max-length`` included), split over the ``world`` processes of a
    :func:`distributed_group` when there are several."""
    return CorpusOptions(**corpus_options(args), max_length=args.max_length,
                         distributed=world > 1)


# ------------------------------------------------------------------------------- experiments
def experiment_type(registry: Registry[Any], what: str = "experiment") -> Callable[[str], str]:
    """An argparse type: the name of an experiment registered in ``registry``."""
    def value(text: str) -> str:
        if text not in registry:
            raise argparse.ArgumentTypeError(f"unknown {what} {text!r}; choose one of "
                                             f"{', '.join(registry.names())}")
        return text

    return value


def option_args(parser: Any, options: Sequence[CliOption]) -> None:
    """One flag per experiment option (:func:`attnprobe.core.options.cli_options`), checked
    as ``run()`` checks it."""
    for item in options:
        parser.add_argument(item.flag, dest=item.name, type=checked_type(item.parse),
                            metavar=item.metavar, help=item.help)


def option_keywords(args: argparse.Namespace, options: Sequence[CliOption], experiment: str,
                    flag: str = "--experiment") -> dict[str, Any]:
    """``run()`` keywords from the flags of :func:`option_args`; a flag of another experiment
    than ``experiment`` (chosen with ``flag``) is an error, not silently ignored."""
    keywords: dict[str, Any] = {}
    for item in options:
        value = getattr(args, item.name)
        if value is None:
            continue
        if experiment not in item.experiments:
            raise AttnProbeError(f"{item.flag} applies to {flag} "
                                 f"{'/'.join(item.experiments)}, not {experiment}")
        keywords[item.name] = value
    return keywords


# ------------------------------------------------------------------------------- causal LMs
def generation_args(parser: argparse.ArgumentParser) -> None:
    """``--generate N`` and ``--sample``, shared by extract, compare and report."""
    parser.add_argument("--generate", type=int, metavar="N",
                        help="continue each text by N tokens (causal language models) and "
                             "take the attention of prompt + generated tokens")
    parser.add_argument("--sample", action="store_true",
                        help="with --generate: sample the tokens (seeded by --seed) instead "
                             "of taking the most likely one")


def generation_options(args: argparse.Namespace) -> dict[str, Any]:
    """``generate`` / ``sample`` keyword arguments (none without --generate)."""
    if args.generate is None:
        if args.sample:
            raise InputError("--sample needs --generate N")
        return {}
    return {"generate": args.generate, "sample": args.sample}


def query_value(text: str) -> str | int:
    """``--query``: a row index, or a name (checked by the library: one-line error)."""
    return int(text) if text.lstrip("-").isdigit() else text


# ------------------------------------------------------------------------------- inputs
def texts_from_args(args: argparse.Namespace,
                    hint: str = "pass --text \"...\", --text-file FILE (one text a line), "
                                "--ids \"2 14 15\" or --ids-file FILE"
                    ) -> list[Text]:
    """The texts of ``--text``, ``--text-file``, ``--ids`` and ``--ids-file``, in that order
    (a text's index in this list is its ``example_id``)."""
    texts: list[Text] = list(getattr(args, "text", None) or [])
    if getattr(args, "text_file", None):
        texts.extend(line.text for line in read_lines(args.text_file, "text"))
    texts.extend(getattr(args, "ids", None) or [])
    if getattr(args, "ids_file", None):
        texts.extend(ids_of(line.text, f"{args.ids_file} line {line.number}")
                     for line in read_lines(args.ids_file, "ids"))
    if not texts:
        raise AttnProbeError(f"no text: {hint}")
    return texts


def corpus_from_args(args: argparse.Namespace) -> tuple[list[Text] | None, list[Any] | None]:
    """``(texts, None)`` from --text/--text-file/--ids/--ids-file, or ``(None, trees)`` from
    --conllu."""
    if args.conllu is None:
        return texts_from_args(args, "pass --text \"...\", --text-file FILE, --ids \"2 14 15\", "
                                     "--ids-file FILE or --conllu FILE"), None
    if args.text or args.text_file or getattr(args, "ids", None) \
            or getattr(args, "ids_file", None):
        raise AttnProbeError("--conllu cannot be combined with --text/--text-file/--ids/"
                             "--ids-file; give one source of sentences")
    from attnprobe.heads.trees import read_conllu

    return None, read_conllu(Path(args.conllu))


def report_skipped(skipped: tuple[str, ...] | list[str], what: str = "text") -> None:
    if not skipped:
        return
    shown = ", ".join(skipped[:MAX_SKIPPED_SHOWN])
    more = len(skipped) - MAX_SKIPPED_SHOWN
    print(f"skipped {count_noun(len(skipped), what)} longer than the model allows "
          f"(ids: {shown}{f', ... and {more} more' if more > 0 else ''})", file=sys.stderr)


# ------------------------------------------------------------------------------- outputs
def table_path(out: str | None, option: str) -> Path | None:
    """A table path (``.csv``/``.parquet``/``.json``), or None."""
    if out is None:
        return None
    path = Path(out)
    if path.suffix not in TABLE_SUFFIXES:
        raise OutputError(f"{option} must end in {', '.join(TABLE_SUFFIXES)}; got {out}")
    return path


def input_files(args: argparse.Namespace) -> list[tuple[str, str | None]]:
    """The files a command reads (``--text-file``, ``--ids-file``, ``--conllu``): no output
    may replace one."""
    return [(option, getattr(args, option[2:].replace("-", "_"), None))
            for option in ("--text-file", "--ids-file", "--conllu")]


def check_tables(args: argparse.Namespace, *outputs: tuple[str, str | None]
                 ) -> list[Path | None]:
    """Each ``(option, path)`` as a table path, all checked together before the run (no two
    the same, none a directory or a file the command reads, every folder writable)."""
    paths = [table_path(value, option) for option, value in outputs]
    check_outputs(list(outputs), inputs=input_files(args))
    return paths


def write_table(frame: pd.DataFrame, out: Path) -> None:
    """Write ``frame`` by suffix, atomically (a killed run leaves no partial table)."""
    if out.suffix == ".csv":
        atomic_write(out, lambda tmp: frame.to_csv(tmp, index=False))
    elif out.suffix == ".parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise AttnProbeError("writing .parquet needs pyarrow (pip install pyarrow); "
                                 "or use .csv/.json") from None
        atomic_write(out, lambda tmp: frame.to_parquet(tmp, index=False))
    elif out.suffix == ".json":
        atomic_write(out, lambda tmp: frame.to_json(tmp, orient="records", indent=1))
    else:
        raise OutputError(f"unsupported output suffix {out.suffix!r}; use "
                          f"{', '.join(TABLE_SUFFIXES)}")


def count_noun(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def wrote(args: argparse.Namespace, what: str, path: Path) -> None:
    if not args.quiet:
        print(f"wrote {what} to {path}", file=sys.stderr)


def show_rows(text: str) -> int:
    """``--show N``: rows to print, at least 1."""
    return positive(text)


# ------------------------------------------------------------------------------- torchrun
@contextlib.contextmanager
def distributed_group(enabled: bool) -> Iterator[tuple[int, int]]:
    """``(rank, world_size)`` of this process; with ``enabled`` and ``WORLD_SIZE > 1`` in the
    environment (as ``torchrun`` sets it) a gloo ``torch.distributed`` process group is
    initialised from the environment variables and destroyed on exit, also on error.
    Otherwise nothing is initialised and this is ``(0, 1)``."""
    # every torchrun variable checked before anything waits (a bad one would hang for minutes)
    launch = torchrun_env(context="--distributed") if enabled else None
    if launch is None:
        yield 0, 1
        return
    import torch.distributed as dist

    if not dist.is_available():
        raise AttnProbeError("--distributed: this torch build has no torch.distributed")
    if dist.is_initialized():  # someone else owns the group; use it, leave it alone
        yield dist.get_rank(), dist.get_world_size()
        return
    start_group(launch, context="--distributed")  # a finite rendezvous, one-line errors
    try:
        yield dist.get_rank(), dist.get_world_size()
    finally:
        dist.destroy_process_group()
