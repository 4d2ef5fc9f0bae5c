"""Weight-reading and activation-keeping analyses on models loaded the ways big models are
(issue 27): activation / q / k / v patching, path patching, attribution patching, edge
knockout, direct logit attribution, QK/OV circuits and composition on tiny LLaMA, GPT-2 and
BERT models (:mod:`tests.big_models`).

- offloaded over CPU + disk (accelerate): the same tables as the plain float32 model, bit for
  bit (the same kernels in the same order; only where the weights wait between forwards
  changes), and the model unchanged afterwards;
- int8 (optimum-quanto): the same tables as the float32 *twin* whose weights are the int8
  weights dequantized, to float32 rounding (:func:`fp32_bound`);
- bf16: circuits and composition (read from the weights in float32/64) equal those of the
  float32 model whose weights are rounded to bf16; the forward-based tables are within
  :func:`bf16_bound` of the float32 model's;
- a spy on accelerate's offload hooks: the weights DLA, circuits and composition read are
  loaded one module at a time, and put back;
- refusals and restoration: a failure in the middle of patching or knockout leaves an
  offloaded model as it was; copying analyses refuse offloaded / quantized models in one line.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from accelerate.hooks import AlignDevicesHook

import attnprobe as ap
from attnprobe.core.residence import is_offloaded
from attnprobe.errors import InputError
from attnprobe.faithfulness.sanity import randomized_copy
from tests.big_models import (
    assert_unchanged,
    dequantized_twin,
    load,
    sample_text,
    save_family,
    snapshot,
)

pytestmark = pytest.mark.filterwarnings("ignore")

U32 = 2.0 ** -24  # float32 unit roundoff
U_BF16 = 2.0 ** -8  # bf16 unit roundoff (8-bit significand)

CLEAN, CORRUPT = 0, 3  # sample_text offsets of the clean and corrupted texts


def _metric(family: str) -> str:
    return "prob:the" if family == "bert" else "next-token"


Analysis = Callable[[Any, Any, str], pd.DataFrame]


def _pair(family: str) -> tuple[list[str], list[str]]:
    return [sample_text(family, 6, CLEAN)], [sample_text(family, 6, CORRUPT)]


def _heads(site: str) -> Analysis:
    return lambda m, tok, fam: ap.patch.heads(m, tok, *_pair(fam), _metric(fam), site=site)


ANALYSES: dict[str, Analysis] = {
    "heads": _heads("output"),
    "heads_q": _heads("q"),
    "heads_v": _heads("v"),
    "path": lambda m, tok, fam: ap.patch.path(m, tok, *_pair(fam), _metric(fam),
                                              receivers="layer:1"),
    "attribution": lambda m, tok, fam: ap.patch.attribution(m, tok, *_pair(fam), _metric(fam)),
    "knockout": lambda m, tok, fam: ap.perturb.knockout(m, tok, _pair(fam)[0], "to:0",
                                                        metric=_metric(fam)),
    "dla": lambda m, tok, fam: ap.heads.logit_attribution(m, tok, _pair(fam)[0],
                                                          "next-token").table,
    "circuits": lambda m, tok, fam: ap.heads.circuits(m).table,
    "composition": lambda m, tok, fam: ap.heads.composition(m, n_draws=8).table,
}
FORWARD_FREE = ("circuits", "composition")  # read from the weights alone
PRE_NORM_ONLY = ("path", "dla", "circuits", "composition")  # BERT (post-norm) is refused
CASES = [(family, name) for family in ("llama", "gpt2", "bert") for name in ANALYSES
         if not (family == "bert" and name in PRE_NORM_ONLY)]
# Offloading runs every case; int8 and bf16 run every case on LLaMA and the families'
# own code paths elsewhere (BERT's patching is the slowest; optimum-quanto quantizes
# nn.Linear only, so GPT-2's Conv1D projections stay float32 under int8).
INT8_CASES = [(f, n) for f, n in CASES if f == "llama" or (f, n) in
              {("bert", "heads"), ("bert", "knockout")}]
BF16_CASES = [(f, n) for f, n in CASES if f == "llama" or (f, n) in
              {("gpt2", "heads"), ("gpt2", "dla"), ("gpt2", "circuits"),
               ("gpt2", "composition"), ("bert", "heads")}]


# ----------------------------------------------------------------------------- fixtures
class Models:
    """Each family saved once, each (family, kind) loaded once per module."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.folders: dict[str, Path] = {}
        self.loaded: dict[tuple[str, str], tuple[Any, Any]] = {}
        self.before: dict[tuple[str, str], Any] = {}
        self.tables: dict[tuple[str, str, str], pd.DataFrame] = {}

    def folder(self, family: str) -> Path:
        if family not in self.folders:
            self.folders[family] = save_family(family, self.root / family)
        return self.folders[family]

    def get(self, family: str, kind: str) -> tuple[Any, Any]:
        key = (family, kind)
        if key not in self.loaded:
            folder = self.folder(family)
            if kind == "twin":
                self.loaded[key] = (dequantized_twin(folder, self.get(family, "int8")[0]),
                                    self.get(family, "int8")[1])
            elif kind == "bf16_twin":
                self.loaded[key] = (_rounded_twin(*load(folder, "fp32")), None)
            else:
                self.loaded[key] = load(folder, kind, self.root / f"off-{family}")
            self.before[key] = snapshot(self.loaded[key][0])
        return self.loaded[key]

    def table(self, family: str, kind: str, name: str) -> pd.DataFrame:
        """Analysis ``name`` on the reference model ``kind`` (computed once per module)."""
        key = (family, kind, name)
        if key not in self.tables:
            model, tokenizer = self.get(family, kind)
            if tokenizer is None:  # a twin reads the tokenizer of the model it mirrors
                tokenizer = self.get(family, "fp32")[1]
            self.tables[key] = ANALYSES[name](model, tokenizer, family)
        return self.tables[key]


