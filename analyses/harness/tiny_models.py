"""Tiny random models of every text architecture of the installed transformers.

- :func:`text_model_types` — the model types of transformers' text task mappings, each with the
  reason it is not swept (multimodal, no base model) or ``None``;
- :func:`tiny_config` — the type's default config shrunk to hidden 32, 2 layers, 4 heads of
  size 8, 2 KV heads, vocab 128 with every special id inside it, per-layer lists rebuilt for
  the new depth keeping every kind of layer, sub-configs shrunk the same way;
- :func:`build_pair` — the base model (default attention, SDPA where the class has it) and an
  eager twin with the same weights.

Inputs for these models are built by :mod:`harness.tiny_inputs`.

The generic rules are tables (:data:`SIZES`, :data:`PATTERN_SIZES`); what they cannot express is
one entry per type in :mod:`harness.tiny_tables` (config overrides, extra inputs).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from harness.tiny_tables import EXTRA_INPUTS, OVERRIDES

VOCAB = 128
HIDDEN = 32
N_LAYERS = 2
MAX_LAYERS = 4  # at most this many layers, whatever the number of kinds of layer
FIRST_REAL_ID = 3
INIT_STD = 0.3  # far from uniform attention, so a wrong map cannot pass by accident

TEXT_TASK_MAPPINGS = (
    "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
    "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES", "MODEL_FOR_TEXT_ENCODING_MAPPING_NAMES",
)
# a sub-config whose name (or class name) holds one of these makes the config multimodal
NOT_TEXT = ("vision", "audio", "speech", "image", "video", "vq", "acoustic", "semantic_tokenizer")

TEXT_INPUTS = ("input_ids",)
LAYER_KEYS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "encoder_layers",
              "decoder_layers", "num_decoder_layers", "num_encoder_layers")
_FFN = 64
_MOE_FFN = 32
# exact attribute name -> tiny value (applied when the default holds an int)
SIZES: dict[str, int] = {
    **dict.fromkeys(("hidden_size", "d_model", "n_embd", "dim", "embed_dim", "embedding_size",
                     "emb_dim", "embedding_dim", "d_embed", "word_embed_proj_dim", "d_latents",
                     "attention_hidden_size", "lru_width", "output_embedding_size",
                     "pooler_hidden_size", "projection_dim", "ple_embed_dim",
                     "hidden_size_global"), HIDDEN),
    **dict.fromkeys(LAYER_KEYS, N_LAYERS),
    **dict.fromkeys(("num_attention_heads", "n_head", "n_heads", "num_heads",
                     "encoder_attention_heads", "decoder_attention_heads",
                     "num_decoder_attention_heads"), 4),
    **dict.fromkeys(("num_key_value_heads", "num_kv_heads", "kv_n_heads", "n_head_kv",
                     "multi_query_group_num", "num_global_key_value_heads"), 2),
    **dict.fromkeys(("head_dim", "d_kv", "attention_head_size", "d_head", "kv_channels",
                     "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "global_head_dim",
                     "mamba_head_dim", "index_head_dim"), 8),
    **dict.fromkeys(("qk_head_dim",), 16),
    **dict.fromkeys(("n_inner", "d_ff", "d_inner", "dim_ff", "dff", "hidden_dim",
                     "ffn_hidden_size", "intermediate_size_mlp"), _FFN),
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts",
                     "num_experts_total"), 4),
    **dict.fromkeys(("num_experts_per_tok", "moe_top_k", "top_k", "num_selected_experts"), 2),
    **dict.fromkeys(("n_shared_experts", "num_shared_experts", "moe_num_shared_experts"), 1),
    **dict.fromkeys(("n_group", "topk_group"), 1),
    **dict.fromkeys(("kv_lora_rank", "q_lora_rank", "o_lora_rank"), 16),
    **dict.fromkeys(("state_size", "d_state", "ssm_state_size", "mamba_d_state", "time_step_rank",
                     "mamba_d_ssm", "index_n_heads", "index_topk"), 8),
    **dict.fromkeys(("sliding_window", "attention_window", "attention_chunk_size",
                     "sliding_window_size", "local_window_size"), 4),
    **dict.fromkeys(("first_k_dense_replace",), 1),
    **dict.fromkeys(("num_kv_shared_layers",), 0),
    **dict.fromkeys(("rotary_dim",), 4),
    **dict.fromkeys(("query_pre_attn_scalar",), 8),  # Gemma: 1/sqrt(256) would flatten attention
    **dict.fromkeys(("upsample_initial_channel",), 64),  # halved at each upsampling stage
    **dict.fromkeys(("visual_feat_dim", "unit_embed_dim",
                     "lang_embed_dim", "spkr_embed_dim", "t2u_variance_predictor_embed_dim",
                     "t2u_variance_predictor_hidden_dim", "linear_head_dim"), 16),
    **dict.fromkeys(("zero_expert_num",), 2),
    **dict.fromkeys(("mamba_n_heads",), 8),
    **dict.fromkeys(("n_groups", "mamba_n_groups"), 1),
    **dict.fromkeys(("indexer_n_heads", "indexer_kv_heads"), 2),
    **dict.fromkeys(("indexer_head_dim",), 8),
    **dict.fromkeys(("indexer_budget",), 8),
    **dict.fromkeys(("indexer_compress_ratio",), 2),
}
POSITIONS = 128  # any position table (learned, RoPE cache, relative buckets) no larger
# (pattern on the attribute name, rule: default int -> tiny int); first match wins
PATTERN_SIZES: tuple[tuple[re.Pattern[str], Callable[[int], int]], ...] = (
    (re.compile(r"(^|_)(moe|expert|shared)[a-z_]*(intermediate|ffn|hidden)_size$"),
     lambda v: min(v, _MOE_FFN)),
    (re.compile(r"intermediate_size$|ffn_dim$"), lambda v: min(v, _FFN)),
    (re.compile(r"vocab_size|num_hash_buckets|_vocab$"), lambda v: min(v, VOCAB)),
    (re.compile(r"max_.*position|^n_positions$|^n_ctx$|max_seq_len|context_length|"
                r"max_(source|target)_positions|_max_length$"), lambda v: min(v, POSITIONS)),
)
# attributes a default may leave None although its model needs them
FILL_IF_NONE = frozenset(("head_dim", "num_key_value_heads", "vocab_size", "n_routed_experts",
                          "n_shared_experts", "num_experts_per_tok", "indexer_n_heads",
                          "indexer_kv_heads", "indexer_head_dim", "indexer_budget",
                          "indexer_compress_ratio"))
INIT_KEYS = ("initializer_range", "init_std", "initializer_std")
SPECIAL_ID = re.compile(r"_token_(id|index)s?$|^decoder_start_token_id$")
_LOW_IDS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}


@dataclass(frozen=True)
class ModelType:
    """One model type of transformers' text mappings; ``skip`` says why it is not swept."""

    name: str
    skip: str | None = None


