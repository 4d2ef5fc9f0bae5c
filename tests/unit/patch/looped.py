"""Models that run one attention module at several depths of a forward, and an independent
reference for patching them.

- :func:`albert`: a tiny ``AlbertForMaskedLM`` (3 depths of one shared layer);
- :func:`looped_llama`: a tiny ``LlamaForCausalLM`` whose layer list holds one layer object
  twice (``layers = [A, B, A]``: depth 2 runs layer 0 again);
- :func:`gpt_oss`: a tiny ``GptOssForCausalLM`` (mixture-of-experts MLPs that return a tuple);
- :func:`patched_at`: one forward patching one head at one depth with plain torch hooks on
  the attention's own projections, counting the calls of each module — no attnprobe code —
  the reference the batched tables must equal; :func:`path_patched` likewise for path
  patching (one sender head into the queries of every head of one depth).

Per-head slices of the projections are head-major (head ``h``: features ``h·d .. (h+1)·d``),
as both families lay them out. A ``q``/``k`` patch on the projection output before RoPE
equals one after it: the rotation is a fixed function of the position, and both runs have the
same positions.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import transformers
from torch import nn

from tests.conftest import track
from tests.integration.causal_lms import word_tokenizer
from tests.integration.hf_models import FAMILIES

SIZES = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_attention_heads=4,
             initializer_range=0.3)
CLEAN = "w5 w6 w7 w8 w9 w10"
CORRUPT = "w25 w26 w7 w28 w9 w30"
TOL = dict(rtol=1e-5, atol=1e-5)  # float32 (eps 1.2e-7) sums of 32 through 3 depths: ~1e-6


@dataclass(frozen=True)
class Attention:
    """The projections of one attention module: ``q k v`` (outputs ``[batch, seq, heads·d]``)
    and ``o`` (input: the heads' outputs ``z``, head-major)."""

    q: nn.Module
    k: nn.Module
    v: nn.Module
    o: nn.Module
    n_heads: int
    n_kv: int
    d_head: int


@dataclass(frozen=True)
class Looped:
    """A model, its tokenizer, and per depth ``(attention, call)``: the module that depth runs
    and which of its calls in a forward it is."""

    model: nn.Module
    tokenizer: object
    depths: tuple[tuple[Attention, int], ...]
    mlps: tuple[nn.Module, ...] = ()  # per depth (decoders)


def albert() -> Looped:
    torch.manual_seed(0)
    config = transformers.AlbertConfig(**SIZES, embedding_size=16, num_hidden_layers=3)
    model = track(transformers.AlbertForMaskedLM(config).eval())
    layer = model.albert.encoder.albert_layer_groups[0].albert_layers[0].attention
    attn = Attention(layer.query, layer.key, layer.value, layer.dense, 4, 4, 8)
    return Looped(model, word_tokenizer(bos=True), tuple((attn, d) for d in range(3)))


def looped_llama() -> Looped:
    torch.manual_seed(0)
    config = FAMILIES["llama"].config()
    config.num_hidden_layers = 3
    config.use_cache = False  # one cache slot per layer object would see layer 0 twice
    model = transformers.LlamaForCausalLM(config).eval()
    model.model.layers[2] = model.model.layers[0]
    d = config.hidden_size // config.num_attention_heads
    attns = [Attention(a.q_proj, a.k_proj, a.v_proj, a.o_proj, config.num_attention_heads,
                       config.num_key_value_heads, d)
             for a in (layer.self_attn for layer in model.model.layers[:2])]
    mlps = [layer.mlp for layer in model.model.layers]
    return Looped(track(model), word_tokenizer(bos=True),
                  ((attns[0], 0), (attns[1], 0), (attns[0], 1)), tuple(mlps))


def gpt_oss() -> Looped:
    torch.manual_seed(0)
    config = transformers.GptOssConfig(
        **SIZES, num_key_value_heads=2, head_dim=8, num_hidden_layers=2, num_local_experts=4,
        num_experts_per_tok=2, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"])
    model = transformers.GptOssForCausalLM(config).eval()
    layers = model.model.layers
    attns = tuple((Attention(a.q_proj, a.k_proj, a.v_proj, a.o_proj, 4, 2, 8), 0)
                  for a in (layer.self_attn for layer in layers))
    return Looped(track(model), word_tokenizer(bos=True), attns,
                  tuple(layer.mlp for layer in layers))


def inputs(model: Looped, texts: list[str]) -> dict[str, torch.Tensor]:
    found = model.tokenizer(texts, return_tensors="pt")
    return {"input_ids": found["input_ids"], "attention_mask": found["attention_mask"]}


def _record(attn: Attention) -> tuple[dict[str, list[torch.Tensor]], list]:
    """Hooks keeping every call's q/k/v outputs and o input ``[batch, seq, features]``."""
    found: dict[str, list[torch.Tensor]] = {"q": [], "k": [], "v": [], "z": []}
    handles = [getattr(attn, name).register_forward_hook(
        lambda m, a, out, name=name: found[name].append(out.detach().clone()))
        for name in ("q", "k", "v")]
    handles.append(attn.o.register_forward_pre_hook(
        lambda m, args: found["z"].append(args[0].detach().clone())))
    return found, handles


def read_run(model: Looped, batch: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """Per depth the q/k/v outputs, the o input and the pattern ``[batch, head, q, k]`` of a
    plain run (the pattern from an eager twin's own ``output_attentions``)."""
    records = {}
    handles = []
    for attn, _ in model.depths:
        if id(attn) not in records:
            records[id(attn)], more = _record(attn)
            handles += more
    try:
        with torch.no_grad():
            model.model(**batch)
    finally:
        for handle in handles:
            handle.remove()
    twin = copy.deepcopy(model.model)
    twin.set_attn_implementation("eager")
    with torch.no_grad():
        patterns = twin(**batch, output_attentions=True).attentions
    return [{**{name: records[id(attn)][name][call] for name in ("q", "k", "v", "z")},
             "pattern": patterns[depth]}
            for depth, (attn, call) in enumerate(model.depths)]


def patched_at(model: Looped, base: dict[str, torch.Tensor], source: dict[str, torch.Tensor],
               site: str, depth: int, head: int):
    """The output of ``base`` with head ``head`` of ``site`` at ``depth`` taken from
    ``source`` (:func:`read_run` of the other input at that depth); plain hooks that act on
    the module's ``call``-th run only."""
    attn, call = model.depths[depth]
    d = attn.d_head
    cut = slice(head * d, (head + 1) * d)
    calls = {"q": 0, "k": 0, "v": 0, "o": 0}
    values: list[torch.Tensor] = []

    def on_output(name: str):
        def hook(module, args, out):
            mine = calls[name] == call
            calls[name] += 1
            if name == "v":
                values.append(out)
            if mine and name == site:
                out = out.clone()
                out[..., cut] = source[name][..., cut]
                return out
            return None
        return hook

    def on_z(module, args):
        mine = calls["o"] == call
        calls["o"] += 1
        if not mine or site not in ("output", "pattern"):
            return None
        z = args[0].clone()
        if site == "output":
            z[..., cut] = source["z"][..., cut]
        else:  # the head's output with the other run's weights over this run's values
            group = attn.n_heads // attn.n_kv
            kv = slice(head // group * d, (head // group + 1) * d)
            z[..., cut] = source["pattern"][:, head] @ values[-1][..., kv]
        return (z, *args[1:])

    handles = [getattr(attn, name).register_forward_hook(on_output(name))
               for name in ("q", "k", "v")]
    handles.append(attn.o.register_forward_pre_hook(on_z))
    try:
        with torch.no_grad():
            return model.model(**base)
    finally:
        for handle in handles:
            handle.remove()


def _first(output):
    """An MLP's residual update: its output, or the first element of a tuple (MoE)."""
    return output[0] if isinstance(output, tuple) else output


def on_call(module: nn.Module, call: int, fn, *, pre: bool = False):
    """A hook running ``fn`` on the ``call``-th call of ``module`` only (its handle)."""
    calls = [0]

    def hook(module, args, *output):
        mine = calls[0] == call
        calls[0] += 1
        return fn(args, *output) if mine else None
    if pre:
        return module.register_forward_pre_hook(hook)
    return module.register_forward_hook(hook)


def _calls_of(model: Looped, modules: list[nn.Module]) -> list[int]:
    """Per depth, which call of its module that depth is."""
    seen: dict[int, int] = {}
    found = []
    for module in modules:
        found.append(seen.get(id(module), 0))
        seen[id(module)] = found[-1] + 1
    return found


def _run(model: Looped, batch, hooks) -> object:
    handles = [make() for make in hooks]
    try:
        with torch.no_grad():
            return model.model(**batch)
    finally:
        for handle in handles:
            handle.remove()


def path_patched(model: Looped, base, other, sender: int, head: int, receiver: int):
    """The output of path patching ``head`` of depth ``sender`` into the queries of every
    head of depth ``receiver`` (methods.md §16): run B is ``base`` with every head's output
    and every MLP's update before ``receiver`` frozen at their ``base`` values but the
    sender's, taken from ``other``; run C is ``base`` with depth ``receiver``'s queries from
    run B."""
    mlp_calls = _calls_of(model, list(model.mlps))
    kept: dict[str, dict[int, torch.Tensor]] = {"base": {}, "other": {}, "mlp": {}}

    def keep(store, key, pick):
        return lambda args, *out: store.__setitem__(key, pick(args, *out).detach().clone())

    for name, batch in (("base", base), ("other", other)):
        hooks = [lambda d=d, a=a, c=c, s=kept[name]: on_call(a.o, c, keep(s, d,
                                                             lambda args: args[0]), pre=True)
                 for d, (a, c) in enumerate(model.depths)]
        if name == "base":
            hooks += [lambda d=d, m=m: on_call(m, mlp_calls[d], keep(
                kept["mlp"], d, lambda args, out: _first(out)))
                for d, m in enumerate(model.mlps)]
        _run(model, batch, hooks)
    d_head = model.depths[sender][0].d_head
    cut = slice(head * d_head, (head + 1) * d_head)

    def frozen_z(d):
        def fn(args):
            z = kept["base"][d].clone()
            if d == sender:
                z[..., cut] = kept["other"][d][..., cut]
            return (z, *args[1:])
        return fn

    def frozen_mlp(d):
        def fn(args, out):
            if isinstance(out, tuple):
                return (kept["mlp"][d], *out[1:])
            return kept["mlp"][d]
        return fn

    queries: dict[int, torch.Tensor] = {}
    attn, call = model.depths[receiver]
    hooks = [lambda d=d, a=a, c=c: on_call(a.o, c, frozen_z(d), pre=True)
             for d, (a, c) in enumerate(model.depths) if d < receiver]
    hooks += [lambda d=d, m=m: on_call(m, mlp_calls[d], frozen_mlp(d))
              for d, m in enumerate(model.mlps) if d < receiver]
    hooks.append(lambda: on_call(attn.q, call, keep(queries, 0, lambda args, out: out)))
    _run(model, base, hooks)
    return _run(model, base, [lambda: on_call(attn.q, call, lambda args, out: queries[0])])


def head_replaced(model: Looped, batch, depth: int, head: int, make):
    """The output of ``batch`` with head ``head``'s output at ``depth`` replaced by
    ``make(values) -> [batch, seq, d_head]``, ``values`` the value projection of that call
    ``[batch, seq, kv_heads·d_head]`` (plain hooks on the call-th run of the modules)."""
    attn, call = model.depths[depth]
    d = attn.d_head
    cut = slice(head * d, (head + 1) * d)
    values: list[torch.Tensor] = []

    def replace(args):
        z = args[0].clone()
        z[..., cut] = make(values[-1])
        return (z, *args[1:])

    return _run(model, batch, [
        lambda: on_call(attn.v, call, lambda args, out: values.append(out)),
        lambda: on_call(attn.o, call, replace, pre=True)])


def patterns(model: Looped, batch) -> tuple[torch.Tensor, ...]:
    """Per depth the weights ``[batch, head, query, key]`` of a plain run of ``batch`` (an
    eager twin's own ``output_attentions``)."""
    twin = copy.deepcopy(model.model)
    twin.set_attn_implementation("eager")
    with torch.no_grad():
        return twin(**batch, output_attentions=True).attentions


def kv_slice(attn: Attention, head: int) -> slice:
    """The value features of query head ``head``'s key/value head."""
    kv = head // (attn.n_heads // attn.n_kv)
    return slice(kv * attn.d_head, (kv + 1) * attn.d_head)


BUILDERS = {"albert": albert, "looped_llama": looped_llama}
A, B = "w10", "w11"  # the metric of the tests: logit(A) - logit(B)


def masked(model: Looped) -> bool:
    """Whether the model is the masked LM (ALBERT), which reads the metric at its mask."""
    return "Albert" in type(model.model).__name__
