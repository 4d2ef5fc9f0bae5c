"""How patches are split into forwards (``attnprobe.patch.units.chunks``), by construction."""

from __future__ import annotations

from attnprobe.patch.units import SHARED, Unit, chunks


def heads(layers: int, per_layer: int) -> list[Unit]:
    return [Unit(((layer, head),)) for layer in range(layers) for head in range(per_layer)]


def test_a_layer_of_enough_patches_gets_forwards_of_its_own_at_any_batch_size():
    units = heads(3, 12)  # 12 >= SHARED patches per layer
    assert SHARED <= 12
    for per_forward in (16, 64, 1000):
        assert chunks(units, per_forward) == [(0, 12), (12, 24), (24, 36)]
    # 5 per forward: 2 patches left of a layer are under half: they share with the next
    assert chunks(units, 5) == [(0, 5), (5, 10), (10, 15), (15, 20), (20, 24), (24, 29),
                                (29, 34), (34, 36)]


def test_small_layers_share_a_forward_until_it_is_half_full_or_holds_enough():
    units = heads(4, 3)  # 3 patches per layer
    assert chunks(units, 8) == [(0, 6), (6, 12)]  # cut at the first turn at least half full
    assert chunks(units, 100) == [(0, 9), (9, 12)]  # ... or holding SHARED patches
    assert chunks(units, 1) == [(i, i + 1) for i in range(12)]


def test_one_unit_over_every_layer_is_one_forward():
    assert chunks([Unit(((0, 0), (1, 0), (2, 0)))], 16) == [(0, 1)]