def _multimodal(config_cls: type, prefix: str = "") -> str | None:
    """``multimodal: <path> (<class>)`` for the first sub-config (at any depth) named like a
    vision / audio / speech one, else None."""
    for key, sub in (getattr(config_cls, "sub_configs", {}) or {}).items():
        label = f"{key} {getattr(sub, '__name__', '')}".lower()
        if any(marker in label for marker in NOT_TEXT):
            return f"multimodal: {prefix}{key} ({getattr(sub, '__name__', sub)})"
        deeper = _multimodal(sub, f"{prefix}{key}.") if sub is not config_cls else None
        if deeper:
            return deeper
    return None


def _main_input(model_type: str) -> str | None:
    """Why the base model does not read token ids (its ``main_input_name``), or None."""
    import transformers
    from transformers.models.auto import modeling_auto as ma

    name = ma.MODEL_MAPPING_NAMES[model_type]
    name = name[0] if isinstance(name, (tuple, list)) else name
    main = getattr(getattr(transformers, name, None), "main_input_name", "input_ids")
    if main in TEXT_INPUTS or model_type in EXTRA_INPUTS:
        return None
    return f"not a text model: {name} reads {main}"


def text_model_types() -> list[ModelType]:
    """Every type of the text task mappings, in name order, with why it is skipped (if so)."""
    from transformers.models.auto import configuration_auto as ca
    from transformers.models.auto import modeling_auto as ma

    names = sorted(set().union(*(getattr(ma, m) for m in TEXT_TASK_MAPPINGS)))
    out = []
    for name in names:
        if name not in ma.MODEL_MAPPING_NAMES:
            out.append(ModelType(name, "no base model in MODEL_MAPPING_NAMES"))
        elif name not in ca.CONFIG_MAPPING_NAMES:
            out.append(ModelType(name, "no config class in CONFIG_MAPPING_NAMES"))
        else:
            out.append(ModelType(name, _multimodal(ca.CONFIG_MAPPING[name])
                                 or _main_input(name)))
    return out


# ------------------------------------------------------------------ tiny configs
def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _tiny_int(key: str, value: int) -> int | None:
    if key in SIZES:
        return SIZES[key]
    for pattern, rule in PATTERN_SIZES:
        if pattern.search(key):
            return rule(value)
    return None


def _kinds(values: list[Any]) -> list[Any]:
    """Distinct entries in order of first appearance (lists are compared by value)."""
    seen: list[Any] = []
    for v in values:
        if v not in seen:
            seen.append(v)
    return seen