def _rounded_twin(model: Any, tokenizer: Any) -> Any:
    """The float32 model with every floating weight rounded to bf16 (what the bf16 model
    holds), still computing in float32."""
    with torch.no_grad():
        for tensor in (*model.parameters(), *model.buffers()):
            if tensor.is_floating_point():
                tensor.copy_(tensor.to(torch.bfloat16).float())
    return model


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Models:
    return Models(tmp_path_factory.mktemp("big_causal"))


def _config_sizes(model: Any) -> tuple[int, int, int]:
    """``(layers, d_model, d_mlp)`` of a transformers config of the three families."""
    c = model.config
    layers = getattr(c, "num_hidden_layers", None) or c.n_layer
    d = getattr(c, "hidden_size", None) or c.n_embd
    d_mlp = getattr(c, "intermediate_size", None) or getattr(c, "n_inner", None) or 4 * d
    return layers, d, d_mlp


def fp32_bound(model: Any, seq: int) -> float:
    """Relative bound on the difference of two float32 forwards that multiply by the same
    weight values in a different order (int8 model vs its dequantized twin: quanto scales
    the int8 product where the twin multiplies by ``q · s``).

    A dot product of length ``n`` rounded in float32 is off by at most ``γ_n ≈ n·u``
    (Higham, Thm 3.1) relative to ``Σ|a_i b_i|``; first-order, the errors of the
    forward's products add up. On the path to a logit each layer computes q/k/v and the
    MLP's input projection (length ``d``), the scores (``d_head ≤ d``), ``A·V``
    (``seq``), the output projection (``d``) and the MLP's output (``d_mlp``), then the
    unembedding (``d``): ``N = L·(4d + seq + d_mlp) + d`` and the bound is ``N·u``
    relative to the size of the values compared (the table's largest magnitude)."""
    layers, d, d_mlp = _config_sizes(model)
    return (layers * (4 * d + seq + d_mlp) + d) * U32


def bf16_bound(model: Any) -> float:
    """Relative bound on a bf16 forward against the float32 one, first order.

    Every bf16 rounding is off by at most ``u = 2⁻⁸`` relative; a matmul multiplies bf16
    inputs by bf16-rounded weights (``2u`` relative to ``Σ|a_i b_i|``: one rounding of
    each factor; its float32 accumulation is negligible) and rounds its output (``u``),
    every other operation (norm, rotary, softmax, activation, product, residual sum)
    rounds once. Per layer: 6 matmuls on the path (q/k/v, scores, ``A·V``, output
    projection, MLP in, MLP out) ``6·3u`` plus 7 other operations (2 norms, rotary or
    bias, softmax, activation or gate product, 2 residual sums) ``7u``; then the final
    norm (``u``) and the unembedding (``3u``): ``(25·L + 4)·u`` relative to the size of
    the values compared (the table's largest magnitude)."""
    layers, _, _ = _config_sizes(model)
    return (25 * layers + 4) * U_BF16


