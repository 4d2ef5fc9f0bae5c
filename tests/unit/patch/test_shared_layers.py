"""Batched activation patching on models that run one attention module at several depths
(ALBERT's shared layer, a layer list holding one layer twice) equals one patched forward per
patch done with plain torch hooks on the module's k-th call (:mod:`tests.unit.patch.looped`),
for every site, both directions and the command line; and the check that guards the batched
shortcut catches a shortcut that patches the wrong depth."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pandas as pd
import pytest

import attnprobe as ap
from attnprobe.patch import late_tiling
from attnprobe.patch.late_tiling import LateTiling
from tests.helpers import run_cli
from tests.unit.patch.looped import (
    BUILDERS,
    CLEAN,
    CORRUPT,
    TOL,
    A,
    B,
    Looped,
    albert,
    inputs,
    masked,
    patched_at,
    read_run,
)

SITES = ("output", "q", "k", "v", "pattern")


def metric_of(model: Looped, output) -> np.ndarray:
    """``logit(A) − logit(B)`` per example: at position 2 (ALBERT: a masked LM), else last."""
    ids = model.tokenizer.convert_tokens_to_ids([A, B])
    logits = output.logits[:, 2 if masked(model) else -1]
    return (logits[:, ids[0]] - logits[:, ids[1]]).double().numpy()



def options(model: Looped) -> dict:
    return {"metric_positions": [2]} if masked(model) else {}


def expected(model: Looped, site: str, direction: str) -> dict[tuple[int, int], np.ndarray]:
    """``{(depth, head): patched metric [example]}``, one plain patched forward each."""
    clean, corrupt = inputs(model, [CLEAN, CLEAN]), inputs(model, [CORRUPT, CORRUPT])
    base, other = (corrupt, clean) if direction == "denoising" else (clean, corrupt)
    sources = read_run(model, other)
    found = {}
    for depth, (attn, _) in enumerate(model.depths):
        heads = attn.n_kv if site in ("k", "v") else attn.n_heads
        for head in range(heads):
            output = patched_at(model, base, sources[depth], site, depth, head)
            found[depth, head] = metric_of(model, output)
    return found


def assert_table(model: Looped, table: pd.DataFrame, want: dict) -> None:
    assert len(table) == 2 * len(want)
    for (layer, head), rows in table.groupby(["layer", "head"]):
        np.testing.assert_allclose(rows.sort_values("example_id")["patched"],
                                   want[int(layer), int(head)], **TOL,
                                   err_msg=f"depth {layer} head {head}")


@pytest.mark.parametrize("name", list(BUILDERS))
@pytest.mark.parametrize("direction", ["denoising", "noising"])
@pytest.mark.parametrize("site", SITES)
def test_batched_patching_of_a_shared_layer_equals_one_patch_per_forward(name, site,
                                                                         direction):
    model = BUILDERS[name]()
    table = ap.patch.heads(model.model, model.tokenizer, [CLEAN, CLEAN], [CORRUPT, CORRUPT],
                           f"logit_diff:{A},{B}", site=site, direction=direction,
                           batch_size=32, **options(model))
    assert_table(model, table, expected(model, site, direction))
    if model.depths[0][0].n_kv == 4 or site not in ("k", "v"):
        # 12 patches, 16 per forward: depth 2's start from depth 2 (the shortcut, checked)
        assert LateTiling(model.model).confirmed is True


def test_albert_on_the_command_line_with_one_pair(tmp_path, capsys):
    model = albert()
    folder = tmp_path / "albert"
    model.model.save_pretrained(folder)
    model.tokenizer.save_pretrained(folder)
    out = tmp_path / "heads.csv"
    code, _printed, err = run_cli(
        ["patch", "--model", str(folder), "--experiment", "heads", "--clean", CLEAN,
         "--corrupt", CORRUPT, "--metric", f"logit_diff:{A},{B}", "--metric-positions", "2",
         "--out", str(out)], capsys)
    assert code == 0, err
    table = pd.read_csv(out)
    base, other = inputs(model, [CORRUPT]), inputs(model, [CLEAN])
    sources = read_run(model, other)
    for row in table.itertuples():
        output = patched_at(model, base, sources[row.layer], "output", row.layer, row.head)
        np.testing.assert_allclose(row.patched, metric_of(model, output)[0], **TOL,
                                   err_msg=f"depth {row.layer} head {row.head}")
    assert set(table["layer"]) == {0, 1, 2}


def shortcut_with(monkeypatch, change) -> None:
    """The shortcut's forwards (:meth:`LateTiling.from_layer`) with ``change(logits, rows)``
    applied to the model's output logits ``[copies·rows, ...]``."""
    real = late_tiling.LateTiling.from_layer

    @contextmanager
    def changed(self, layer, rows, copies, replay=None):
        def hook(module, args, output):
            output.logits = change(output.logits, rows)
            return output
        handle = self.model.register_forward_hook(hook)
        try:
            with real(self, layer, rows, copies, replay):
                yield
        finally:
            handle.remove()

    monkeypatch.setattr(late_tiling.LateTiling, "from_layer", changed)