def _per_layer(key: str, values: list[Any], n: int) -> list[Any]:
    """A per-layer list rebuilt for ``n`` layers: every kind kept, in order of appearance,
    then cycled; ints of a size attribute shrunk like the attribute itself."""
    kinds = _kinds(values)
    if all(_is_int(v) for v in kinds):
        tiny = _tiny_int(key, max(kinds))
        kinds = _kinds([tiny for _ in kinds]) if tiny is not None and key in SIZES else kinds
        if tiny is not None and key not in SIZES:
            kinds = _kinds([min(v, tiny) for v in kinds])
    return [kinds[i % len(kinds)] for i in range(n)]


def _layer_lists(d: dict[str, Any], depth: set[int]) -> dict[str, list[Any]]:
    """Attributes that hold one entry per layer (a list as long as a layer count)."""
    return {k: v for k, v in d.items() if isinstance(v, list) and len(v) in depth and len(v) > 1
            and k not in ("architectures",)}


def _size_of(config: Any, key: str, value: Any) -> int | None:
    """The tiny value of an int attribute (by its name or any alias of it), or None."""
    aliases = [a for a, real in getattr(config, "attribute_map", {}).items() if real == key]
    for name in (key, *aliases):
        if _is_int(value):
            tiny = _tiny_int(name, value)
            if tiny is not None:
                return tiny
        elif value is None and name in FILL_IF_NONE:
            return SIZES.get(name, VOCAB if "vocab" in name else None)
    return None


def _tiny_values(config: Any, values: dict[str, Any]) -> dict[str, Any]:
    """The size attributes among ``values`` shrunk; latent attention (a ``kv_lora_rank``)
    expands keys to every head, so it gets as many KV heads as heads."""
    out = {}
    for key, value in values.items():
        tiny = None if SPECIAL_ID.search(key) else _size_of(config, key, value)
        if tiny is not None and tiny != value:
            out[key] = tiny
    if values.get("kv_lora_rank") and "num_key_value_heads" in values:
        out["num_key_value_heads"] = out.get("num_attention_heads",
                                             values.get("num_attention_heads"))
    return out


def _per_layer_config(d: dict[str, Any], config: Any, layer_types: list[Any]
                      ) -> dict[int, dict[str, Any]]:
    """``per_layer_config`` (layer -> attribute overrides) for the new layers: each new layer
    gets the shrunk overrides of the first old layer of its kind that had any."""
    old_types = d.get("layer_types") or []
    by_kind: dict[Any, dict[str, Any]] = {}
    for key, values in sorted(d["per_layer_config"].items(), key=lambda kv: int(kv[0])):
        kind = old_types[int(key)] if int(key) < len(old_types) else None
        by_kind.setdefault(kind, {**values, **_tiny_values(config, values)})
    return {i: by_kind[kind] for i, kind in enumerate(layer_types) if kind in by_kind}


def shrink_kwargs(config: Any, overrides: dict[str, Any] | None = None,
                  init_std: float | None = INIT_STD) -> dict[str, Any]:
    """Constructor keywords that turn ``config`` (a default config) into a tiny one.

    Only attributes the default has are set (read-only properties are never in ``to_dict``);
    sub-configs are shrunk recursively and passed as dicts. ``init_std`` replaces the
    initializer's standard deviation (None: keep the family's default).
    """
    overrides = dict(overrides or {})
    d = config.to_dict()
    kwargs: dict[str, Any] = {}
    depth = {v for k, v in d.items() if k in LAYER_KEYS and _is_int(v) and v > 0}
    lists = _layer_lists(d, depth)
    n = max([N_LAYERS] + [len(_kinds(v)) for v in lists.values()])
    n = min(n, MAX_LAYERS)
    n = next((overrides[k] for k in LAYER_KEYS if _is_int(overrides.get(k))), n)
    rest = {}
    for key, value in d.items():
        if key in overrides or isinstance(getattr(type(config), key, None), property):
            continue
        if key in LAYER_KEYS and _is_int(value) and value > 0:
            kwargs[key] = n
        elif key in lists:
            kwargs[key] = _per_layer(key, value, n)
        elif key in INIT_KEYS and isinstance(value, float):
            if init_std is not None:
                kwargs[key] = init_std
        elif key != "per_layer_config":
            rest[key] = value
    kwargs.update(_tiny_values(config, rest))
    if isinstance(d.get("per_layer_config"), dict) and "per_layer_config" not in overrides:
        layer_types = overrides.get("layer_types", kwargs.get("layer_types", []))
        kwargs["per_layer_config"] = _per_layer_config(d, config, layer_types)
    for key in (getattr(config, "sub_configs", {}) or {}):
        sub = getattr(config, key, None)
        if sub is not None and hasattr(sub, "to_dict") and key not in overrides:
            kwargs[key] = {"model_type": sub.model_type,
                           **shrink_kwargs(sub, OVERRIDES.get(sub.model_type), init_std)}
    kwargs.update(overrides)
    return kwargs


