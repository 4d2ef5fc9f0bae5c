"""Attention while a causal language model generates: ``extract(..., generate=N)``.

Each prompt is continued by ``N`` tokens, greedily or sampled (seeded), and comes back as
**one** :class:`~attnprobe.types.AttentionMap` over the prompt and the generated tokens,
``prompt_length`` marking where generation began. Its weights are those of one forward over
the whole final sequence:

- transformers models run their own ``model.generate`` with the KV cache inside
  :func:`~attnprobe.capture.capture`: the prompt's rows come from the prompt forward and one
  row per generated token from each cached step (:mod:`attnprobe.capture.steps` folds them;
  keys after a row's position are exactly 0). ``generate`` is asked for ``N + 1`` tokens and
  the last one is dropped, so that the ``N``-th generated token is fed once and has its row.
  Sampling follows the model's ``generation_config`` (top-k, temperature ...); beams are
  not used.
- other models (attnprobe's reference decoders have no KV cache) are run step by step
  without capture (greedy: the top logit; sampled: the full softmax), then once, captured,
  over the final sequence: a forward per step would recompute every row anyway.

Prompts of a batch are padded on the left (generation appends on the right); the sampled
tokens are seeded once per batch (``seed``), so they depend on how texts are batched, the
greedy ones do not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from attnprobe.capture import hf
from attnprobe.capture.context import capture
from attnprobe.capture.info import causal_of, model_scope
from attnprobe.core.corpus_options import CorpusOptions
from attnprobe.core.display import counted, describe
from attnprobe.core.distributed import run_sharded
from attnprobe.core.residence import input_device
from attnprobe.core.scope import Scope
from attnprobe.errors import AttentionUnavailableError, InputError
from attnprobe.inputs.prepared import prepare
from attnprobe.inputs.text import (
    Corpus,
    Text,
    Truncation,
    batch_spans,
    encode,
    model_inputs,
    truncation_mode,
)
from attnprobe.types import AttentionMap

__all__ = ["Generated", "check_generation", "generate_maps", "generation_corpus"]


@dataclass(frozen=True)
class Generated:
    """One prompt and its continuation.

    Attributes:
        amap: attention over prompt + generated tokens, ``[layer, head, P + N, P + N]``,
            ``amap.prompt_length == P``.
        ids: the token ids of the whole sequence ``[P + N]`` (padding stripped).
    """

    amap: AttentionMap
    ids: torch.Tensor

    @property
    def prompt_length(self) -> int:
        return int(self.amap.prompt_length or 0)

    def __repr__(self) -> str:
        return describe("Generated", f"{counted(self.prompt_length, 'prompt token')} + "
                        f"{len(self.ids) - self.prompt_length} generated", repr(self.amap))


def check_generation(model: nn.Module, generate: int) -> None:
    """Refuse, before any forward, what cannot generate: ``generate`` not a positive int, an
    encoder (bidirectional attention), an encoder-decoder model, or a model without a
    language-model head."""
    if isinstance(generate, bool) or not isinstance(generate, int) or generate < 1:
        raise InputError(f"generate must be a positive integer (tokens to generate); got "
                         f"{generate!r}")
    name = type(model).__name__
    if getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        raise InputError(f"generate runs decoder-only language models; {name} is an "
                         "encoder-decoder model")
    causal = causal_of(model)
    if causal is False:
        raise InputError(f"generate needs a causal language model; {name} attends both ways "
                         "(an encoder)")
    if causal is None:
        raise InputError(f"generate needs a causal language model; nothing tells whether "
                         f"{name}'s attention is causal")
    if hf.is_hf_model(model) and not model.can_generate():
        raise InputError(f"generate needs a language-model head; {name} has none (load the "
                         "model with its head, e.g. GPT2LMHeadModel / LlamaForCausalLM)")


def generation_corpus(model: nn.Module, tokenizer: Any, texts: Sequence[Text] | Any,
                      generate: int, *, truncation: Truncation = "error",
                      max_length: int | None = None) -> tuple[Corpus, int | None]:
    """The prompts (strings or token ids), checked so that prompt + ``generate`` tokens fit
    the model's positions, and the most prompt tokens that leaves (``None``: no known
    limit). A prompt too long is an error naming it (``"error"``), cut (``"cut"``) or left
    out (``"skip"``)."""
    prepared = prepare(model, tokenizer, texts)
    limit = prepared.facts.limit(max_length)
    if limit is None:
        return prepared.corpus(truncation=truncation), None
    room = limit - generate
    if room < 1:
        raise InputError(f"generate={generate} leaves no room for a prompt: the model takes at "
                         f"most {limit} positions")
    if truncation_mode(truncation) == "error":
        for i, n in enumerate(prepared.lengths()):
            if n > room:
                raise InputError(f"text {i} has {n} tokens; with generate={generate} the "
                                 f"sequence needs {n + generate} positions but the model "
                                 f"takes at most {limit}; generate fewer tokens or shorten "
                                 "the text")
    return prepared.corpus(truncation=truncation, max_length=room), room


def _logits(output: Any, model: nn.Module) -> torch.Tensor:
    """``[batch, seq, vocab]`` logits of a forward, or a one-line error."""
    logits = getattr(output, "logits", output)
    if isinstance(logits, (tuple, list)) and logits:
        logits = logits[0]
    if not isinstance(logits, torch.Tensor) or logits.ndim != 3:
        got = list(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise InputError(f"generate needs a language model: {type(model).__name__} returns "
                         f"{got}, not logits [batch, seq, vocab]")
    return logits


def _pad_id(model: nn.Module, tokenizer: Any) -> int:
    """A pad id for ``generate`` (no sequence ends early, so any id in the vocabulary works)."""
    config = getattr(model, "generation_config", None)
    for value in (getattr(tokenizer, "pad_token_id", None), getattr(config, "pad_token_id", None),
                  getattr(config, "eos_token_id", None)):
        value = value[0] if isinstance(value, (list, tuple)) and value else value
        if isinstance(value, int):
            return value
    return 0


def _run_hf(model: nn.Module, tokenizer: Any, inputs: dict[str, torch.Tensor], n: int,
            sample: bool, **context: Any) -> tuple[torch.Tensor, list[AttentionMap]]:
    """``model.generate`` inside a capture: the sequences ``[batch, P + n]`` and the maps."""
    with torch.no_grad(), capture(model, tokenizer=tokenizer, **context) as cap:
        out = model.generate(**inputs, max_new_tokens=n + 1, min_new_tokens=n + 1,
                             do_sample=sample, num_beams=1, use_cache=True,
                             pad_token_id=_pad_id(model, tokenizer))
    sequences = out if isinstance(out, torch.Tensor) else out.sequences
    return sequences[:, :inputs["input_ids"].shape[1] + n], cap.maps


def _run_steps(model: nn.Module, tokenizer: Any, inputs: dict[str, torch.Tensor], n: int,
               sample: bool, seed: int, **context: Any) -> tuple[torch.Tensor, list[AttentionMap]]:
    """Decode ``n`` steps by full forwards, then capture one forward over the result."""
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    draws = torch.Generator(device=ids.device).manual_seed(seed)
    with torch.no_grad():
        for _ in range(n):
            last = _logits(model(input_ids=ids, attention_mask=mask), model)[:, -1].float()
            if sample:
                token = torch.multinomial(last.softmax(-1), 1, generator=draws)
            else:
                token = last.argmax(-1, keepdim=True)
            ids = torch.cat([ids, token.to(ids.dtype)], dim=1)
            mask = torch.cat([mask, torch.ones_like(token, dtype=mask.dtype)], dim=1)
        with capture(model, tokenizer=tokenizer, **context) as cap:
            model(input_ids=ids, attention_mask=mask)
    return ids, cap.maps


def _generate_batch(model: nn.Module, tokenizer: Any, texts: Sequence[Text],
                    example_ids: Sequence[str], n: int, *, scope: Scope, sample: bool,
                    seed: int, truncation: Truncation, room: int | None) -> list[Generated]:
    batch = encode(model, tokenizer, texts, max_length=room, truncation=truncation,
                   padding_side="left")
    inputs = model_inputs(model, batch)
    context = dict(scope=scope, example_ids=example_ids)
    start = input_device(model)
    devices = [start] if start.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):  # the caller's random state is left as it was
        torch.manual_seed(seed)
        if hf.is_hf_model(model):
            sequences, maps = _run_hf(model, tokenizer, inputs, n, sample, **context)
        else:
            sequences, maps = _run_steps(model, tokenizer, inputs, n, sample, seed, **context)
    maps = [m for m in maps if m.kind == "self"]
    prompts = batch["attention_mask"].sum(-1).tolist()
    if len(maps) != len(texts) or any(m.shape[2] != p + n for m, p in zip(maps, prompts,
                                                                          strict=False)):
        raise AttentionUnavailableError(
            f"capture during {type(model).__name__}.generate gave {len(maps)} maps of "
            f"{[m.shape[2] for m in maps]} tokens for {len(texts)} prompts of {prompts} tokens "
            f"+ {n}: its generate does not run one forward per step with a KV cache")
    width = batch["input_ids"].shape[1]
    out = []
    for b, (amap, prompt) in enumerate(zip(maps, prompts, strict=True)):
        ids = sequences[b, width - prompt:].cpu()
        out.append(Generated(replace(amap, prompt_length=prompt), ids))
    return out


def generate_maps(model: nn.Module, tokenizer: Any, texts: Sequence[Text] | Any,
                  generate: int, *, sample: bool = False, corpus: CorpusOptions | None = None,
                  **keywords: Any) -> list[Generated]:
    """Continue each text by ``generate`` tokens and capture the attention (module
    docstring); arguments as :func:`attnprobe.capture.extract` (``corpus`` and the corpus
    keywords: scope, batch size, max length, truncation, seed, progress, distributed), plus
    ``sample`` (draw each token instead of taking the top one; seeded by ``seed``).

    Returns:
        One :class:`Generated` per text (texts left out by ``truncation="skip"`` are
        missing), ``example_id`` the text's index.

    Raises:
        InputError: ``generate`` < 1, an encoder or encoder-decoder model, a model without a
            language-model head, or a prompt that leaves no room for ``generate`` tokens.

    Example:
        >>> g = generate_maps(lm, lm_tok, [prompt], 4)[0]
        >>> g.prompt_length, len(g.ids)                 # [BOS] + 16 tokens, 4 generated
        (17, 21)
        >>> g.amap.pattern.shape                        # [layer, head, P + N, P + N]
        torch.Size([2, 4, 21, 21])
        >>> bool((g.amap.pattern.triu(1) == 0).all())   # causal: no row reads a later key
        True
    """
    walk = CorpusOptions.merged(corpus, keywords, owner="generate_maps()")
    check_generation(model, generate)
    found, room = generation_corpus(model, tokenizer, texts, generate,
                                    truncation=walk.truncation, max_length=walk.max_length)
    scope = model_scope(model, walk.scope)
    mode = "cut" if walk.truncation_mode == "cut" else "error"

    def run(span: slice) -> list[Generated]:
        return _generate_batch(model, tokenizer, found.texts[span], found.ids[span], generate,
                               scope=scope, sample=bool(sample), seed=walk.seed,
                               truncation=mode, room=room)

    parts = run_sharded(run, batch_spans(len(found.texts), walk.batch()),
                        distributed=walk.distributed, progress=walk.progress, desc="generate")
    return [item for part in parts for item in part]
