"""Tiny causal LMs with real BPE tokenizers as checkpoints ship them (nothing is downloaded).

The tokenizers are trained offline with the ``tokenizers`` library on the census sentences
(``analyses/data/census_sentences.txt``), with a small vocabulary:

- **GPT-2 style**: byte-level BPE (``Ġ`` marks a space, ``Ċ`` a newline), saved as a
  ``GPT2Tokenizer``: no pad token, no BOS added, ``<|endoftext|>`` as bos / eos / unk.
- **LLaMA style**: SentencePiece-like BPE (``▁`` marks a space) with byte fallback
  (``<0x0A>`` ...), saved as a ``LlamaTokenizer``: ``<s>`` put before every text, no pad token.

Each sits next to a tiny model of its family (``GPT2LMHeadModel`` / ``LlamaForCausalLM``, 2
layers, 4 heads, hidden 32) whose embedding is sized to the vocabulary. :func:`save_bpe_lm`
writes one to a folder that ``attnprobe --model DIR`` and ``ap.load_model(DIR)`` load;
``padding_side="left"`` saves the same tokenizer with left padding in its config.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

CORPUS = Path(__file__).resolve().parents[2] / "analyses" / "data" / "census_sentences.txt"
STYLES = ("gpt2", "llama")
VOCAB_SIZE = 400  # GPT-2 style: 256 bytes + 1 special + merges
LLAMA_VOCAB_SIZE = 480  # LLaMA style: 3 specials + 256 byte tokens + letters + merges
BYTE_TOKENS = tuple(f"<0x{b:02X}>" for b in range(256))
LLAMA_SPECIALS = ("<unk>", "<s>", "</s>")


def _lines() -> list[str]:
    return [line for line in CORPUS.read_text(encoding="utf-8").splitlines() if line.strip()]


def _vocab_merges(tokenizer: Tokenizer) -> tuple[dict[str, int], list[tuple[str, str]]]:
    model = json.loads(tokenizer.to_str())["model"]
    return model["vocab"], [tuple(m) if isinstance(m, list) else tuple(m.split(" "))
                            for m in model["merges"]]


def gpt2_tokenizer() -> transformers.PreTrainedTokenizerBase:
    """Byte-level BPE as GPT-2 ships it: no pad token, nothing added around a text."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    bpe.train_from_iterator(_lines(), trainer)
    vocab, merges = _vocab_merges(bpe)
    return transformers.GPT2Tokenizer(vocab=vocab, merges=merges, model_max_length=64)


def llama_tokenizer() -> transformers.PreTrainedTokenizerBase:
    """``▁`` BPE with byte fallback as LLaMA ships it: ``<s>`` first, no pad token."""
    bpe = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    # trained on words (as SentencePiece splits on whitespace), so no merge spans a space
    bpe.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    trainer = trainers.BpeTrainer(vocab_size=LLAMA_VOCAB_SIZE,
                                  special_tokens=[*LLAMA_SPECIALS, *BYTE_TOKENS],
                                  show_progress=False)
    bpe.train_from_iterator(_lines(), trainer)
    vocab, merges = _vocab_merges(bpe)
    return transformers.LlamaTokenizer(vocab=vocab, merges=merges, model_max_length=64,
                                       add_bos_token=True)


def bpe_tokenizer(style: str) -> transformers.PreTrainedTokenizerBase:
    return {"gpt2": gpt2_tokenizer, "llama": llama_tokenizer}[style]()


def bpe_lm(style: str, tokenizer: transformers.PreTrainedTokenizerBase, seed: int = 0
           ) -> transformers.PreTrainedModel:
    """A seeded tiny causal LM of ``style`` whose embedding fits ``tokenizer`` exactly."""
    torch.manual_seed(seed)
    size = dict(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                eos_token_id=tokenizer.eos_token_id, initializer_range=0.3)
    if style == "gpt2":
        config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                         n_inner=64, **size)
        return transformers.GPT2LMHeadModel(config).eval()
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=64, **size)
    return transformers.LlamaForCausalLM(config).eval()


def save_bpe_lm(style: str, folder: Path, tokenizer: transformers.PreTrainedTokenizerBase,
                *, seed: int = 0, padding_side: str | None = None) -> Path:
    """Save a tiny ``style`` LM with ``tokenizer`` (optionally with another padding side) to
    ``folder``; the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    bpe_lm(style, tokenizer, seed).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    if padding_side is not None:
        config = folder / "tokenizer_config.json"
        spec = json.loads(config.read_text())
        spec["padding_side"] = padding_side
        config.write_text(json.dumps(spec, indent=1))
    return folder