def _fix_special_ids(config: Any, vocab: int) -> None:
    """Every special id inside the vocabulary: pad/bos/eos -> 0/1/2, others from the top."""
    top = vocab - 1
    for key in sorted(config.to_dict()):
        if not SPECIAL_ID.search(key) or isinstance(getattr(type(config), key, None), property):
            continue
        value = getattr(config, key, None)
        if _is_int(value) and value >= vocab:
            new = _LOW_IDS.get(key, top if key not in ("decoder_start_token_id",) else 2)
            top -= key not in _LOW_IDS and key != "decoder_start_token_id"
            setattr(config, key, new)
        elif isinstance(value, list) and any(_is_int(v) and v >= vocab for v in value):
            setattr(config, key, [v if v < vocab else _LOW_IDS.get(key, 2) for v in value])


def special_ids(config: Any) -> set[int]:
    """Every int held by an attribute named like a special token id (sub-configs included)."""
    found: set[int] = set()
    configs = [config] + [getattr(config, k, None) for k in getattr(config, "sub_configs", {})]
    for cfg in configs:
        if cfg is None or not hasattr(cfg, "to_dict"):
            continue
        for key, value in cfg.to_dict().items():
            if SPECIAL_ID.search(key):
                values = value if isinstance(value, list) else [value]
                found.update(v for v in values if _is_int(v))
    return found


def vocab_size(config: Any) -> int:
    """The (tiny) vocabulary the input ids must stay below."""
    sizes = [getattr(c, k, None) for c in (config, getattr(config, "text_config", None))
             for k in ("vocab_size", "src_vocab_size") if c is not None]
    sizes = [v for v in sizes if _is_int(v) and v > 0]
    return min(sizes) if sizes else VOCAB


def tiny_config(model_type: str, init_std: float | None = INIT_STD) -> Any:
    """The default config of ``model_type`` shrunk to a model of a few hundred thousand
    parameters (see module docstring); :data:`OVERRIDES` patch what the rules cannot."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    config = cls(**shrink_kwargs(cls(), OVERRIDES.get(model_type), init_std))
    for cfg in [config] + [getattr(config, k, None) for k in getattr(config, "sub_configs", {})]:
        if cfg is not None and hasattr(cfg, "to_dict"):
            _fix_special_ids(cfg, vocab_size(config))
    return config


# ------------------------------------------------------------------ models
def spread_weights(model: torch.nn.Module, std: float = INIT_STD, seed: int = 0) -> None:
    """Make a random model's attention far from uniform whatever its family's init does:
    weight matrices the init left below ``std / 6`` are redrawn from N(0, std) (e.g. GPT-1's
    Conv1D at 0.02), and constant parameters get noise (zeros: N(0, 1), e.g. ZAYA's key
    temperature or learned sinks; others: times 1 + N(0, std), e.g. norm weights)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            if not param.is_floating_point() or param.numel() == 0:
                continue
            noise = torch.randn(param.shape, generator=g).to(param.dtype)
            if param.numel() > 1 and param.ndim == 2 and 0 < param.std() < std / 6:
                param.copy_(noise * std)
            elif param.numel() == 1 or param.std() == 0:
                param.copy_(noise if not param.any() else param * (1 + std * noise))


def build_pair(config: Any, seed: int = 0, spread: bool = True
               ) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The base model (``AutoModel.from_config`` asked for SDPA, so that families transformers
    keeps on eager by default — Gemma-2, GPT-OSS ... — are exercised on SDPA too where the
    class allows it; its default otherwise) in eval mode, its weights spread
    (:func:`spread_weights`) unless ``spread=False``, and an eager twin built from a deep copy
    of the config with the same weights."""
    import transformers

    torch.manual_seed(seed)
    try:
        model = transformers.AutoModel.from_config(copy.deepcopy(config),
                                                   attn_implementation="sdpa").eval()
    except (ValueError, ImportError, NotImplementedError):  # the class has no SDPA path
        torch.manual_seed(seed)
        model = transformers.AutoModel.from_config(copy.deepcopy(config)).eval()
    if spread:
        spread_weights(model, seed=seed)
    twin = transformers.AutoModel.from_config(copy.deepcopy(config),
                                              attn_implementation="eager").eval()
    twin.load_state_dict(model.state_dict())
    return model, twin
