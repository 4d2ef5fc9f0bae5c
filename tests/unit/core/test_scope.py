"""The one scope language: every form, merging, canonical strings, validation and errors."""

import pickle

import pytest

from attnprobe.core.scope import MAX_INDICES, MAX_TERMS, Scope
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


# ----------------------------------------------------------------------------- absurd sizes
@pytest.mark.parametrize("text", ["layer:" + "9" * 5000, "head:1." + "7" * 5000,
                                  "layers:0-" + "9" * 5000, "L" + "3" * 4400 + "H1",
                                  "heads:" + "1.x" * 2000])
def test_huge_numbers_are_a_short_one_line_input_error(text):
    # "layer:" + 5000 nines raised int()'s own ValueError (the digit limit), not InputError
    with pytest.raises(InputError) as info:
        Scope.parse(text)
    message = str(info.value)
    assert "\n" not in message and len(message) < 300 and message.startswith("scope '")


def test_huge_values_given_as_numbers_are_named_not_printed():
    with pytest.raises(InputError, match="non-negative integers; got a large negative number"):
        Scope(layers=[-10**5000])
    with pytest.raises(InputError, match=r"got '\[\[\[\[\["):
        Scope(heads=[[[[[[0]]]]] * 100])
    with pytest.raises(InputError, match="more than 9 digits is too large"):
        Scope(layers=[10**5000])
    assert str(Scope(layers=[10**9 - 1])) == "layer:999999999"  # validate() sizes it later


def test_ten_digit_indices_are_refused_and_nine_digit_ones_are_left_to_validation():
    with pytest.raises(InputError, match="index '1234567890' is too large"):
        Scope.parse("layer:1234567890")
    big = Scope.parse("layer:123456789")  # a plain number: validate() says it is out of range
    with pytest.raises(InputError, match="out of range"):
        big.validate(N_LAYERS, N_HEADS)


@pytest.mark.parametrize("kw", [{"layers": range(10**12)}, {"heads": range(10**5)},
                                {"layers": iter(range(10**12))}])
def test_more_layers_or_heads_than_any_model_has_are_refused_without_materialising(kw):
    # range(10**7) took 85 s and 2 GB (a tuple, a set and a product of terms); a range is
    # read no further than MAX_INDICES + 1 items, so an endless iterator is refused too
    with pytest.raises(InputError, match=f"more than {MAX_INDICES} given"):
        Scope(**kw)


def test_a_grid_of_named_heads_is_bounded_but_whole_layers_stay_one_term():
    assert len(Scope(layers=range(MAX_INDICES)).terms) == MAX_INDICES  # the most layers
    assert len(Scope(layers=range(126), heads=range(128)).terms) == 126 * 128  # a real grid
    with pytest.raises(InputError, match=f"more than {MAX_TERMS} heads named one by one"):
        Scope(layers=range(MAX_INDICES), heads=range(MAX_INDICES))
    with pytest.raises(InputError, match=f"more than {MAX_TERMS} heads"):
        Scope(terms=((layer, 0) for layer in range(10**12)))
    with pytest.raises(InputError, match=f"names more than {MAX_INDICES} layers"):
        Scope.parse("layers:" + ",".join(["0-4000"] * 100))
    assert len(Scope.parse("*.5").terms) == 1 and Scope.parse("*.5").contains(10**9, 5)
