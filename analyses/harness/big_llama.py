"""Random LLaMA-layout models for the big-model scripts (``bench_big.py``, ``gpu_check.py``),
seeded, with the packaged MiniLM tokenizer (``vocab_size = len(tokenizer)``), and the memory
readings their measurements share.

- :func:`write_random_llama` writes a checkpoint folder one safetensors shard at a time (the
  embeddings, each decoder layer, the final norm and the unembedding), so a model far larger
  than memory is never held whole: at most one layer's tensors exist at once;
- :func:`random_llama` builds one in memory (small models, GPU checks);
- :class:`PeakSampler` samples ``/proc/self/status`` in a thread for the peak of ``RssAnon``,
  which the kernel does not keep (``VmHWM`` is the peak of all resident pages, file-backed
  ``mmap``s of checkpoint shards included).
"""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

LAYER_PREFIX = "model.layers."
MARKER = "complete.json"  # written last: a folder without it is an interrupted build


@dataclass(frozen=True)
class LlamaShape:
    """A LLaMA-layout decoder: sizes of the hidden state, layers, heads and MLP."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    init_std: float = 0.02  # HF's initializer_range

    def config(self, vocab: int, dtype: torch.dtype = torch.float32) -> Any:
        """The transformers ``LlamaConfig`` (untied unembedding, causal LM head)."""
        from transformers import LlamaConfig

        return LlamaConfig(
            hidden_size=self.hidden, num_hidden_layers=self.layers,
            num_attention_heads=self.heads, num_key_value_heads=self.kv_heads,
            intermediate_size=self.intermediate, vocab_size=vocab,
            max_position_embeddings=2048, initializer_range=self.init_std,
            tie_word_embeddings=False, architectures=["LlamaForCausalLM"], dtype=dtype)

    def n_params(self, vocab: int) -> int:
        """Parameters of the model (counted on the meta device: nothing allocated)."""
        return sum(p.numel() for _, p in _skeleton(self.config(vocab)).named_parameters())


def minilm_tokenizer() -> Any:
    """The packaged MiniLM tokenizer (offline)."""
    from transformers import AutoTokenizer

    from attnprobe.loading import minilm_path

    return AutoTokenizer.from_pretrained(str(minilm_path()))


def _skeleton(config: Any) -> torch.nn.Module:
    import accelerate
    from transformers import LlamaForCausalLM

    with accelerate.init_empty_weights():
        return LlamaForCausalLM(config)


def _shard_of(name: str, n_layers: int) -> int:
    """Shard 0: embeddings; 1..L: decoder layer L-1; L+1: final norm and unembedding."""
    if name.startswith(LAYER_PREFIX):
        return int(name[len(LAYER_PREFIX):].split(".", 1)[0]) + 1
    return 0 if "embed_tokens" in name else n_layers + 1


def _random_tensor(name: str, shape: torch.Size, std: float, gen: torch.Generator,
                   dtype: torch.dtype) -> torch.Tensor:
    if name.endswith("norm.weight"):  # RMSNorm gains start at one, as HF initialises them
        return torch.ones(shape, dtype=dtype)
    return (torch.randn(shape, generator=gen) * std).to(dtype)


def write_random_llama(folder: Path, shape: LlamaShape, *, dtype: torch.dtype = torch.bfloat16,
                       seed: int = 0) -> dict[str, Any]:
    """A seeded random LLaMA checkpoint in ``folder`` (config, sharded safetensors with their
    index, MiniLM tokenizer), built one shard at a time; reused when ``folder`` already holds
    the same build (its ``complete.json``). Returns that record (``n_params``, ``bytes``)."""
    from safetensors.torch import save_file

    tokenizer = minilm_tokenizer()
    vocab = len(tokenizer)
    want = {"shape": asdict(shape), "dtype": str(dtype), "seed": seed, "vocab": vocab}
    marker = folder / MARKER
    if marker.is_file():
        found = json.loads(marker.read_text())
        if {k: found.get(k) for k in want} == want:
            return found
    folder.mkdir(parents=True, exist_ok=True)
    config = shape.config(vocab, dtype)
    shards: dict[int, list[tuple[str, torch.Size]]] = {}
    for name, param in _skeleton(config).named_parameters():
        shards.setdefault(_shard_of(name, shape.layers), []).append((name, param.shape))
    total = len(shards)
    weight_map, size, count = {}, 0, 0
    for index in sorted(shards):
        gen = torch.Generator().manual_seed(seed * 1_000_003 + index)
        tensors = {name: _random_tensor(name, dims, shape.init_std, gen, dtype)
                   for name, dims in shards[index]}
        file = f"model-{index + 1:05d}-of-{total:05d}.safetensors"
        save_file(tensors, str(folder / file), metadata={"format": "pt"})
        for name, tensor in tensors.items():
            weight_map[name] = file
            size += tensor.numel() * tensor.element_size()
            count += tensor.numel()
        del tensors
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": size}, "weight_map": weight_map}, indent=1))
    config.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    record = {**want, "n_params": count, "bytes": size}
    marker.write_text(json.dumps(record, indent=1))
    return record


def random_llama(shape: LlamaShape, vocab: int, *, seed: int = 0,
                 attn_implementation: str = "sdpa") -> torch.nn.Module:
    """A seeded random ``LlamaForCausalLM`` in float32 on the CPU, eval mode."""
    from transformers import LlamaForCausalLM

    config = shape.config(vocab)
    config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


# ----------------------------------------------------------------------------- memory
def status_kib(keys: tuple[str, ...] = ("VmRSS", "VmHWM", "RssAnon", "RssFile")
               ) -> dict[str, int]:
    """Fields of ``/proc/self/status`` in KiB (Linux)."""
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in keys:
                out[key] = int(value.split()[0])
    return out


class PeakSampler:
    """The largest ``RssAnon`` and ``VmRSS`` seen while the block runs, read every
    ``interval_s`` by a thread (and once at the start and end): a lower bound of the true
    peak, missing at most what is allocated and freed between two reads."""

    def __init__(self, interval_s: float = 0.005) -> None:
        self.interval_s = interval_s
        self.peak: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _read(self) -> None:
        for key, value in status_kib(("VmRSS", "RssAnon")).items():
            self.peak[key] = max(self.peak.get(key, 0), value)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._read()

    def __enter__(self) -> PeakSampler:
        self._read()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._read()
