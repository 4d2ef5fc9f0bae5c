"""``train_reference_classifiers`` takes its recipe as one object (issue 25: no public
function over 10 parameters) or by its field names, as the analyses call it."""

from __future__ import annotations

import pytest

from attnprobe.errors import InputError
from attnprobe.tasks.classification import TrainingRecipe, train_reference_classifiers

MODEL = ["average-classifier"]
RECIPE = dict(n_train=4, n_held_out=2, steps=1, batch_size=2, lr=1e-3, seed=0, min_len=4,
              max_len=6, vocab_words=20)


def test_the_recipe_by_name_and_as_one_object_train_the_same_model():
    by_name = next(train_reference_classifiers(["contains"], MODEL, **RECIPE))
    by_object = next(train_reference_classifiers(["contains"], MODEL, TrainingRecipe(**RECIPE)))
    assert by_name.train.texts == by_object.train.texts
    for a, b in zip(by_name.model.parameters(), by_object.model.parameters(), strict=True):
        assert bool((a == b).all())


@pytest.mark.parametrize("keywords, message", [
    ({k: v for k, v in RECIPE.items() if k != "lr"}, "missing lr"),
    ({**RECIPE, "epochs": 3}, "unknown 'epochs'"),
])
def test_a_bad_recipe_is_a_one_line_error_naming_the_fields(keywords, message):
    with pytest.raises(InputError, match=message):
        next(train_reference_classifiers(["contains"], MODEL, **keywords))
