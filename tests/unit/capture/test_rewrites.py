"""Reading and rewriting q, k, v, per-head outputs, and knocking out edges — on the HF
interface seam (tiny GPT-2 and a grouped-query LLaMA), attnprobe's reference models (hook
points) and the module seam. Expected values come from construction: z is the captured
weights times the captured values; patching a layer's q, k and v from another run gives that
run's z; a knocked-out row is the original row renormalised over the keys it keeps."""

from __future__ import annotations

import pytest
import torch

import attnprobe as ap
from attnprobe.capture import (
    Activations,
    EditKey,
    EditOutput,
    EditQuery,
    EditValue,
    Keep,
    Knockout,
)
from attnprobe.models import build_reference
from tests.conftest import track
from tests.integration.hf_models import build
from tests.integration.legacy_models import build_pair as legacy_pair
from tests.integration.legacy_models import padded
from tests.unit.capture.tiny import batch

CLEAN, CORRUPT = batch("llama", seed=1), batch("llama", seed=2)


def reference_llama():
    model, tok = build_reference("llama")  # GQA: 4 query heads on 2 key/value heads
    return track(model), tok


MODELS = {
    "llama": lambda: (build("llama"), CLEAN, CORRUPT),
    "gpt2": lambda: (build("gpt2"), batch("gpt2", seed=1), batch("gpt2", seed=2)),
    "ref:llama": lambda: (reference_llama()[0], dict(CLEAN), dict(CORRUPT)),
}


def run(model, inputs, *parts):
    with torch.no_grad(), ap.capture(model, parts=[Keep(), *parts]) as cap:
        out = model(**inputs)
    return cap, out


def site_named(cap, layer):
    return next(s for s in cap.activations[0] if s.layer == layer)


@pytest.mark.parametrize("name", MODELS)
def test_per_head_outputs_are_weights_times_values(name):
    model, inputs, _ = MODELS[name]()
    cap, _ = run(model, inputs, Activations())
    for site, acts in cap.activations[0].items():
        q, k, v, z = (acts[n] for n in "qkvz")
        assert q.shape[1] == z.shape[1] and k.shape == v.shape
        group = q.shape[1] // v.shape[1]
        pattern = next(b for b in cap.batches() if site.layer in b.layers).pattern
        weights = pattern[:, b_layer_index(cap, site.layer)]  # [batch, head, q, k]
        expected = weights @ v.repeat_interleave(group, 1)
        mask = inputs["attention_mask"].bool()
        torch.testing.assert_close(z[mask[:, None, :].expand(-1, z.shape[1], -1)],
                                   expected[mask[:, None, :].expand(-1, z.shape[1], -1)],
                                   atol=1e-5, rtol=0)


def b_layer_index(cap, layer):
    return next(b for b in cap.batches() if layer in b.layers).layers.index(layer)


@pytest.mark.parametrize("name", MODELS)
def test_patching_a_layers_q_k_v_gives_that_runs_outputs(name):
    """Layer 1's per-head outputs depend only on its q, k and v: taken from the clean run,
    the corrupted run computes the clean z there (and so every later computation of the
    attention sees them)."""
    model, clean, corrupt = MODELS[name]()
    clean_cap, _ = run(model, clean, Activations())
    acts = clean_cap.activations[0][site_named(clean_cap, 1)]

    def take(name_):
        return lambda layer, t: acts[name_].clone() if layer == 1 else t

    patched, _ = run(model, corrupt, Activations(("z",)), EditQuery(take("q")),
                     EditKey(take("k")), EditValue(take("v")))
    z = patched.activations[0][site_named(patched, 1)]["z"]
    mask = (clean["attention_mask"] * corrupt["attention_mask"]).bool()
    rows = mask[:, None, :].expand(-1, z.shape[1], -1)
    torch.testing.assert_close(z[rows], acts["z"][rows], atol=1e-5, rtol=0)
    assert patched.edits["max_abs_change"].max() > 0


@pytest.mark.parametrize("name", MODELS)
def test_patching_a_head_output_changes_only_that_head(name):
    model, clean, corrupt = MODELS[name]()
    clean_cap, _ = run(model, clean, Activations(("z",)))
    z_clean = clean_cap.activations[0][site_named(clean_cap, 0)]["z"]

    def head_2(layer, z):
        z[:, 2] = z_clean[:, 2]
        return z

    with torch.no_grad(), ap.capture(model, "head:0.2", parts=[Activations(("z",)),
                                                                EditOutput(head_2)]) as cap:
        model(**corrupt)
    z = cap.activations[0][site_named(cap, 0)]["z"]
    torch.testing.assert_close(z[:, 2], z_clean[:, 2])
    plain, _ = run(model, corrupt, Activations(("z",)))
    z_plain = plain.activations[0][site_named(plain, 0)]["z"]
    torch.testing.assert_close(z[:, [0, 1, 3]], z_plain[:, [0, 1, 3]])


