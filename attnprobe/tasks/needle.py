"""A needle in a haystack for ``ref:induction``: retrieve a segment from deep in a long context.

Each example is ``[BOS]``, a *haystack* of random symbols ``t00 .. t63`` with the *needle* (a
random segment of ``needle_len`` symbols) starting at a chosen relative ``depth`` (0 = right
after ``[BOS]``, 1 = at the end of the haystack), then the needle again. The first
``prefix_len`` tokens of that final copy are the prompt's end; the rest is what the model must
retrieve. Teacher-forced, every position of the final copy from ``prefix_len - 1`` on is a
*copy step*: its next token is the needle token after the one it holds (Wu et al.'s retrieval
setting, made exact: the source of each copied token is known by construction).

With ``distinct=True`` (the default) the needle's symbols are all different and none occurs
in the haystack, so each needle token has exactly one earlier occurrence to copy from; with
``distinct=False`` the haystack is uniform over every symbol, and a one-token induction copy
meets about ``length / 64`` distractor occurrences of each token — the copy then fails for a
reason that has nothing to do with positions.

:class:`Needles` has the fields of :class:`attnprobe.heads.retrieval.CopyTask`, so
``retrieval_scores(model, tok, needles)`` and ``copy_accuracy(model, tok, needles)`` take it
directly; :func:`greedy_continuation` lets the model generate the rest itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from attnprobe.core.checks import check_number
from attnprobe.core.display import counted, describe
from attnprobe.core.residence import input_device
from attnprobe.errors import InputError
from attnprobe.models.induction import N_SYMBOLS, induction_tokenizer
from attnprobe.models.tokenizer import WordTokenizer

__all__ = ["Needles", "greedy_continuation", "needle_task"]


@dataclass(frozen=True)
class Needles:
    """A batch of needle contexts (module docstring), all of one length.

    Shapes (``[example, seq]`` unless noted; ``seq = length``):
        input_ids, attention_mask: the teacher-forced sequences (no padding).
        target: the needle token to produce after each copy step, -1 elsewhere.
        source: True on the needle's span in the haystack.
        needle_start: ``[example]`` where the needle starts; copy_start: where its final copy
            starts (``length - needle_len``).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    target: torch.Tensor
    source: torch.Tensor
    needle_start: torch.Tensor
    depth: float
    needle_len: int
    prefix_len: int
    distinct: bool

    @property
    def length(self) -> int:
        return self.input_ids.shape[1]

    def __repr__(self) -> str:
        return describe("Needles", f"{counted(self.input_ids.shape[0], 'context')} × "
                        f"{counted(self.length, 'token')}",
                        f"needle of {counted(self.needle_len, 'token')} at depth {self.depth:g}",
                        f"prefix {self.prefix_len}", "distinct" if self.distinct else None)

    @property
    def copy_start(self) -> int:
        return self.length - self.needle_len

    @property
    def prompt_ids(self) -> torch.Tensor:
        """``[example, length - needle_len + prefix_len]``: context and the needle's prefix."""
        return self.input_ids[:, :self.copy_start + self.prefix_len]

    @property
    def answer_ids(self) -> torch.Tensor:
        """``[example, needle_len - prefix_len]``: the tokens the model must retrieve."""
        return self.input_ids[:, self.copy_start + self.prefix_len:]

    def texts(self, tokenizer: WordTokenizer, *, prompt: bool = False) -> list[str]:
        """The examples as space-separated symbols (``[BOS]`` left to the tokenizer); with
        ``prompt=True`` only context and prefix."""
        rows = self.prompt_ids if prompt else self.input_ids
        return [" ".join(tokenizer.convert_ids_to_tokens(row[1:].tolist())) for row in rows]


