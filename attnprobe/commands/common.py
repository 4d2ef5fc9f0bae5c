"""What every ``attnprobe`` command shares: reading texts, checking and writing tables,
index lists, one-line usage errors, and the torch.distributed group under torchrun."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd

from attnprobe.errors import AttnProbeError

TABLE_SUFFIXES = (".csv", ".parquet", ".json")


_INDEX_ITEM = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")
MAX_INDICES = 4096  # no model has more layers or heads; stops "0-99999999" early
MAX_SKIPPED_SHOWN = 10  # ids of skipped sentences listed on stderr


def int_list(text: str) -> list[int]:
    """``"0,2,5"`` or ``"0-3"`` -> model indices."""
    values: list[int] = []
    for part in text.split(","):
        match = _INDEX_ITEM.match(part)
        if not match:
            raise argparse.ArgumentTypeError(f"expected indices like 0,2 or 0-3; got {text!r}")
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) is not None else low
        if high < low or high - low >= MAX_INDICES:
            raise argparse.ArgumentTypeError(f"bad range {part.strip()!r} in {text!r}")
        values.extend(range(low, high + 1))
    return values


def texts_from_args(args: argparse.Namespace,
           hint: str = "pass --text \"...\" or --text-file FILE (one text a line)") -> list[str]:
    texts = list(args.text or [])
    if args.text_file:
        path = Path(args.text_file)
        if not path.is_file():
            raise AttnProbeError(f"text file not found: {path}")
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError:
            raise AttnProbeError(f"{path} is not UTF-8 text") from None
        found = [line.strip() for line in lines if line.strip()]
        if not found:
            raise AttnProbeError(f"text file {path} has no text (every line is blank)")
        texts.extend(found)
    if not texts:
        raise AttnProbeError(f"no text: {hint}")
    return texts


def corpus_from_args(args: argparse.Namespace) -> tuple[list[str] | None, list[Any] | None]:
    """``(texts, None)`` from --text/--text-file, or ``(None, trees)`` from --conllu."""
    if args.conllu is None:
        return texts_from_args(args, "pass --text \"...\", --text-file FILE or --conllu FILE"), None
    if args.text or args.text_file:
        raise AttnProbeError("--conllu cannot be combined with --text/--text-file; give one "
                             "source of sentences")
    from attnprobe.heads.trees import read_conllu

    return None, read_conllu(Path(args.conllu))


def check_out(out: str | None, option: str) -> Path | None:
    """A table path (``.csv``/``.parquet``/``.json``) whose folder exists; checked before
    the run, so a typo does not cost a census."""
    if out is None:
        return None
    path = Path(out)
    if path.suffix not in TABLE_SUFFIXES:
        raise AttnProbeError(f"{option} must end in {', '.join(TABLE_SUFFIXES)}; got {out}")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def write_table(frame: pd.DataFrame, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".csv":
        frame.to_csv(out, index=False)
    elif out.suffix == ".parquet":
        try:
            frame.to_parquet(out, index=False)
        except ImportError:
            raise AttnProbeError("writing .parquet needs pyarrow (pip install pyarrow); "
                                 "or use .csv/.json") from None
    elif out.suffix == ".json":
        frame.to_json(out, orient="records", indent=1)
    else:
        raise AttnProbeError(f"unsupported output suffix {out.suffix!r}; use "
                             f"{', '.join(TABLE_SUFFIXES)}")


@contextlib.contextmanager
def distributed_group(enabled: bool) -> Iterator[tuple[int, int]]:
    """``(rank, world_size)`` of this process; with ``enabled`` and ``WORLD_SIZE > 1`` in the
    environment (as ``torchrun`` sets it) a gloo ``torch.distributed`` process group is
    initialised from the environment variables and destroyed on exit, also on error.
    Otherwise nothing is initialised and this is ``(0, 1)``."""
    raw = os.environ.get("WORLD_SIZE", "1") if enabled else "1"
    try:
        world = int(raw)
    except ValueError:
        raise AttnProbeError(f"WORLD_SIZE must be a whole number; got {raw!r}") from None
    if world <= 1:
        yield 0, 1
        return
    import torch.distributed as dist

    if not dist.is_available():
        raise AttnProbeError("--distributed: this torch build has no torch.distributed")
    if dist.is_initialized():  # someone else owns the group; use it, leave it alone
        yield dist.get_rank(), dist.get_world_size()
        return
    try:
        dist.init_process_group("gloo")
    except (ValueError, RuntimeError) as exc:
        raise AttnProbeError(f"--distributed: cannot start the process group "
                             f"(run under torchrun): {exc}") from None
    try:
        yield dist.get_rank(), dist.get_world_size()
    finally:
        dist.destroy_process_group()


def count_noun(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def wrote(args: argparse.Namespace, what: str, path: Path) -> None:
    if not args.quiet:
        print(f"wrote {what} to {path}", file=sys.stderr)


def text_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="minilm",
                        help="minilm (default), ref:<name>, or a local HF model directory")
    parser.add_argument("--text", action="append", help="a text (repeatable)")
    parser.add_argument("--text-file", help="a UTF-8 file with one text per line")


class Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line (the usage is in --help)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"attnprobe: error: {message}\n")


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