def _numeric(frame: pd.DataFrame) -> list[str]:
    return [c for c in frame.columns if pd.api.types.is_float_dtype(frame[c])]


def assert_close_tables(got: pd.DataFrame, want: pd.DataFrame, relative: float) -> None:
    """Same rows and labels; every float column within ``relative`` × the largest magnitude
    of the float columns of ``want`` (the size of the values compared)."""
    floats = _numeric(want)
    assert list(got.columns) == list(want.columns)
    pd.testing.assert_frame_equal(got.drop(columns=floats), want.drop(columns=floats))
    scale = float(np.nanmax(np.abs(want[floats].to_numpy(dtype=float))))
    for column in floats:
        a, b = got[column].to_numpy(dtype=float), want[column].to_numpy(dtype=float)
        np.testing.assert_array_equal(np.isnan(a), np.isnan(b), err_msg=column)
        gap = np.nanmax(np.abs(a - b), initial=0.0)
        assert gap <= relative * scale, (column, gap, relative * scale)


# ----------------------------------------------------------------------------- 1. tables
# (q and k patching share one code path: q stands for both)
@pytest.mark.parametrize(("family", "name"), CASES)
def test_offloaded_tables_equal_plain_exactly(models: Models, family: str, name: str) -> None:
    want = models.table(family, "fp32", name)
    model, tokenizer = models.get(family, "offload")
    got = ANALYSES[name](model, tokenizer, family)
    pd.testing.assert_frame_equal(got, want, check_exact=True)
    assert_unchanged(model, models.before[(family, "offload")])


@pytest.mark.parametrize(("family", "name"), INT8_CASES)
def test_int8_tables_equal_dequantized_twin(models: Models, family: str, name: str) -> None:
    model, tokenizer = models.get(family, "int8")
    got = ANALYSES[name](model, tokenizer, family)
    want = models.table(family, "twin", name)
    seq = len(tokenizer(sample_text(family, 6))["input_ids"])
    assert_close_tables(got, want, fp32_bound(model, seq))
    assert_unchanged(model, models.before[(family, "int8")])


@pytest.mark.parametrize(("family", "name"), BF16_CASES)
def test_bf16_tables_within_bf16_bound(models: Models, family: str, name: str) -> None:
    model, tokenizer = models.get(family, "bf16")
    got = ANALYSES[name](model, tokenizer, family)
    if name in FORWARD_FREE:  # float32/64 from the bf16 weights: the rounded weights' tables
        seq = len(tokenizer(sample_text(family, 6))["input_ids"])
        assert_close_tables(got, models.table(family, "bf16_twin", name),
                            fp32_bound(model, seq))
    else:
        assert_close_tables(got, models.table(family, "fp32", name), bf16_bound(model))
    assert_unchanged(model, models.before[(family, "bf16")])


