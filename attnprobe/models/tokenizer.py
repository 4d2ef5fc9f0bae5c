"""A deterministic lowercase word/punctuation tokenizer for the reference models.

Specials: ``[PAD]`` = 0, ``[UNK]`` = 1, ``[BOS]`` = 2 (prepended to every text). Words outside
the vocabulary map to ``[UNK]``. The call returns the same keys as a HuggingFace tokenizer
(``input_ids``, ``attention_mask``), so ``model(**batch)`` works.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Literal

import torch

from attnprobe.errors import InputError

PAD, UNK, BOS = "[PAD]", "[UNK]", "[BOS]"
SPECIALS = (PAD, UNK, BOS)
PUNCTUATION = tuple(".,!?;:'\"()-")

# A word is a run of letters, digits or underscores; any other non-space character is a
# one-character punctuation token ("don't" -> "don", "'", "t").
_TOKEN_RE = re.compile(r"\w+|[^\w\s]")

# The vocabulary of the key-token classification tasks (attnprobe.tasks.keytoken): the
# decisive words "key", "cat", "dog", then the fillers. Every word is also in DEFAULT_WORDS.
KEYTOKEN_WORDS: tuple[str, ...] = (
    "key", "cat", "dog", "the", "a", "red", "blue", "green", "big", "small", "tree", "house",
    "car", "book", "sun", "moon", "water", "fire", "bird", "fish", "road", "ball", "box", "rain",
    "snow", "milk", "tea", "cake", "egg", "door", "hat", "bed", "pen", "star", "sky")

DEFAULT_WORDS = """
the a an this that these those some any every each no all both
i you he she it we they me him her us them my your his its our their mine yours
who whom whose what which where when why how there here
is am are was were be been being have has had do does did done will would shall should
can could may might must not
and or but if then than so because while as of in on at by for with about to from into onto
over under up down out off near after before between through during without within
cat cats dog dogs bird birds fish horse cow mouse man men woman women child children boy girl
people person friend teacher student doctor king queen farmer baby mother father family
mat hat bed table chair door window house home room school city town road street car bus train
book books paper letter pen word words sentence story name picture song music game ball box
tree trees flower garden park river lake sea water sun moon star sky rain snow wind fire
food bread apple milk tea coffee cake egg meat rice dinner lunch breakfast
day days night morning evening week year time today tomorrow yesterday hour minute
one two three four five six seven eight nine ten first second last next many much more most
few less little big small large long short old new young good bad great high low hot cold
happy sad red blue green black white brown quick slow lazy fast tall full empty other same
sat sit sits sitting run runs ran running walk walks walked eat eats ate eating see sees saw
seen look looks looked go goes went gone come comes came get gets got make makes made take
takes took give gives gave know knows knew think thinks thought say says said tell told
find found like likes liked love loves loved want wants wanted need needs use used work
works worked play plays played read reads write writes wrote jump jumps jumped chase chased
open opened close closed live lives lived sleep sleeps slept sing sang bring brought
buy bought call called help helped keep kept leave left put set stand stood turn turned
very too also just only still again never always often now soon yes well back away
fox key value query attention head model token
"""


class WordTokenizer:
    """Lowercase word/punctuation tokenizer with a fixed vocabulary.

    Args:
        words: vocabulary words (default: a few hundred common English words). Duplicates are
            dropped; ids follow first appearance after the specials and punctuation.
        model_max_length: longest allowed sequence, ``[BOS]`` included.

    Example:
        >>> tok = WordTokenizer()
        >>> tok.tokenize("The cat sat.")
        ['the', 'cat', 'sat', '.']
        >>> batch = tok(["The cat sat.", "A dog"], padding_side="left")
        >>> batch["input_ids"].shape
        torch.Size([2, 5])
    """

    pad_token, unk_token, bos_token = PAD, UNK, BOS
    pad_token_id, unk_token_id, bos_token_id = 0, 1, 2
    all_special_ids = (0, 1, 2)

    def __init__(self, words: Iterable[str] | None = None, *, model_max_length: int = 64) -> None:
        words = DEFAULT_WORDS.split() if words is None else list(words)
        vocab: dict[str, int] = {}
        for token in (*SPECIALS, *PUNCTUATION, *(w.lower() for w in words)):
            vocab.setdefault(token, len(vocab))
        self.vocab = vocab
        self.ids_to_tokens = list(vocab)
        self.model_max_length = model_max_length
        self.padding_side: Literal["right", "left"] = "right"

    def __len__(self) -> int:
        return len(self.vocab)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def get_vocab(self) -> dict[str, int]:
        return dict(self.vocab)

    def tokenize(self, text: str) -> list[str]:
        """Lowercased word and punctuation tokens of ``text`` (no ``[BOS]``)."""
        if not isinstance(text, str):
            raise InputError(f"text must be a str; got {type(text).__name__}")
        if not text.strip():
            raise InputError("empty text: give at least one non-whitespace character")
        return _TOKEN_RE.findall(text.lower())

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> int | list[int]:
        """The id of a token (a str gives one int, as in HuggingFace tokenizers), or of each
        token of a list; unknown tokens are ``[UNK]``."""
        if isinstance(tokens, str):
            return self.vocab.get(tokens, self.unk_token_id)
        return [self.vocab.get(t, self.unk_token_id) for t in tokens]

    def convert_ids_to_tokens(self, ids: int | Sequence[int] | torch.Tensor) -> str | list[str]:
        """Tokens for ``ids`` (a list, 1-d tensor, or a single int -> a single str)."""
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        if isinstance(ids, int):
            return self._token(ids)
        return [self._token(int(i)) for i in ids]

    def _token(self, i: int) -> str:
        if not 0 <= i < len(self.ids_to_tokens):
            raise InputError(f"token id {i} is outside the vocabulary [0, {len(self)})")
        return self.ids_to_tokens[i]

    def encode(self, text: str) -> list[int]:
        """Ids of ``[BOS]`` + the tokens of ``text``."""
        return [self.bos_token_id, *self.convert_tokens_to_ids(self.tokenize(text))]

    def decode(self, ids: int | Sequence[int] | torch.Tensor, *,
               skip_special_tokens: bool = False) -> str:
        """The tokens of ``ids`` joined by spaces (the text is lower-cased and split, so this
        is its tokens, not the original spelling); ``[PAD]`` is always left out, every special
        token with ``skip_special_tokens``."""
        if isinstance(ids, torch.Tensor):
            ids = ids.reshape(-1).tolist()
        ids = [ids] if isinstance(ids, int) else list(ids)
        drop = set(self.all_special_ids) if skip_special_tokens else {self.pad_token_id}
        return " ".join(self._token(int(i)) for i in ids if int(i) not in drop)

    def batch_decode(self, rows: Sequence[Sequence[int]] | torch.Tensor, *,
                     skip_special_tokens: bool = False) -> list[str]:
        """:meth:`decode` of each row."""
        return [self.decode(row, skip_special_tokens=skip_special_tokens) for row in rows]

    def __call__(
        self,
        texts: str | Sequence[str],
        *,
        padding_side: Literal["right", "left"] | None = None,
        max_length: int | None = None,
        truncation: bool = False,
        padding: bool | str = True,
        return_tensors: str | None = "pt",
    ) -> dict[str, torch.Tensor]:
        """Tokenize and pad a batch.

        Args:
            texts: one text or a list of texts (none empty).
            padding_side: where ``[PAD]`` goes; default ``self.padding_side`` ("right").
            max_length: longest allowed sequence (``[BOS]`` included); default
                ``model_max_length``. Longer texts raise unless ``truncation=True``.
            truncation: cut long texts to ``max_length`` instead of raising.
            padding: accepted for HuggingFace compatibility; only padding to the longest
                text (``True`` / ``"longest"``) is supported.
            return_tensors: accepted for compatibility; only ``"pt"`` (or None) is supported.

        Returns:
            ``{"input_ids": LongTensor[batch, seq], "attention_mask": LongTensor[batch, seq]}``,
            attention_mask 1 = real token, 0 = padding.
        """
        if isinstance(texts, str):
            texts = [texts]
        if len(texts) == 0:
            raise InputError("no texts given: pass at least one non-empty string")
        side = self.padding_side if padding_side is None else padding_side
        if side not in ("right", "left"):
            raise InputError(f"padding_side must be 'right' or 'left'; got {side!r}")
        if padding not in (True, "longest") or return_tensors not in ("pt", None):
            raise InputError(
                "WordTokenizer only pads to the longest text and returns torch tensors; "
                f"got padding={padding!r}, return_tensors={return_tensors!r}"
            )
        limit = self.model_max_length if max_length is None else max_length
        rows = []
        for index, text in enumerate(texts):
            try:
                ids = self.encode(text)
            except InputError as err:
                raise InputError(f"text {index}: {err}") from None
            if len(ids) > limit:
                if not truncation:
                    raise InputError(
                        f"text {index} has {len(ids)} tokens but max_length is {limit}; "
                        "shorten it or pass truncation=True"
                    )
                ids = ids[:limit]
            rows.append(ids)

        seq = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), seq), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), seq), dtype=torch.long)
        for b, ids in enumerate(rows):
            span = slice(0, len(ids)) if side == "right" else slice(seq - len(ids), seq)
            input_ids[b, span] = torch.tensor(ids, dtype=torch.long)
            attention_mask[b, span] = 1
        return {"input_ids": input_ids, "attention_mask": attention_mask}
