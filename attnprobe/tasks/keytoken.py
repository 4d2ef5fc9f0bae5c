"""Classification tasks whose decisive tokens are known: ground truth for attributions.

Every example is a text of lowercase words from a small fixed vocabulary (:data:`WORDS`), so
:class:`~attnprobe.models.tokenizer.WordTokenizer` (or any tokenizer that splits on spaces)
can run it. The label is a rule over the words, and the words that decide it are known:

- ``contains``: label 1 iff the word ``KEY`` (``"key"``) occurs. Decisive: its occurrences.
  Negative examples contain no ``KEY``, so they have **no** decisive word (an all-False mask):
  nothing in them decides the label except the absence of ``KEY``. Truth metrics (does an
  attribution rank the decisive words first?) are undefined there and should be computed on
  :attr:`KeyTokenData.has_decisive` examples only — for ``contains`` exactly the positives.
- ``count``: label 1 iff ``A`` (``"cat"``) occurs more often than ``B`` (``"dog"``); ties are
  label 0. Decisive: every ``A`` and every ``B``. Every example holds at least one of them
  (label 1: at least one ``A``; label 0: at least one ``B``), so no mask is empty.
- ``first_last``: label 1 iff the first and the last word are equal. Decisive: the first and
  the last position, for both labels. Needs ``min_len >= 2``. A bag-of-words model (no
  position information, e.g. the "average" encoder) cannot solve it.

Word positions vs model tokens: ``decisive[i]`` is a bool mask over the *words* of
``texts[i]`` (``texts[i].split()``). A ``WordTokenizer`` prepends ``[BOS]``, so word ``j`` is
token ``j + 1``; :meth:`KeyTokenData.token_decisive` gives the masks shifted by that prefix.

Sampling (deterministic from ``seed``; one ``torch.Generator``): labels are balanced (an
exact alternation 0, 1, 0, 1 ... shuffled, so positives = ``n // 2``); each length is uniform
in ``[min_len, max_len]``; non-decisive positions are filled uniformly with the task's filler
words (the vocabulary minus its decisive words; ``first_last`` uses the whole vocabulary).
``contains`` positives hold ``1 .. max(1, min(3, n // 4))`` keys; ``count`` draws the two
counts uniformly from ``0 .. min(4, n)`` until they fit the label and the length.
The label of every example is recomputed from its words by the task's rule (not taken from
the sampler), so labels and masks are right by construction.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from attnprobe.core.display import counted, describe
from attnprobe.core.registry import Registry, one_of
from attnprobe.errors import InputError
from attnprobe.models.tokenizer import KEYTOKEN_WORDS

# The decisive words, then the fillers; every word is also in WordTokenizer's default
# vocabulary, so the default tokenizer works too.
WORDS: tuple[str, ...] = KEYTOKEN_WORDS
KEY, A, B = WORDS[:3]
FILLERS = WORDS[3:]
DEFAULT_VOCAB_WORDS = 16
MIN_VOCAB_WORDS = 5  # the three decisive words and at least two fillers


def vocabulary(vocab_words: int = DEFAULT_VOCAB_WORDS) -> tuple[str, ...]:
    """The first ``vocab_words`` of :data:`WORDS` (the decisive words always included)."""
    if not isinstance(vocab_words, int) or not MIN_VOCAB_WORDS <= vocab_words <= len(WORDS):
        raise InputError(f"vocab_words must be an int in [{MIN_VOCAB_WORDS}, {len(WORDS)}]; "
                         f"got {vocab_words!r}")
    return WORDS[:vocab_words]


# ------------------------------------------------------------------ tasks
@dataclass(frozen=True)
class KeyTokenTask:
    """One task: its rule (``label``, ``decisive``) and a sampler that hits a wanted label.

    ``sample(label, length, vocab, gen) -> words``; ``label(words) -> 0 | 1``;
    ``decisive(words) -> list[bool]`` (one per word).
    """

    name: str
    sample: Callable[[int, int, tuple[str, ...], torch.Generator], list[str]]
    label: Callable[[Sequence[str]], int]
    decisive: Callable[[Sequence[str]], list[bool]]
    min_len: int = 1


KEY_TOKEN_TASKS: Registry[KeyTokenTask] = Registry("key-token task")


def _randint(low: int, high: int, gen: torch.Generator) -> int:
    """Uniform integer in ``[low, high]`` (both included)."""
    return int(torch.randint(low, high + 1, (1,), generator=gen))


def _fill(length: int, choices: Sequence[str], gen: torch.Generator) -> list[str]:
    picks = torch.randint(0, len(choices), (length,), generator=gen).tolist()
    return [choices[i] for i in picks]


def _place(words: list[str], word: str, count: int, taken: set[int],
           gen: torch.Generator) -> None:
    """Put ``word`` at ``count`` random positions not in ``taken`` (updated in place)."""
    free = [i for i in range(len(words)) if i not in taken]
    for k in torch.randperm(len(free), generator=gen)[:count].tolist():
        words[free[k]] = word
        taken.add(free[k])


def _sample_contains(label: int, length: int, vocab: tuple[str, ...],
                     gen: torch.Generator) -> list[str]:
    words = _fill(length, [w for w in vocab if w != KEY], gen)
    if label:
        _place(words, KEY, _randint(1, max(1, min(3, length // 4)), gen), set(), gen)
    return words


def _sample_count(label: int, length: int, vocab: tuple[str, ...],
                  gen: torch.Generator) -> list[str]:
    cap = min(4, length)
    while True:  # rejection: uniform over the (c_a, c_b) pairs that fit
        c_a, c_b = _randint(0, cap, gen), _randint(0, cap, gen)
        fits = c_a > c_b if label else (c_a <= c_b and c_b >= 1)
        if fits and c_a + c_b <= length:
            break
    words = _fill(length, [w for w in vocab if w not in (A, B)], gen)
    taken: set[int] = set()
    _place(words, A, c_a, taken, gen)
    _place(words, B, c_b, taken, gen)
    return words


def _sample_first_last(label: int, length: int, vocab: tuple[str, ...],
                       gen: torch.Generator) -> list[str]:
    words = _fill(length, vocab, gen)
    first = _randint(0, len(vocab) - 1, gen)
    last = first if label else (first + _randint(1, len(vocab) - 1, gen)) % len(vocab)
    words[0], words[-1] = vocab[first], vocab[last]
    return words


KEY_TOKEN_TASKS.register("contains")(KeyTokenTask(
    name="contains", sample=_sample_contains,
    label=lambda words: int(KEY in words),
    decisive=lambda words: [w == KEY for w in words]))
KEY_TOKEN_TASKS.register("count")(KeyTokenTask(
    name="count", sample=_sample_count,
    label=lambda words: int(list(words).count(A) > list(words).count(B)),
    decisive=lambda words: [w in (A, B) for w in words]))
KEY_TOKEN_TASKS.register("first_last")(KeyTokenTask(
    name="first_last", sample=_sample_first_last,
    label=lambda words: int(words[0] == words[-1]),
    decisive=lambda words: [i in (0, len(words) - 1) for i in range(len(words))],
    min_len=2))


def get_task(task: str) -> KeyTokenTask:
    """The registered task ``task``; InputError naming the choices if unknown."""
    if not isinstance(task, str) or task not in KEY_TOKEN_TASKS:
        raise InputError(one_of("key-token task", task, KEY_TOKEN_TASKS.names()))
    return KEY_TOKEN_TASKS.get(task)


# ------------------------------------------------------------------ data
@dataclass(frozen=True)
class KeyTokenData:
    """Examples of one key-token task.

    Attributes:
        task: the task name.
        texts: ``n`` texts, words joined by single spaces.
        labels: LongTensor ``[n]`` of 0/1.
        decisive: per example, a bool tensor ``[n_words]`` over the *words* of the text
            (no ``[BOS]``); True = the word decides the label. All False for ``contains``
            negatives (see the module docstring).
        vocab: the words the texts are drawn from.
    """

    task: str
    texts: list[str]
    labels: torch.Tensor
    decisive: list[torch.Tensor]
    vocab: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.texts)

    def __repr__(self) -> str:
        return describe("KeyTokenData", self.task, counted(len(self.texts), "text"),
                        f"{counted(int(self.labels.sum()))} labelled 1",
                        f"{counted(len(self.vocab), 'word')} of vocabulary")

    @property
    def words(self) -> list[list[str]]:
        """Each text split into its words (the positions ``decisive`` refers to)."""
        return [text.split() for text in self.texts]

    @property
    def has_decisive(self) -> torch.Tensor:
        """Bool ``[n]``: examples with at least one decisive word (where truth metrics apply)."""
        return torch.tensor([bool(mask.any()) for mask in self.decisive], dtype=torch.bool)

    def token_decisive(self, prefix: int = 1) -> list[torch.Tensor]:
        """``decisive`` shifted to model-token positions: ``prefix`` leading False entries
        (1 for ``WordTokenizer``'s ``[BOS]``), one entry per token ``[prefix + n_words]``."""
        if prefix < 0:
            raise InputError(f"prefix must be >= 0; got {prefix}")
        return [torch.cat([torch.zeros(prefix, dtype=torch.bool), mask])
                for mask in self.decisive]

    def select(self, indices: Sequence[int] | torch.Tensor) -> KeyTokenData:
        """The examples at ``indices`` (in that order)."""
        index = torch.as_tensor(indices, dtype=torch.long).flatten().tolist()
        return KeyTokenData(task=self.task, texts=[self.texts[i] for i in index],
                            labels=self.labels[index], decisive=[self.decisive[i] for i in index],
                            vocab=self.vocab)


def make_examples(task: str, n: int, *, min_len: int = 4, max_len: int = 12,
                  vocab_words: int = DEFAULT_VOCAB_WORDS, seed: int = 0) -> KeyTokenData:
    """``n`` examples of ``task`` with balanced labels, deterministic from ``seed``.

    Args:
        task: a name in :data:`KEY_TOKEN_TASKS` (``contains``, ``count``, ``first_last``).
        n: number of examples (>= 1).
        min_len, max_len: word count of each text (``[BOS]`` not included), uniform.
        vocab_words: vocabulary size, the first ``vocab_words`` of :data:`WORDS`.
        seed: seed of the one ``torch.Generator`` used (the global RNG is untouched).

    Raises:
        InputError: unknown task, ``n < 1``, bad lengths (``first_last`` needs
            ``min_len >= 2``) or a bad ``vocab_words``.
    """
    spec = get_task(task)
    vocab = vocabulary(vocab_words)
    if not isinstance(n, int) or n < 1:
        raise InputError(f"n must be a positive int; got {n!r}")
    if min_len < spec.min_len or max_len < min_len:
        raise InputError(f"task {task!r} needs {spec.min_len} <= min_len <= max_len; "
                         f"got min_len={min_len}, max_len={max_len}")
    gen = torch.Generator().manual_seed(seed)
    wanted = torch.arange(n) % 2
    wanted = wanted[torch.randperm(n, generator=gen)].tolist()
    texts, labels, decisive = [], [], []
    for label in wanted:
        words = spec.sample(label, _randint(min_len, max_len, gen), vocab, gen)
        got = spec.label(words)
        if got != label:  # a sampler bug, never bad input
            raise RuntimeError(f"{task} sampler produced label {got}, wanted {label}: {words}")
        texts.append(" ".join(words))
        labels.append(got)
        decisive.append(torch.tensor(spec.decisive(words), dtype=torch.bool))
    return KeyTokenData(task=task, texts=texts, labels=torch.tensor(labels, dtype=torch.long),
                        decisive=decisive, vocab=vocab)
