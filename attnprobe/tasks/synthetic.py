"""Synthetic sequence-to-sequence tasks whose true alignment is known.

Output position ``t`` is produced from input position ``π(t)``; the tasks differ in ``π``:

- ``copy``: π(t) = t (the diagonal);
- ``reverse``: π(t) = n − 1 − t (the anti-diagonal);
- ``sort``: π(t) = argsort(x)[t], ties broken by position;
- ``bigram_flip``: each adjacent pair swapped (π = 1, 0, 3, 2, ...);
- ``permutation``: one fixed random permutation per length (seeded);
- ``translation``: a translation-like task — a fixed bijective "lexicon" maps every source word
  to a target word, and adjacent pairs are swapped (local reordering), so the alignment is
  ``bigram_flip`` while no output token equals its input token.

Ids: 0 = ``[PAD]``, 1 = ``[BOS]``, 2 = ``[EOS]``, words are 3 .. vocab_size − 1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnprobe.core.display import counted, describe
from attnprobe.core.registry import Registry
from attnprobe.errors import InputError

PAD, BOS, EOS = 0, 1, 2
FIRST_WORD = 3

# alignment function: (source words [n], generator) -> π as LongTensor [n]
Alignment = Callable[[torch.Tensor, torch.Generator], torch.Tensor]
ALIGNMENT_TASKS: Registry[Alignment] = Registry("alignment task")


@ALIGNMENT_TASKS.register("copy")
def _copy(words: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    return torch.arange(len(words))


@ALIGNMENT_TASKS.register("reverse")
def _reverse(words: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    return torch.arange(len(words) - 1, -1, -1)


@ALIGNMENT_TASKS.register("sort")
def _sort(words: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    return torch.sort(words, stable=True).indices


def _flip(n: int) -> torch.Tensor:
    pi = torch.arange(n)
    pairs = n - n % 2
    pi[:pairs] = pi[:pairs].view(-1, 2).flip(-1).reshape(-1)
    return pi


@ALIGNMENT_TASKS.register("bigram_flip")
def _bigram_flip(words: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    return _flip(len(words))


@ALIGNMENT_TASKS.register("permutation")
def _permutation(words: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    fixed = torch.Generator().manual_seed(1000 + len(words))  # one permutation per length
    return torch.randperm(len(words), generator=fixed)


@ALIGNMENT_TASKS.register("translation")
def _translation(words: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    return _flip(len(words))


def lexicon(vocab_size: int, seed: int = 0) -> torch.Tensor:
    """The ``translation`` task's word map: ``[vocab_size]`` ids, specials fixed, no word
    mapped to itself (a derangement of the words).

    Example:
        >>> table = lexicon(8)                          # ids 0-2 special, words 3..7
        >>> table.tolist()
        [0, 1, 2, 4, 5, 6, 7, 3]
        >>> sorted(table.tolist()) == list(range(8))    # a bijection
        True
    """
    n_words = vocab_size - FIRST_WORD
    shift = 1 + seed % max(1, n_words - 1)
    words = torch.arange(n_words)
    table = torch.arange(vocab_size)
    table[FIRST_WORD:] = FIRST_WORD + (words + shift) % n_words
    return table


@dataclass(frozen=True)
class TaskBatch:
    """A padded batch of one synthetic task.

    Shapes:
        source: ``[batch, src]`` word ids, right-padded with 0 (``source_mask`` 1 = real).
        decoder_input: ``[batch, 1 + tgt]`` = ``[BOS] + target`` (teacher forcing).
        labels: ``[batch, tgt + 1]`` = ``target + [EOS]``, padded with 0.
        alignment: per example, π as LongTensor ``[n]``: label t comes from source π(t).
    """

    task: str
    source: torch.Tensor
    source_mask: torch.Tensor
    decoder_input: torch.Tensor
    decoder_mask: torch.Tensor
    labels: torch.Tensor
    alignment: tuple[torch.Tensor, ...]

    def __repr__(self) -> str:
        return describe("TaskBatch", self.task, counted(self.source.shape[0], "example"),
                        f"sources of up to {counted(self.source.shape[1], 'word')}",
                        f"targets of up to {counted(self.labels.shape[1] - 1, 'word')}")

    def model_inputs(self) -> dict[str, torch.Tensor]:
        """Keyword arguments of an attnprobe encoder–decoder reference model."""
        return {"input_ids": self.source, "attention_mask": self.source_mask,
                "decoder_input_ids": self.decoder_input,
                "decoder_attention_mask": self.decoder_mask}


def make_batch(task: str, n_examples: int, *, min_len: int, max_len: int,
               vocab_size: int = 32, seed: int = 0) -> TaskBatch:
    """``n_examples`` random sources with lengths in ``[min_len, max_len]`` and their targets.

    Example:
        >>> b = make_batch("reverse", 3, min_len=4, max_len=4)
        >>> b.source.shape, b.decoder_input.shape, b.labels.shape   # [batch, src / 1 + tgt]
        (torch.Size([3, 4]), torch.Size([3, 5]), torch.Size([3, 5]))
        >>> b.alignment[0].tolist()                     # π(t) = n - 1 - t
        [3, 2, 1, 0]
        >>> torch.equal(b.labels[0, :4], b.source[0].flip(0)), int(b.labels[0, 4]) == EOS
        (True, True)
    """
    align = ALIGNMENT_TASKS.get(task)
    if n_examples < 1 or min_len < 1 or max_len < min_len:
        raise InputError(f"need n_examples ≥ 1 and 1 ≤ min_len ≤ max_len; got {n_examples}, "
                         f"{min_len}, {max_len}")
    if vocab_size <= FIRST_WORD + 1:
        raise InputError(f"vocab_size must exceed {FIRST_WORD + 1} (3 special ids); "
                         f"got {vocab_size}")
    gen = torch.Generator().manual_seed(seed)
    table = lexicon(vocab_size)
    sources, targets, pis = [], [], []
    for _ in range(n_examples):
        n = int(torch.randint(min_len, max_len + 1, (1,), generator=gen))
        words = torch.randint(FIRST_WORD, vocab_size, (n,), generator=gen)
        pi = align(words, gen)
        target = words[pi]
        if task == "translation":
            target = table[target]
        sources.append(words)
        targets.append(target)
        pis.append(pi)
    width = max(len(s) for s in sources)
    source = torch.full((n_examples, width), PAD)
    dec_in = torch.full((n_examples, width + 1), PAD)
    labels = torch.full((n_examples, width + 1), PAD)
    for i, (src, tgt) in enumerate(zip(sources, targets, strict=True)):
        source[i, : len(src)] = src
        dec_in[i, 0] = BOS
        dec_in[i, 1 : len(tgt) + 1] = tgt
        labels[i, : len(tgt)] = tgt
        labels[i, len(tgt)] = EOS
    return TaskBatch(task=task, source=source, source_mask=(source != PAD).long(),
                     decoder_input=dec_in, decoder_mask=(labels != PAD).long(),
                     labels=labels, alignment=tuple(pis))
