"""Tiny causal language models with their own word-level tokenizers (nothing is downloaded).

The models are the GPT-2, LLaMA and Qwen2 configs of ``tests/integration/hf_models.py``
(hidden 32, 2 layers, 4 heads, vocab 100, 64 positions) with a language-model head. Their
tokenizer knows ``<pad>`` (0), ``<s>`` (1), ``</s>`` (2), ``<unk>`` (3) and the words
``w4 .. w99``, split on spaces; as their real tokenizers do, the GPT-2 one adds no special
token, the LLaMA and Qwen2 ones put ``<s>`` first. :func:`save_lm` writes a model and its
tokenizer to a folder that ``attnprobe --model DIR`` loads.
"""

from __future__ import annotations

from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from tests.conftest import track
from tests.integration.hf_models import FAMILIES, VOCAB

LM_CLASSES = {"gpt2": transformers.GPT2LMHeadModel, "llama": transformers.LlamaForCausalLM,
              "qwen2": transformers.Qwen2ForCausalLM, "mistral": transformers.MistralForCausalLM}
SPECIAL = ("<pad>", "<s>", "</s>", "<unk>")
WORDS = tuple(f"w{i}" for i in range(len(SPECIAL), VOCAB))


def word_tokenizer(bos: bool) -> transformers.PreTrainedTokenizerFast:
    """Whitespace-split words ``w4 .. w99``; ``<s>`` prepended when ``bos``."""
    vocab = {token: i for i, token in enumerate((*SPECIAL, *WORDS))}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if bos:
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", 1)])
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
        unk_token="<unk>")


def causal_lm(name: str, seed: int = 0, implementation: str = "sdpa"
              ) -> tuple[transformers.PreTrainedModel, transformers.PreTrainedTokenizerFast]:
    """A seeded tiny ``name`` language model (eval, tracked for left-over hooks) and its
    tokenizer."""
    torch.manual_seed(seed)
    config = FAMILIES[name].config()
    config._attn_implementation = implementation
    model = LM_CLASSES[name](config).eval()
    return track(model), word_tokenizer(bos=name != "gpt2")


def save_lm(name: str, folder: Path, seed: int = 0) -> str:
    """Save the tiny ``name`` language model and its tokenizer to ``folder``; its path."""
    model, tokenizer = causal_lm(name, seed)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def text(*indices: int) -> str:
    """A text of the words with these ids, e.g. ``text(5, 6)`` -> ``"w5 w6"``."""
    return " ".join(f"w{i}" for i in indices)
