"""Training and scoring sequence classifiers on key-token tasks (``attnprobe.tasks.keytoken``).

The model is any ``forward(input_ids, attention_mask) -> logits [batch, classes]`` module
(e.g. :mod:`attnprobe.models.classifier`); the tokenizer any callable returning
``input_ids``/``attention_mask`` (``WordTokenizer`` or a HuggingFace tokenizer).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from attnprobe.core.display import counted, describe
from attnprobe.errors import InputError
from attnprobe.tasks.keytoken import KeyTokenData, make_examples


def encode_texts(tokenizer: Any, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``(input_ids, attention_mask)`` ``[n, seq]`` of ``texts``."""
    batch = tokenizer(list(texts), padding=True, return_tensors="pt")
    return batch["input_ids"], batch["attention_mask"]


def _rows(ids: torch.Tensor, mask: torch.Tensor, index: torch.Tensor
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``index`` of right-padded ids/mask, cut to their longest real length."""
    mask = mask[index]
    width = int(mask.sum(1).max())
    return ids[index, :width], mask[:, :width]


def accuracy(model: nn.Module, tokenizer: Any, data: KeyTokenData, *,
             batch_size: int = 256) -> float:
    """Fraction of ``data`` whose argmax logit equals the label (no gradients, eval mode)."""
    ids, mask = encode_texts(tokenizer, data.texts)
    was_training = model.training
    model.eval()
    hits = 0
    try:
        with torch.no_grad():
            for start in range(0, len(data), batch_size):
                index = torch.arange(start, min(start + batch_size, len(data)))
                logits = model(*_rows(ids, mask, index))
                hits += int((logits.argmax(-1) == data.labels[index]).sum())
    finally:
        model.train(was_training)
    return hits / len(data)


def train_classifier(model: nn.Module, tokenizer: Any, data: KeyTokenData, *,
                     steps: int, batch_size: int = 32, lr: float = 1e-2, seed: int = 0,
                     held_out: KeyTokenData | None = None, clip: float = 1.0) -> dict[str, Any]:
    """Adam on cross-entropy over minibatches of ``data``, then accuracy.

    Deterministic: minibatches are drawn (without replacement within an epoch) by a
    ``torch.Generator`` seeded with ``seed``; the global RNG is forked, so the caller's is
    untouched. Gradients are clipped to norm ``clip``. The model is left in eval mode.

    Returns:
        ``{"train_accuracy", "held_out_accuracy" (None without ``held_out``), "final_loss"
        (mean of the last 10 steps), "steps", "seconds"}``.
    """
    if steps < 1 or batch_size < 1 or lr <= 0:
        raise InputError(f"need steps >= 1, batch_size >= 1 and lr > 0; got {steps}, "
                         f"{batch_size}, {lr}")
    ids, mask = encode_texts(tokenizer, data.texts)
    labels = data.labels
    gen = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    losses: list[float] = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)  # any dropout inside the model
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        model.train()
        order = torch.randperm(len(data), generator=gen)
        cursor = 0
        for _ in range(steps):
            if cursor + batch_size > len(data):
                order, cursor = torch.randperm(len(data), generator=gen), 0
            index = order[cursor: cursor + batch_size]
            cursor += batch_size
            logits = model(*_rows(ids, mask, index))
            loss = F.cross_entropy(logits, labels[index])
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            losses.append(loss.item())
    model.eval()
    seconds = time.perf_counter() - start
    tail = losses[-10:]
    return {"train_accuracy": accuracy(model, tokenizer, data),
            "held_out_accuracy": None if held_out is None else accuracy(model, tokenizer,
                                                                        held_out),
            "final_loss": sum(tail) / len(tail), "steps": steps, "seconds": seconds}


class TrainedClassifier(NamedTuple):
    """One reference classifier trained on one key-token task by
    :func:`train_reference_classifiers`."""

    task: str
    name: str
    model: nn.Module
    tokenizer: Any
    train: KeyTokenData
    held_out: KeyTokenData
    result: dict[str, Any]

    def __repr__(self) -> str:
        accuracy = self.result.get("held_out_accuracy")
        return describe("TrainedClassifier", f"{self.name} on {self.task}",
                        f"{counted(len(self.train), 'training text')}, "
                        f"{counted(len(self.held_out), 'held-out text')}",
                        None if accuracy is None else f"held-out accuracy {accuracy:.3g}")


@dataclass(frozen=True)
class TrainingRecipe:
    """The analyses' shared recipe for :func:`train_reference_classifiers`: examples drawn
    per task (``n_train`` training, ``n_held_out`` held-out; texts of ``min_len`` to
    ``max_len`` words from ``vocab_words`` words), and the training (``steps`` of
    ``batch_size`` at learning rate ``lr``; ``seed`` seeds the examples, the models and
    the training)."""

    n_train: int
    n_held_out: int
    steps: int
    batch_size: int
    lr: float
    seed: int
    min_len: int
    max_len: int
    vocab_words: int

    @classmethod
    def of(cls, recipe: TrainingRecipe | None, keywords: dict[str, Any]) -> TrainingRecipe:
        """``recipe`` with ``keywords`` (field names) replaced, or a recipe built from them
        (every field named); a missing or unknown name is an InputError naming the
        fields."""
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(keywords) - set(names))
        missing = [] if recipe is not None else [n for n in names if n not in keywords]
        if unknown or missing:
            what = f"unknown {unknown[0]!r}" if unknown else f"missing {', '.join(missing)}"
            raise InputError(f"train_reference_classifiers: {what}; the recipe's fields are "
                             f"{', '.join(names)}")
        return replace(recipe, **keywords) if recipe is not None else cls(**keywords)


def train_reference_classifiers(tasks: Sequence[str], models: Sequence[str],
                                recipe: TrainingRecipe | None = None, **keywords: Any
                                ) -> Iterator[TrainedClassifier]:
    """Train every reference model in ``models`` on every key-token task in ``tasks``.

    The analyses' shared recipe (:class:`TrainingRecipe`, or its fields by name:
    ``n_train=``, ``steps=`` ...): task number ``t`` draws ``n_train`` training and
    ``n_held_out`` held-out examples (:func:`~attnprobe.tasks.keytoken.make_examples`, seeds
    ``seed * 1000 + 10 * t + 1`` and ``+ 2``); each model is built by
    :func:`~attnprobe.models.build_reference` with ``seed`` and trained by
    :func:`train_classifier` (``result`` is its dictionary, held-out accuracy included).

    A generator, task by task and model by model: each model is built and trained only when
    the caller asks for the next one (the recipe is checked on the first).
    """
    r = TrainingRecipe.of(recipe, keywords)
    from attnprobe.models import build_reference

    seed = r.seed
    sizes = {"min_len": r.min_len, "max_len": r.max_len, "vocab_words": r.vocab_words}
    for t, task in enumerate(tasks):
        train = make_examples(task, r.n_train, seed=seed * 1000 + 10 * t + 1, **sizes)
        held = make_examples(task, r.n_held_out, seed=seed * 1000 + 10 * t + 2, **sizes)
        for name in models:
            model, tok = build_reference(name, seed=seed)
            result = train_classifier(model, tok, train, steps=r.steps,
                                      batch_size=r.batch_size, lr=r.lr, seed=seed,
                                      held_out=held)
            yield TrainedClassifier(task, name, model, tok, train, held, result)
