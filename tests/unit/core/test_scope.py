"""The one scope language: every form, merging, canonical strings, validation and errors."""

import pickle

import pytest

from attnprobe.core.scope import Scope
from attnprobe.errors import InputError

N_LAYERS, N_HEADS = 4, 3


def heads_in(scope: Scope) -> set[tuple[int, int]]:
    """Every (layer, head) of a 4-layer, 3-head model the scope holds (by its own reading)."""
    return {(layer, head) for layer in scope.layers_in(N_LAYERS)
            for head in scope.heads_of(layer, N_HEADS)}


ALL = {(layer, head) for layer in range(N_LAYERS) for head in range(N_HEADS)}


@pytest.mark.parametrize("text, expected", [
    ("all", ALL),
    ("ALL", ALL),
    ("layer:3", {(3, 0), (3, 1), (3, 2)}),
    ("layers:0-2", {(layer, head) for layer in range(3) for head in range(3)}),
    ("layers:0-1,3", {(layer, head) for layer in (0, 1, 3) for head in range(3)}),
    ("head:3.2", {(3, 2)}),
    ("heads:0.2,1.0", {(0, 2), (1, 0)}),          # heads of different layers together
    ("L3H2", {(3, 2)}),
    ("l1h0", {(1, 0)}),
    ("*.1", {(layer, 1) for layer in range(4)}),
    ("3.*", {(3, 0), (3, 1), (3, 2)}),
    ("L2", {(2, 0), (2, 1), (2, 2)}),
    ("heads: L0H1 , 2.2", {(0, 1), (2, 2)}),
])
def test_every_form_names_the_heads_it_says(text, expected):
    scope = Scope.parse(text)
    assert heads_in(scope) == expected
    assert all(scope.contains(layer, head) == ((layer, head) in expected) for layer, head in ALL)


@pytest.mark.parametrize("text", ["all", "layer:3", "layers:0-2,5", "head:3.2", "heads:0.2,1.0",
                                  "*.1", "heads:0.1,3.*", "heads:*.2,1.0"])
def test_the_canonical_string_parses_back_to_the_same_scope(text):
    scope = Scope.parse(text)
    assert Scope.parse(str(scope)) == scope
    assert hash(Scope.parse(str(scope))) == hash(scope)
    assert pickle.loads(pickle.dumps(scope)) == scope


def test_canonical_strings_read_naturally():
    assert str(Scope.parse("layers:0,1,2,5")) == "layers:0-2,5"
    assert str(Scope.parse("L3H5")) == "head:3.5"
    assert str(Scope.parse("heads:1.8,0.2")) == "heads:0.2,1.8"
    assert str(Scope()) == "all"


def test_scopes_merge_and_covered_terms_fold():
    merged = Scope.parse(["layer:0", "head:3.2"])
    assert heads_in(merged) == {(0, 0), (0, 1), (0, 2), (3, 2)}
    assert Scope.parse("layer:0") | Scope.parse("head:3.2") == merged
    assert Scope.parse(["head:0.1", "layer:0"]) == Scope.parse("layer:0")  # 0.1 is inside 0.*
    assert Scope.parse(["*.1", "head:2.1"]) == Scope.parse("*.1")
    assert Scope.parse(["layer:1", "all"]).is_all


def test_product_constructor_matches_the_keywords_of_capture():
    assert Scope() == Scope.parse("all")
    assert Scope(layers=[2, 0, 2]).layers == (0, 2)
    assert Scope(layers=1, heads=3) == Scope.parse("head:1.3")
    assert heads_in(Scope((0, 1), (0, 2))) == {(0, 0), (0, 2), (1, 0), (1, 2)}
    assert Scope(heads=(1,)) == Scope.parse("*.1")


def test_grids_layers_and_head_covers():
    assert Scope.parse("heads:0.2,1.2").is_grid
    assert not Scope.parse("heads:0.2,1.0").is_grid
    assert Scope.parse("heads:0.2,1.0").head_cover([0, 1], N_HEADS) == (0, 2)
    assert Scope.parse("heads:0.2,1.0").layers == (0, 1)
    assert Scope.parse("*.1").layers is None
    assert Scope.parse("heads:0.2,1.0").layers_in(N_LAYERS) == (0, 1)
    assert Scope.parse("layer:2").heads_of(0, N_HEADS) == ()


@pytest.mark.parametrize("text, message", [
    ("layer:x", "is not a layer"), ("head:3", "is not a head"), ("neurons:1", "unknown form"),
    ("layer:", "names nothing"), ("layers:3-1", "bad range"), ("layers:0-99999999", "bad range"),
    ("", "empty scope"), ("heads:3.5x", "is not a head"),
])
def test_bad_scopes_are_one_line_input_errors(text, message):
    with pytest.raises(InputError, match=message) as info:
        Scope.parse(text)
    assert "\n" not in str(info.value)


def test_bad_values_and_types():
    with pytest.raises(InputError, match="non-negative"):
        Scope(layers=(-1,))
    with pytest.raises(InputError, match="must not be empty"):
        Scope(heads=())
    with pytest.raises(InputError, match="must be a string"):
        Scope.parse(3)
    with pytest.raises(InputError, match="empty list"):
        Scope.parse([])
    with pytest.raises(AttributeError, match="immutable"):
        Scope().terms = frozenset()


def test_validation_against_a_model_size():
    assert Scope.parse("heads:1.2").validate(N_LAYERS, N_HEADS) == Scope.parse("head:1.2")
    with pytest.raises(InputError, match=r"layers \[4\] out of range; the model has 4 layers "
                                         r"\(0\.\.3\)"):
        Scope.parse("layer:4").validate(N_LAYERS, N_HEADS)
    with pytest.raises(InputError, match=r"heads \[3\] out of range"):
        Scope.parse("*.3").validate(N_LAYERS, N_HEADS)
    assert Scope.parse("layer:9").validate(0, 0)  # sizes unknown: nothing to check
    with pytest.raises(InputError, match="head 5 out of range at layer 1"):
        Scope.parse("head:1.5").heads_of(1, N_HEADS)