def test_a_key_patch_of_a_grouped_head_reaches_the_heads_it_serves():
    """LLaMA with 4 query heads on 2 key/value heads: a scope of query head 3 lets a key
    rewrite touch key head 1 only (which serves query heads 2 and 3)."""
    model = build("llama")

    def scramble(layer, k):
        return k.flip(2)

    with torch.no_grad(), ap.capture(model, "head:0.3", parts=[Activations(("k",)),
                                                                EditKey(scramble)]) as cap:
        model(**CLEAN)
    with torch.no_grad(), ap.capture(model, "layer:0", parts=[Activations(("k",))]) as plain:
        model(**CLEAN)
    k = cap.activations[0][site_named(cap, 0)]["k"]  # as the edit left it
    k_plain = plain.activations[0][site_named(plain, 0)]["k"]
    torch.testing.assert_close(k[:, 0], k_plain[:, 0])
    assert (k[:, 1] - k_plain[:, 1]).abs().max() > 0


def renormalised(row: torch.Tensor, blocked: torch.Tensor) -> torch.Tensor:
    kept = row.masked_fill(blocked, 0)
    return kept / kept.sum()


@pytest.mark.parametrize("name", [*MODELS, "gpt_neo"])
def test_a_knockout_renormalises_the_row_over_the_keys_it_keeps(name):
    """Blocking query 3's edge to key 1 in layer 0 (every head): row 3 is the original row
    with key 1 removed and renormalised; every other row of layer 0 is unchanged."""
    if name == "gpt_neo":  # the module seam: a model that computes its weights itself
        model, _ = legacy_pair("gpt_neo")
        inputs = padded("gpt_neo", lengths=(7, 7))
    else:
        model, inputs, _ = MODELS[name]()
    plain, _ = run(model, inputs)

    def edge(layer, shape):
        blocked = torch.zeros(shape, dtype=torch.bool)
        blocked[..., 3, 1] = layer == 0
        return blocked

    knocked, _ = run(model, inputs, Knockout(edge))
    for before, after in zip(plain.maps, knocked.maps, strict=True):
        layer0 = before.layers.index(0)
        first = 0 if inputs["attention_mask"][int(before.example_id)][0] else None
        if first is None:  # left padding: positions shift; the edge is on the padded axes
            continue
        for h in range(before.pattern.shape[1]):
            want = renormalised(before.pattern[layer0, h, 3], torch.arange(
                before.pattern.shape[-1]) == 1)
            torch.testing.assert_close(after.pattern[layer0, h, 3], want, atol=1e-5, rtol=0)
        other = [i for i in range(before.pattern.shape[2]) if i != 3]
        torch.testing.assert_close(after.pattern[layer0, :, other],
                                   before.pattern[layer0, :, other], atol=1e-6, rtol=0)
    assert (knocked.maps[0].pattern[layer0, :, 3, 1] == 0).all()


@pytest.mark.parametrize("name", ["llama", "ref:llama", "gpt_neo"])
def test_a_knockout_that_blocks_nothing_or_everything_is_refused(name):
    if name == "gpt_neo":
        model, _ = legacy_pair("gpt_neo")
        inputs = padded("gpt_neo", lengths=(7, 7))
    else:
        model, inputs, _ = MODELS[name]()

    def nothing(layer, shape):
        return torch.zeros(shape, dtype=torch.bool)

    with pytest.raises(ap.EditNotAppliedError, match="blocked no edge"):
        run(model, inputs, Knockout(nothing))

    def everything(layer, shape):
        return torch.ones(shape, dtype=torch.bool)

    with pytest.raises(ap.InputError, match=r"key|masked"):
        run(model, inputs, Knockout(everything))
    assert ap.count_hooks(model) == 0


def test_q_k_v_parts_are_refused_where_the_module_computes_its_weights():
    model, _ = legacy_pair("gpt_neo")
    for part in (Activations(), EditQuery(lambda layer, q: q)):
        with pytest.raises(ap.InputError, match=r"interface.*hook points"), \
                ap.capture(model, parts=[Keep(), part]):
            pytest.fail("the capture should not open")


def test_a_q_part_on_module_paths_without_a_hook_q_names_what_is_missing():
    model, tok = reference_llama()
    paths = [f"blocks.{i}.attn.hook_pattern" for i in range(2)]
    with torch.no_grad(), ap.capture(model, paths=paths, parts=[Keep(), Activations(("q",))]):
        model(**tok(["t1 t2"]) if callable(tok) else CLEAN)
    model.blocks[0].attn.hook_q = None  # a model that has none
    with pytest.raises(ap.InputError, match="needs a hook_q module next to"), \
            ap.capture(model, paths=paths, parts=[Keep(), Activations(("q",))]):
        pytest.fail("the capture should not open")


def test_a_knockout_that_closes_a_causal_row_on_a_reference_model_is_named():
    """Reference models apply their causal mask after hook_scores: blocking query 0's only
    key (itself) leaves the row nothing, which must be an error, not NaN weights."""
    model, _ = reference_llama()

    def first_row(layer, shape):
        blocked = torch.zeros(shape, dtype=torch.bool)
        blocked[..., 0, 0] = True
        return blocked

    with pytest.raises(ap.InputError, match="blocks every key query 0"):
        run(model, dict(CLEAN), Knockout(first_row))
    assert ap.count_hooks(model) == 0
