"""``ref:induction``: a 2-layer attention-only decoder trained to copy in context.

Olsson et al. (2022) and Elhage et al. (2021) show that a two-layer attention-only transformer
learns to continue a repeated segment with a two-head circuit: a *previous-token head* in layer
0 writes "the token before me was A" into each position, and an *induction head* in layer 1
attends from the current token ``A`` to the token right after the earlier ``A`` and copies it.
This model is trained until it does that, so every analysis of attnprobe can be checked against
a circuit that is known.

The model is :class:`~attnprobe.models.decoder_only.LlamaModel` without MLPs: RoPE (so
"previous token" is one relative offset), RMSNorm, 4 heads of 16 dimensions per layer, over a
vocabulary of :data:`N_SYMBOLS` words ``t00 .. t63`` (the tokenizer prepends ``[BOS]``).

**Training data** (:func:`repeated_segments`): ``[BOS]`` and 47 random symbols, one segment of
8–20 of them repeated later at a random distance, so position alone cannot predict the copy.
The loss is next-token cross-entropy at every position; only the second copy is predictable.

**Deterministic and cached.** Training runs on one CPU thread from fixed seeds (about a minute)
and its weights are cached outside the repository as safetensors
(``$ATTNPROBE_CACHE`` or ``~/.cache/attnprobe``), named by a hash of the recipe; a missing or
unreadable file is retrained. Nothing is downloaded and no weight is committed.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnprobe.core.files import atomic_write
from attnprobe.core.optional import require
from attnprobe.errors import InputError
from attnprobe.models.decoder_only import LlamaConfig, LlamaModel
from attnprobe.models.tokenizer import WordTokenizer
from attnprobe.models.zoo import REFERENCE_MODELS, finish_reference

__all__ = ["N_SYMBOLS", "Recipe", "Segments", "cache_dir", "induction_tokenizer",
           "repeated_segments", "train_induction"]

N_SYMBOLS = 64
SYMBOLS = tuple(f"t{i:02d}" for i in range(N_SYMBOLS))


@dataclass(frozen=True)
class Recipe:
    """Everything that decides the trained weights (its hash names the cache file)."""

    seq_len: int = 48  # [BOS] included
    min_segment: int = 8
    max_segment: int = 20
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    steps: int = 1500
    batch_size: int = 64
    lr: float = 3e-3
    weight_decay: float = 0.01
    seed: int = 0
    max_len: int = 2048  # positions the model accepts (RoPE has no table; a check only)

    def key(self) -> str:
        text = json.dumps(asdict(self), sort_keys=True) + torch.__version__.split("+")[0]
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def induction_tokenizer(max_len: int = Recipe.max_len) -> WordTokenizer:
    """The tokenizer of ``ref:induction``: ``[BOS]`` then words ``t00 .. t63``."""
    return WordTokenizer(SYMBOLS, model_max_length=max_len)


@dataclass(frozen=True)
class Segments:
    """A batch of training sequences and where their copies are.

    ``input_ids`` ``[batch, seq]``; ``source`` ``[batch, seq]``: for a position ``i`` inside
    the second copy (except its last token), the position of the same token in the first copy
    (so the token to predict after ``i`` is at ``source + 1``), else -1.
    """

    input_ids: torch.Tensor
    source: torch.Tensor

    @property
    def second_half(self) -> torch.Tensor:
        """``[batch, seq]`` bool: positions whose next token is predictable by copying."""
        return self.source >= 0

    @property
    def first_half(self) -> torch.Tensor:
        """``[batch, seq]`` bool: the matching positions of the first copy (not predictable)."""
        mask = torch.zeros_like(self.second_half)
        rows, _ = self.second_half.nonzero(as_tuple=True)
        mask[rows, self.source[self.second_half]] = True
        return mask


def repeated_segments(n: int, generator: torch.Generator, tokenizer: WordTokenizer,
                      recipe: Recipe = Recipe(), *, seq_len: int | None = None) -> Segments:
    """``n`` sequences: ``[BOS]``, random symbols, one segment repeated later (module docs)."""
    seq_len = recipe.seq_len if seq_len is None else seq_len
    if seq_len < 2 * recipe.min_segment + 1:
        raise InputError(f"seq_len {seq_len} cannot hold two segments of "
                         f"{recipe.min_segment}")
    first_id = tokenizer.convert_tokens_to_ids([SYMBOLS[0]])[0]
    ids = first_id + torch.randint(0, N_SYMBOLS, (n, seq_len), generator=generator)
    ids[:, 0] = tokenizer.bos_token_id
    source = torch.full((n, seq_len), -1, dtype=torch.long)
    for b in range(n):
        longest = min(recipe.max_segment, (seq_len - 1) // 2)
        m = int(torch.randint(recipe.min_segment, longest + 1, (1,), generator=generator))
        s1 = int(torch.randint(1, seq_len - 2 * m + 1, (1,), generator=generator))
        s2 = int(torch.randint(s1 + m, seq_len - m + 1, (1,), generator=generator))
        ids[b, s2:s2 + m] = ids[b, s1:s1 + m]
        source[b, s2:s2 + m - 1] = torch.arange(s1, s1 + m - 1)
    return Segments(ids, source)


def _model(recipe: Recipe, tokenizer: WordTokenizer) -> LlamaModel:
    return LlamaModel(LlamaConfig(len(tokenizer), d_model=recipe.d_model,
                                  n_layers=recipe.n_layers, n_heads=recipe.n_heads,
                                  n_kv_heads=recipe.n_heads, d_ff=1, max_len=recipe.max_len,
                                  attention_only=True))


def train_induction(recipe: Recipe = Recipe()) -> tuple[LlamaModel, dict[str, Any]]:
    """Train ``ref:induction`` from scratch (one thread, fixed seeds): the model and a log
    (``{"steps", "seconds", "loss"}``, the training loss every 100 steps)."""
    import time

    tokenizer = induction_tokenizer(recipe.max_len)
    threads = torch.get_num_threads()
    start = time.perf_counter()
    losses = []
    try:
        torch.set_num_threads(1)  # the same arithmetic on every machine of this kind
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(recipe.seed)
            model = _model(recipe, tokenizer)
            data = torch.Generator().manual_seed(recipe.seed + 1)
            optimiser = torch.optim.AdamW(model.parameters(), lr=recipe.lr,
                                          weight_decay=recipe.weight_decay)
            model.train()
            for step in range(recipe.steps):
                batch = repeated_segments(recipe.batch_size, data, tokenizer, recipe)
                logits = model(batch.input_ids)  # [batch, seq, vocab]
                loss = nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1),
                                                   batch.input_ids[:, 1:].flatten())
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
                if step % 100 == 0 or step == recipe.steps - 1:
                    losses.append((step, float(loss.detach())))
    finally:
        torch.set_num_threads(threads)
    log = {"steps": recipe.steps, "seconds": time.perf_counter() - start, "loss": losses,
           "recipe": asdict(recipe)}
    return model.eval(), log


def cache_dir() -> Path:
    """Where trained reference weights live: ``$ATTNPROBE_CACHE`` or ``~/.cache/attnprobe``."""
    root = os.environ.get("ATTNPROBE_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "attnprobe"


def _cached(recipe: Recipe) -> tuple[LlamaModel, dict[str, Any]]:
    """The trained model from the cache, trained (and cached) when missing or unreadable."""
    safetensors = require("safetensors.torch")
    folder = cache_dir()
    weights = folder / f"induction-{recipe.key()}.safetensors"
    log_path = weights.with_suffix(".json")
    tokenizer = induction_tokenizer(recipe.max_len)
    if weights.is_file() and log_path.is_file():
        try:
            model = _model(recipe, tokenizer)
            model.load_state_dict(safetensors.load_file(str(weights)))
            return model.eval(), json.loads(log_path.read_text())
        except (OSError, ValueError, RuntimeError, KeyError):
            pass  # a damaged cache file: train again and replace it
    model, log = train_induction(recipe)
    atomic_write(weights, lambda tmp: safetensors.save_file(model.state_dict(), str(tmp)))
    atomic_write(log_path, lambda tmp: tmp.write_text(json.dumps(log, indent=1)))
    return model, log


@REFERENCE_MODELS.register("induction")
def induction(seed: int = 0) -> tuple[nn.Module, WordTokenizer]:
    """A trained 2-layer attention-only decoder that copies in context (a known induction
    circuit); trained once (about a minute) and cached. ``model.trained_length`` is the length
    of its training sequences ([BOS] included): it accepts up to ``Recipe.max_len`` positions,
    but its previous-token heads lose their offset beyond what it was trained on."""
    recipe = Recipe(seed=seed)
    model, log = _cached(recipe)
    model.training_log = log
    model.trained_length = recipe.seq_len
    return finish_reference(model, "induction"), induction_tokenizer()
