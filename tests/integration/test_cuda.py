"""On a CUDA device (skipped elsewhere, each test with its reason): capture equals eager
attention in bf16 on the SDPA path, and the census, activation patching and direct logit
attribution of a bf16 model on the GPU equal those of the same model in float32 on the CPU
within tolerances derived from bf16's precision.

Tolerances. bf16 keeps 8 significant bits: one rounding changes a value by at most
``u = 2^-8`` relative. The capture computes each layer as transformers' eager attention does,
so its maps differ from the eager twin's only by the twin rounding its float32 softmax to
bf16: ``|p - p'| <= u · max(p, p')``. Against the float32 model every rounded operation on
the path from the embeddings to a result adds at most ``u`` relative error, to first order
and with the tiny model's operations well conditioned (random weights, no cancellation by
construction): :data:`ROUNDINGS` per layer (input norm, q, k, v, scores, softmax,
weights·values, output projection, residual add, post-attention norm, gate, up, activation,
product, down, residual add = 16) times 2 layers, plus the embedding, the final norm and the
unembedding — ``n = 35`` roundings, a relative error of at most ``n · u`` of the result's
scale: ``ln(keys)`` for an entropy (its largest value), the largest ``|logit|`` metric for a
patched metric, the sum of the components' magnitudes for a DLA component.
"""

from __future__ import annotations

import math

import pytest
import torch

import attnprobe as ap
from tests.integration.causal_lms import causal_lm, text

pytestmark = pytest.mark.cuda

DEVICE = "cuda"
U_BF16 = 2.0**-8
N_LAYERS = 2
ROUNDINGS = 16 * N_LAYERS + 3  # see the module docstring
TOL = ROUNDINGS * U_BF16
CLEAN = text(5, 17, 23, 42, 8, 61, 9, 33)
CORRUPT = text(5, 17, 70, 42, 8, 61, 9, 33)
TEXTS = [CLEAN, text(11, 12, 13, 14, 15, 16, 17), text(40, 41, 42, 40, 41, 42)]


@pytest.fixture(scope="module")
def models():
    """(float32 model on the CPU, its bf16 copy on the GPU, bf16 eager twin on the GPU,
    tokenizer)."""
    cpu, tok = causal_lm("llama")
    gpu, _ = causal_lm("llama")
    gpu = gpu.to(device=DEVICE, dtype=torch.bfloat16)
    eager, _ = causal_lm("llama", implementation="eager")
    eager = eager.to(device=DEVICE, dtype=torch.bfloat16)
    return cpu, gpu, eager, tok


def test_capture_equals_eager_in_bf16_with_sdpa(models):
    _, gpu, eager, tok = models
    assert gpu.config._attn_implementation == "sdpa"
    for sentence in TEXTS:
        ids = tok(sentence)["input_ids"]
        (amap,) = ap.extract(gpu, tok, [ids])
        with torch.no_grad():
            out = eager(input_ids=torch.tensor([ids], device=DEVICE), output_attentions=True)
        ref = torch.stack([a[0] for a in out.attentions]).double().cpu()
        got = amap.pattern.double().cpu()
        assert got.shape == ref.shape
        assert ((got - ref).abs() <= U_BF16 * torch.maximum(got, ref)).all()


def test_census_on_gpu_matches_float32_cpu(models):
    cpu, gpu, _, tok = models
    want = ap.heads.census(cpu, tok, TEXTS).scores().set_index(["layer", "head"])
    got = ap.heads.census(gpu, tok, TEXTS).scores().set_index(["layer", "head"])
    assert list(got.index) == list(want.index)
    longest = max(len(tok(t)["input_ids"]) for t in TEXTS)
    diff = (got["entropy"] - want["entropy"]).abs()
    assert (diff <= TOL * math.log(longest)).all(), diff.max()


def test_patch_heads_on_gpu_matches_float32_cpu(models):
    cpu, gpu, _, tok = models
    want = ap.patch.heads(cpu, tok, CLEAN, CORRUPT, "next-token")
    got = ap.patch.heads(gpu, tok, CLEAN, CORRUPT, "next-token")
    assert list(zip(got["layer"], got["head"], strict=True)) == \
        list(zip(want["layer"], want["head"], strict=True))
    with torch.no_grad():
        logits = cpu(**tok([CLEAN, CORRUPT], return_tensors="pt")).logits
    scale = float(logits.abs().max())
    diff = (got["patched"] - want["patched"]).abs()
    assert (diff <= TOL * scale).all(), diff.max()


def test_logit_attribution_on_gpu_matches_float32_cpu(models):
    cpu, gpu, _, tok = models
    want = ap.heads.logit_attribution(cpu, tok, TEXTS, "next-token").table
    got = ap.heads.logit_attribution(gpu, tok, TEXTS, "next-token").table
    assert list(got["component"]) == list(want["component"])
    scale = want.groupby("example_id")["value"].apply(lambda v: v.abs().sum())
    bound = TOL * want["example_id"].map(scale)
    diff = (got["value"] - want["value"]).abs()
    assert (diff <= bound).all(), (diff / bound).max()


def test_model_on_gpu_is_unchanged_by_the_analyses(models):
    _, gpu, _, tok = models
    before = {k: v.clone() for k, v in gpu.state_dict().items()}
    ap.heads.census(gpu, tok, TEXTS[:1])
    ap.heads.logit_attribution(gpu, tok, TEXTS[:1], "next-token")
    assert gpu.config._attn_implementation == "sdpa"
    after = gpu.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