def test_a_shortcut_that_moves_patches_between_rows_is_caught(monkeypatch):
    """Copies of the examples exchanged (the class of a patch landing at the wrong depth or
    row): without a patch every copy is the same, so only the check with a patch sees it;
    the table is still exact."""
    model = albert()
    want = expected(model, "output", "denoising")
    shortcut_with(monkeypatch, lambda logits, rows: logits.roll(rows, 0))
    table = ap.patch.heads(model.model, model.tokenizer, [CLEAN, CLEAN], [CORRUPT, CORRUPT],
                           f"logit_diff:{A},{B}", batch_size=32, **options(model))
    late = LateTiling(model.model)
    assert late.checked is False and late.confirmed is False
    assert_table(model, table, want)


def test_a_shortcut_that_never_repeats_the_examples_is_caught(monkeypatch):
    """The old failure on shared layers: a forward whose output has the examples once (no
    copy ran) read as if every copy were the base run."""
    model = albert()
    want = expected(model, "output", "denoising")
    shortcut_with(monkeypatch, lambda logits, rows: logits[:rows])
    table = ap.patch.heads(model.model, model.tokenizer, [CLEAN, CLEAN], [CORRUPT, CORRUPT],
                           f"logit_diff:{A},{B}", batch_size=32, **options(model))
    assert LateTiling(model.model).checked is False
    assert_table(model, table, want)


def test_the_shortcut_repeats_a_shared_layer_from_its_patched_depth_only():
    """ALBERT's one block runs three times: depths before the first patched one see the
    examples once, the later ones the repeated rows; once checked, a model's patches of
    depth 2 take one such forward."""
    model = albert()
    block = model.model.albert.encoder.albert_layer_groups[0]

    def forwards() -> list[list[int]]:
        seen: list[int] = []
        handle = block.register_forward_hook(lambda m, a, out: seen.append(
            (out[0] if isinstance(out, tuple) else out).shape[0]))
        try:
            ap.patch.heads(model.model, model.tokenizer, [CLEAN, CLEAN], [CORRUPT, CORRUPT],
                           f"logit_diff:{A},{B}", scope="layer:2", batch_size=8,
                           **options(model))
        finally:
            handle.remove()
        return [seen[i:i + 3] for i in range(0, len(seen), 3)]

    # clean and corrupted runs, the unpatched check (2 copies), the shortcut (4 heads x 2
    # examples from depth 2) and, once, the same patches on repeated inputs
    assert forwards() == [[2, 2, 2], [2, 2, 2], [2, 2, 4], [2, 2, 8], [8, 8, 8]]
    late = LateTiling(model.model)
    assert late.checked is True and late.confirmed is True and late.replays is False
    assert forwards() == [[2, 2, 2], [2, 2, 2], [2, 2, 8]]