def needle_task(n: int, *, length: int, depth: float, needle_len: int = 16,
                prefix_len: int = 2, distinct: bool = True, seed: int = 0,
                tokenizer: WordTokenizer | None = None) -> Needles:
    """``n`` needle contexts of ``length`` tokens (``[BOS]`` and the final copy included).

    Args:
        length: tokens per example; at most the tokenizer's ``model_max_length`` (2,048 for
            ``ref:induction``).
        depth: where the needle starts in the haystack, 0 (first) to 1 (last possible place).
        needle_len: symbols in the needle (at most 32 with ``distinct``).
        prefix_len: needle tokens given at the end of the prompt (>= 1); the remaining
            ``needle_len - prefix_len`` are retrieved (the copy steps).
        distinct: the needle's symbols are distinct and absent from the haystack.
        seed: seeds every draw (a CPU generator; the global RNG is untouched).
        tokenizer: ``ref:induction``'s (default: :func:`induction_tokenizer`).

    Raises:
        InputError: sizes that do not fit (no copy step, a haystack shorter than the needle,
            a context longer than the tokenizer's positions).

    Example:
        >>> needles = needle_task(2, length=64, depth=0.5, needle_len=8)
        >>> needles.input_ids.shape                     # [example, length]
        torch.Size([2, 64])
        >>> needles.copy_start                          # the final copy: the last 8 tokens
        56
        >>> int((needles.target >= 0).sum(-1)[0])       # copy steps: needle_len - prefix_len
        6
        >>> start = int(needles.needle_start[0])        # the needle, then its copy
        >>> torch.equal(needles.input_ids[0, start:start + 8], needles.input_ids[0, 56:])
        True
    """
    tokenizer = induction_tokenizer() if tokenizer is None else tokenizer
    check_number("n", n, integer=True, minimum=1)
    check_number("needle_len", needle_len, integer=True, minimum=2)
    check_number("prefix_len", prefix_len, integer=True, minimum=1)
    check_number("depth", depth, integer=False, minimum=0)
    if depth > 1:
        raise InputError(f"depth must be between 0 and 1; got {depth!r}")
    if prefix_len >= needle_len:
        raise InputError(f"prefix_len {prefix_len} leaves nothing to retrieve from a needle of "
                         f"{needle_len}: the task would have no copy step")
    if distinct and 2 * needle_len > N_SYMBOLS:
        raise InputError(f"a distinct needle of {needle_len} symbols leaves too few of the "
                         f"{N_SYMBOLS} for the haystack; use needle_len <= {N_SYMBOLS // 2}")
    check_number("length", length, integer=True, minimum=1)
    haystack = length - 1 - needle_len
    if haystack < needle_len:
        raise InputError(f"length {length} cannot hold [BOS], a haystack with the needle and "
                         f"its copy; use length >= {2 * needle_len + 1}")
    limit = getattr(tokenizer, "model_max_length", None)
    if isinstance(limit, int) and length > limit:
        raise InputError(f"length {length} is longer than the model's {limit} positions")
    first = tokenizer.convert_tokens_to_ids(["t00"])[0]
    generator = torch.Generator().manual_seed(seed)
    start = 1 + round(depth * (haystack - needle_len))
    ids = torch.empty(n, length, dtype=torch.long)
    ids[:, 0] = tokenizer.bos_token_id
    for b in range(n):
        order = torch.randperm(N_SYMBOLS, generator=generator)
        if distinct:
            needle, rest = order[:needle_len], order[needle_len:]
            hay = rest[torch.randint(0, len(rest), (haystack,), generator=generator)]
        else:
            needle = torch.randint(0, N_SYMBOLS, (needle_len,), generator=generator)
            hay = torch.randint(0, N_SYMBOLS, (haystack,), generator=generator)
        ids[b, 1:1 + haystack] = first + hay
        ids[b, start:start + needle_len] = first + needle
        ids[b, 1 + haystack:] = first + needle
    copy = 1 + haystack
    target = torch.full_like(ids, -1)
    steps = slice(copy + prefix_len - 1, length - 1)  # the query holds needle[j], emits j + 1
    target[:, steps] = ids[:, steps.start + 1:]
    source = torch.zeros(n, length, dtype=torch.bool)
    source[:, start:start + needle_len] = True
    return Needles(ids, torch.ones_like(ids), target, source,
                   torch.full((n,), start, dtype=torch.long), float(depth), needle_len,
                   prefix_len, distinct)


def greedy_continuation(model: nn.Module, needles: Needles, *,
                        batch_size: int = 16) -> torch.Tensor:
    """Let the model generate the retrieved part itself, greedily (no teacher forcing: each
    generated token is fed back), from :attr:`Needles.prompt_ids`.

    Returns ``[example, needle_len - prefix_len]`` bool: each generated token is the
    needle's. Runs one forward per generated token (reference models keep no cache).

    Example:
        >>> needles = needle_task(2, length=32, depth=0.5, needle_len=6)
        >>> hits = greedy_continuation(lm, needles)     # [example, needle_len - prefix_len]
        >>> hits.shape, hits.dtype
        (torch.Size([2, 4]), torch.bool)
        >>> hits.float().mean()                         # share of needle tokens retrieved
    """
    check_number("batch_size", batch_size, integer=True, minimum=1)
    device = input_device(model)
    answer = needles.answer_ids
    out = []
    with torch.no_grad():
        for start in range(0, len(answer), batch_size):
            ids = needles.prompt_ids[start:start + batch_size].to(device)
            for _ in range(answer.shape[1]):
                logits = model(ids)  # [batch, seq, vocab]
                logits = logits if isinstance(logits, torch.Tensor) else logits.logits
                ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
            out.append(ids[:, -answer.shape[1]:].cpu())
    return torch.cat(out) == answer
