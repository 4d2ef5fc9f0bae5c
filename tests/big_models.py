"""Tiny models loaded the ways big models are: offloaded over CPU + disk, in bf16, with int8
weights (nothing is downloaded; every model is built from a config and saved to a folder).

Families (:data:`FAMILIES`): ``"llama"`` and ``"gpt2"`` (the causal language models of
``tests/integration/causal_lms.py``: hidden 32, 2 layers, 4 heads, word tokenizer ``w4 ..
w99``) and ``"bert"`` (a ``BertForMaskedLM`` of the same size with the small word-piece
tokenizer of ``tests/helpers.py``: words ``the cat sat on a mat dog ran big red``).

Use::

    folder = save_family("llama", tmp_path_factory.mktemp("llama"))   # once per module
    plain = load(folder, "fp32")                     # (model, tokenizer), tracked for hooks
    off = load(folder, "offload", tmp_path / "off")  # layer 0 on the CPU, layer 1 on disk
    half = load(folder, "bf16")
    int8 = load(folder, "int8")                      # optimum-quanto int8 weights
    twin = dequantized_twin(folder, int8[0])         # fp32 model with int8's dequantized weights
    before = snapshot(off[0]); ...; assert_unchanged(off[0], before)

:data:`KINDS` lists the loading kinds; :func:`sample_text` gives a text each tokenizer knows.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from torch import nn

import attnprobe as ap
from attnprobe.core.residence import dequantized, loaded, quantized_modules
from tests.conftest import track
from tests.helpers import bert_tokenizer, bert_vocab
from tests.integration.causal_lms import save_lm, text

FAMILIES = ("llama", "gpt2", "bert")
KINDS = ("fp32", "offload", "bf16", "int8")
# optimum-quanto quantizes ``nn.Linear`` only: GPT-2's ``Conv1D`` projections stay float32, so
# an "int8" GPT-2 has no quantized weight and is not an int8 model.
INT8_FAMILIES = ("llama", "bert")

# Every map puts the embeddings and layer 0 on the CPU and layer 1 (and the LM head where it is
# not tied to the embedding: accelerate keeps tied weights together) on disk.
DEVICE_MAPS: dict[str, dict[str, str]] = {
    "llama": {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu",
              "model.layers.1": "disk", "model.norm": "cpu", "lm_head": "disk"},
    "gpt2": {"transformer.wte": "cpu", "transformer.wpe": "cpu", "transformer.drop": "cpu",
             "transformer.h.0": "cpu", "transformer.h.1": "disk", "transformer.ln_f": "cpu",
             "lm_head": "cpu"},
    "bert": {"bert.embeddings": "cpu", "bert.encoder.layer.0": "cpu",
             "bert.encoder.layer.1": "disk", "cls": "cpu"},
}


def save_family(family: str, folder: Path, seed: int = 0) -> Path:
    """Save the tiny ``family`` model (random weights from ``seed``: another seed is another
    checkpoint of the same shape) and its tokenizer in ``folder``; ``folder``."""
    if family == "bert":
        vocab = bert_vocab()
        torch.manual_seed(seed)
        config = transformers.BertConfig(
            vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, max_position_embeddings=64, initializer_range=0.3)
        transformers.BertForMaskedLM(config).eval().save_pretrained(folder)
        bert_tokenizer(vocab).save_pretrained(folder)
    else:
        save_lm(family, folder, seed)
    return Path(folder)


def family_of(folder: Path) -> str:
    """The family saved in ``folder`` (from its config's model type)."""
    kind = transformers.AutoConfig.from_pretrained(folder).model_type
    return {"llama": "llama", "gpt2": "gpt2", "bert": "bert"}[kind]


def load(folder: Path, kind: str, offload_folder: Path | None = None) -> tuple[nn.Module, Any]:
    """``(model, tokenizer)`` from ``folder`` through ``ap.load_model``, loaded as ``kind``
    (:data:`KINDS`); ``"offload"`` needs ``offload_folder``. The model is tracked (the autouse
    fixture asserts it carries no hook after each test)."""
    options: dict[str, Any] = {
        "fp32": {}, "bf16": {"dtype": "bf16"}, "int8": {"quantization": "int8"},
        "offload": {"device_map": DEVICE_MAPS[family_of(folder)],
                    "offload_folder": offload_folder},
    }[kind]
    if kind == "offload" and offload_folder is None:
        raise ValueError("the offloaded kind needs an offload folder")
    model, tokenizer = ap.load_model(str(folder), **options)
    return track(model), tokenizer


def dequantized_twin(folder: Path, quantized: nn.Module) -> nn.Module:
    """The float32 model of ``folder`` with every weight that ``quantized`` holds quantized
    replaced by its dequantized values (``q · scale``): what the int8 forward multiplies by,
    so the two agree to float32 rounding."""
    twin, _ = load(folder, "fp32")
    modules = dict(quantized.named_modules())
    names = quantized_modules(quantized)
    assert names, "the quantized model has no quantized weight"
    with torch.no_grad():
        for name, module in twin.named_modules():
            if name in names:
                module.weight.copy_(dequantized(modules[name].weight, modules[name]).float())
    return twin


def sample_text(family: str, n_words: int = 6, start: int = 0) -> str:
    """A text of ``n_words`` words the family's tokenizer knows (no unknown token)."""
    if family == "bert":
        words = "the cat sat on a mat dog ran big red".split()
        return " ".join(words[(start + i) % len(words)] for i in range(n_words))
    return text(*(5 + (start + 7 * i) % 90 for i in range(n_words)))


@dataclass(frozen=True)
class Snapshot:
    """What must not change when an analysis runs on a model: every parameter and buffer
    value (read through the offload hooks), the attention implementation, which modules carry
    an accelerate hook (and which hook object)."""

    values: dict[str, torch.Tensor]
    attention: str | None
    hf_hooks: dict[str, int]


def _values(model: nn.Module) -> dict[str, torch.Tensor]:
    found: dict[str, torch.Tensor] = {}
    for name, module in model.named_modules():
        with loaded(module):
            for key, tensor in (*module.named_parameters(recurse=False),
                                *module.named_buffers(recurse=False)):
                found[f"{name}.{key}"] = dequantized(tensor, module).clone()
    return found


def snapshot(model: nn.Module) -> Snapshot:
    """The :class:`Snapshot` of ``model`` now."""
    return Snapshot(_values(model), getattr(model.config, "_attn_implementation", None),
                    {name: id(m._hf_hook) for name, m in model.named_modules()
                     if hasattr(m, "_hf_hook")})


def assert_unchanged(model: nn.Module, before: Snapshot) -> None:
    """Fail unless ``model`` matches ``before`` exactly (values bit for bit)."""
    after = snapshot(model)
    assert after.attention == before.attention
    assert after.hf_hooks == before.hf_hooks
    assert after.values.keys() == before.values.keys()
    changed = [k for k, v in before.values.items() if not torch.equal(v, after.values[k])]
    assert not changed, f"values changed: {changed[:5]}"