# ----------------------------------------------------------------------------- 2. the spy
class HookSpy:
    """Wraps accelerate's ``AlignDevicesHook.pre_forward`` / ``post_forward`` and records,
    after every load, how many of the model's offloaded modules hold their own weights
    (any parameter off ``meta``), inside and outside the model's forwards."""

    def __init__(self, model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.model = model
        self.offloaded = [m for m in model.modules() if is_offloaded(m)
                          and any(True for _ in m.parameters(recurse=False))]
        self.in_forward = False
        self.loads_outside = 0
        self.most_outside = 0
        self.most_inside = 0
        self.read: set[str] = set()  # offloaded modules loaded outside the forwards
        names = {id(m): name for name, m in model.named_modules()}
        pre, post = AlignDevicesHook.pre_forward, AlignDevicesHook.post_forward

        def spied_pre(hook: AlignDevicesHook, module: Any, *args: Any, **kwargs: Any) -> Any:
            if module is model:
                self.in_forward = True
            found = pre(hook, module, *args, **kwargs)
            live = self.materialised()
            if self.in_forward:
                self.most_inside = max(self.most_inside, live)
            elif hook.offload:
                self.loads_outside += 1
                self.read.add(names[id(module)])
                self.most_outside = max(self.most_outside, live)
            return found

        def spied_post(hook: AlignDevicesHook, module: Any, output: Any) -> Any:
            found = post(hook, module, output)
            if module is model:
                self.in_forward = False
            return found

        monkeypatch.setattr(AlignDevicesHook, "pre_forward", spied_pre)
        monkeypatch.setattr(AlignDevicesHook, "post_forward", spied_post)

    def materialised(self) -> int:
        return sum(any(p.device.type != "meta" for p in m.parameters(recurse=False))
                   for m in self.offloaded)


WEIGHT_READERS = ("dla", "circuits", "composition")


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("name", WEIGHT_READERS)
def test_weight_reads_load_one_offloaded_module_at_a_time(
        models: Models, monkeypatch: pytest.MonkeyPatch, family: str, name: str) -> None:
    model, tokenizer = models.get(family, "offload")
    spy = HookSpy(model, monkeypatch)
    assert spy.offloaded and spy.materialised() == 0  # layer 1 (and LLaMA's head) on disk
    ANALYSES[name](model, tokenizer, family)
    o_proj = {"llama": "model.layers.1.self_attn.o_proj",
              "gpt2": "transformer.h.1.attn.c_proj"}[family]
    assert o_proj in spy.read  # the disk-offloaded layer's W_O went through its hook
    assert spy.most_outside == 1
    assert spy.most_inside <= 1  # the forwards too (DLA's): one module's weights at a time
    assert spy.materialised() == 0  # every weight back on meta
    assert all(p.device.type == "meta" for m in spy.offloaded for p in m.parameters(False))
    assert_unchanged(model, models.before[(family, "offload")])  # hooks in place, same values


# ----------------------------------------------------------------------------- 5. failures
class FailingMetric:
    """The model's next-token logit, raising on call ``fail_at`` (after the baselines)."""

    def __init__(self, fail_at: int) -> None:
        self.calls, self.fail_at = 0, fail_at

    def __call__(self, output: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("metric failed in the middle")
        logits = output.logits[:, -1]
        return logits.max(-1).values


FAILING_RUNS: dict[str, Callable[[Any, Any, Any], Any]] = {
    "heads": lambda m, tok, metric: ap.patch.heads(m, tok, *_pair("llama"), metric),
    "path": lambda m, tok, metric: ap.patch.path(m, tok, *_pair("llama"), metric,
                                                 receivers="layer:1"),
    "knockout": lambda m, tok, metric: ap.perturb.knockout(m, tok, _pair("llama")[0], "to:0",
                                                           metric=metric),
}


@pytest.mark.parametrize("name", FAILING_RUNS)
def test_failure_in_the_middle_restores_an_offloaded_model(models: Models, name: str) -> None:
    model, tokenizer = models.get("llama", "offload")
    metric = FailingMetric(fail_at=3)
    with pytest.raises(RuntimeError, match="in the middle"):
        FAILING_RUNS[name](model, tokenizer, metric)
    assert metric.calls == 3
    assert_unchanged(model, models.before[("llama", "offload")])
    assert all(p.device.type == "meta" for m in model.modules() if is_offloaded(m)
               for p in m.parameters(recurse=False))
    # and it still computes the plain model's table (a model's later patching runs may
    # take the late-tiled forward, whose batch layout rounds differently in float32)
    seq = len(tokenizer(sample_text("llama", 6))["input_ids"])
    assert_close_tables(ANALYSES["heads"](model, tokenizer, "llama"),
                        models.table("llama", "fp32", "heads"), fp32_bound(model, seq))


@pytest.mark.parametrize("kind", ["offload", "int8"])
def test_randomized_copy_refuses_offloaded_and_quantized_models(models: Models,
                                                                kind: str) -> None:
    model, tokenizer = models.get("llama", kind)
    fix = "--device-map" if kind == "offload" else "--quantization"
    with pytest.raises(InputError, match=fix) as caught:
        randomized_copy(model, 1)
    assert "\n" not in str(caught.value)
    forwards = []
    handle = model.register_forward_pre_hook(lambda *a: forwards.append(1))
    try:
        with pytest.raises(InputError, match=fix):
            ap.faithfulness.evaluate(model, tokenizer, _pair("llama")[0], "next-token",
                                     methods=["saliency"], views=["raw"], sanity=True)
    finally:
        handle.remove()
    assert not forwards  # refused before any forward
    assert_unchanged(model, models.before[("llama", kind)])


def _scores(model: Any, tokenizer: Any, family: str, method: str, view: str) -> torch.Tensor:
    found = ap.attribution.compare(model, tokenizer, _pair(family)[0], "next-token",
                                   methods=[method], views=[view])
    return torch.cat([a.scores.flatten() for a in found.attributions])


@pytest.mark.parametrize("family", ["llama", "gpt2", "bert"])
def test_attn_lrp_on_an_offloaded_model_equals_the_plain_model(models: Models,
                                                               family: str) -> None:
    """AttnLRP's rules replace module forwards: on an offloaded model they go inside
    accelerate's hooks (which load the weights around them), so the relevance is the plain
    model's, bit for bit."""
    want = _scores(*models.get(family, "fp32"), family, "attn_lrp", "raw")
    model, tokenizer = models.get(family, "offload")
    got = _scores(model, tokenizer, family, "attn_lrp", "raw")
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert_unchanged(model, models.before[(family, "offload")])


def test_attn_lrp_and_value_zeroing_on_int8_equal_the_dequantized_twin(models: Models) -> None:
    """The ε-rule multiplies by the quantized weight as the int8 forward does (quanto
    dequantizes it in the product), value zeroing only hooks outputs: both give the
    dequantized float32 twin's scores to float32 rounding (:func:`fp32_bound`)."""
    model, tokenizer = models.get("llama", "int8")
    twin, _ = models.get("llama", "twin")
    seq = len(tokenizer(sample_text("llama", 6))["input_ids"])
    for method, view in (("attn_lrp", "raw"), ("saliency", "value_zeroing")):
        got = _scores(model, tokenizer, "llama", method, view)
        want = _scores(twin, tokenizer, "llama", method, view)
        bound = fp32_bound(model, seq) * float(want.abs().max())
        assert float((got - want).abs().max()) <= bound, (method, view)
    assert_unchanged(model, models.before[("llama", "int8")])


def test_value_zeroing_on_an_offloaded_model_equals_the_plain_model(models: Models) -> None:
    want = _scores(*models.get("llama", "fp32"), "llama", "saliency", "value_zeroing")
    model, tokenizer = models.get("llama", "offload")
    got = _scores(model, tokenizer, "llama", "saliency", "value_zeroing")
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert_unchanged(model, models.before[("llama", "offload")])


# ----------------------------------------------------------------------------- 4. bf16 DLA
def _llama_bf16(layers: int) -> tuple[Any, Any]:
    """A seeded tiny LLaMA of ``layers`` layers (the causal_lms config) cast to bf16."""
    from tests.conftest import track
    from tests.integration.causal_lms import LM_CLASSES, word_tokenizer
    from tests.integration.hf_models import FAMILIES

    torch.manual_seed(0)
    config = FAMILIES["llama"].config()
    config.num_hidden_layers = layers
    model = LM_CLASSES["llama"](config).eval().to(torch.bfloat16)
    return track(model), word_tokenizer(bos=True)


def _parts(model: Any, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
    """What one bf16 forward computed, by hand: the embedded input, each layer's heads'
    outputs ``z`` (o_proj's input), attention and MLP outputs, the final norm's input and
    output, and the logits (all as the model computed them, in bf16)."""
    found: dict[str, Any] = {"z": [], "attn": [], "mlp": []}
    body = model.model
    handles = [body.layers[0].register_forward_pre_hook(
        lambda m, args, kwargs: found.__setitem__("embed", kwargs.get("hidden_states",
                                                                       args[0] if args else None)),
        with_kwargs=True),
        body.norm.register_forward_hook(
            lambda m, args, out: found.update(final_in=args[0], final_out=out))]
    for layer in body.layers:
        handles += [
            layer.self_attn.o_proj.register_forward_pre_hook(
                lambda m, args: found["z"].append(args[0])),
            layer.self_attn.register_forward_hook(
                lambda m, args, out: found["attn"].append(out[0])),
            layer.mlp.register_forward_hook(lambda m, args, out: found["mlp"].append(out))]
    try:
        with torch.no_grad():
            found["logits"] = model(**batch).logits
    finally:
        for handle in handles:
            handle.remove()
    return found


def test_bf16_dla_is_computed_in_float64_from_the_bf16_activations(models: Models) -> None:
    """Each head's component is ``z_h · W_O[h] · (γ ⊙ W_U[:, t]) / s`` of the bf16 run's own
    activations, evaluated in float64 (``1/s`` the final norm's scale as the run applied it:
    least squares of its output on ``γ ⊙ x``): equal to float32 rounding, so nothing was
    rounded to bf16 on the way."""
    model, tokenizer = models.get("llama", "bf16")
    text = _pair("llama")[0]
    dla = ap.heads.logit_attribution(model, tokenizer, text, "next-token")
    batch = tokenizer(text, return_tensors="pt")
    found = _parts(model, batch)
    token = int(found["logits"][0, -1].float().argmax())
    gamma = model.model.norm.weight.double()
    a = gamma * found["final_in"][0, -1].double()
    inv_s = float((found["final_out"][0, -1].double() * a).sum() / (a * a).sum())
    u = gamma * model.lm_head.weight[token].double() * inv_s  # [d]
    n, d_head = model.config.num_attention_heads, model.config.head_dim
    table = dla.table.set_index("component")["value"]
    for i, layer in enumerate(model.model.layers):
        z = found["z"][i][0, -1].double().view(n, d_head)  # [head, d_head]
        W_O = layer.self_attn.o_proj.weight.double().T.reshape(n, d_head, -1)  # [h, dh, d]
        want = torch.einsum("hd,hdm,m->h", z, W_O, u)
        got = torch.tensor([table[f"L{i}H{h}"] for h in range(n)], dtype=torch.float64)
        # relative to Σ|terms|: the library reads the norm's weight γ by fitting the norm on
        # float32 probe rows (read_norm: a product, a quotient and a mean, 3 roundings
        # u32), and sums in float64 (negligible); a bf16 step would be off by u_bf16 = 2⁻⁸
        size = torch.einsum("hd,hdm,m->h", z.abs(), W_O.abs(), u.abs())
        assert bool(((got - want).abs() <= size * 3 * U32).all())


def test_bf16_dla_of_a_deep_model_sums_to_its_logit_within_its_rounding() -> None:
    """16 bf16 layers: the residual's own roundings (3 per layer) exceed a fixed
    few-ulp tolerance; the components still sum to the model's logit within
    ``(3·L + 5)·u`` times the rounding size ``|coeff| Σ_j P_j |ū_j| / s``
    (:func:`attnprobe.heads.residual_parts.rounding_bound`), P computed here by hand."""
    model, tokenizer = _llama_bf16(16)
    texts = [sample_text("llama", 8, start) for start in range(6)]
    dla = ap.heads.logit_attribution(model, tokenizer, texts, "next-token")
    from attnprobe.heads.residual_parts import rounding_bound  # (after: fails first above)
    from attnprobe.weights.anatomy import anatomy

    bound = rounding_bound(anatomy(model), torch.bfloat16)
    assert bound == (3 * 16 + 5) * U_BF16
    gamma = model.model.norm.weight.double()
    for t, text in enumerate(texts):
        found = _parts(model, tokenizer([text], return_tensors="pt"))
        token = int(found["logits"][0, -1].float().argmax())
        parts = [found["embed"], *found["attn"], *found["mlp"]]
        P = sum(p[0, -1].double().abs() for p in parts)  # [d]
        a = gamma * found["final_in"][0, -1].double()
        inv_s = float((found["final_out"][0, -1].double() * a).sum() / (a * a).sum())
        size = float((P * (gamma * model.lm_head.weight[token].double()).abs()).sum()) * inv_s
        row = dla.totals.iloc[t]
        assert row["value"] == pytest.approx(float(found["logits"][0, -1, token]), abs=0)
        assert abs(row["gap"]) <= bound * size
