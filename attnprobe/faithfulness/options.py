"""What a faithfulness evaluation needs beyond its sources and the corpus options: one
parameter object, so :func:`~attnprobe.faithfulness.evaluate` takes the corpus signature
plus ``options``.

Example:
    >>> FaithfulnessOptions(levels=(0.1, 0.2), removal="replace").curve_steps
    10
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import ClassVar

from attnprobe.core.checks import check_positive_ints
from attnprobe.core.corpus_options import AnalysisOptions
from attnprobe.errors import InputError
from attnprobe.faithfulness.metrics import DEFAULT_LEVELS
from attnprobe.faithfulness.removal import KINDS

__all__ = ["DEFAULT_METHODS", "DEFAULT_VIEWS", "FAITHFULNESS_FIELDS", "VIEW_LAYERS",
           "FaithfulnessOptions"]

# the sources scored by default: the gradient and perturbation methods of the literature and
# the attention views, raw and corrected (value zeroing, ALTI); ten sources plus the random
# baseline
DEFAULT_METHODS = ("integrated_gradients", "saliency", "input_x_gradient", "gradient_shap",
                   "leave_one_out")
DEFAULT_VIEWS = ("raw", "rollout", "attn_x_grad", "norm", "value_zeroing", "alti")
VIEW_LAYERS = ("last", "all")


@dataclass(frozen=True)
class FaithfulnessOptions(AnalysisOptions):
    """The evaluation's own options (the corpus options — scope, batch size, max length,
    truncation, seed, progress, distributed, budget — are its
    :class:`~attnprobe.core.corpus_options.CorpusOptions`).

    Attributes:
        levels: distinct shares of the real tokens removed for comprehensiveness and sufficiency
            (each level removes at least one token and keeps at least one).
        removal: ``"delete"`` (cut the token out: ERASER and ferret, the default),
            ``"replace"`` (a filler token: the tokenizer's mask, else pad, else unk token) or
            ``"attention"`` (mask the token out of attention).
        fill: with ``replace``, the filler's role: ``"mask"``, ``"pad"`` or ``"unk"``
            (default: the first the tokenizer has).
        curve_steps: points of the deletion and insertion curves beyond ``k = 0`` (evenly
            spaced shares of the real tokens); ``None``: every count ``0..n``.
        view_layers: ``"last"`` scores a per-layer view at the last layer of the scope only
            (one source per view, the common choice); ``"all"`` at every layer of the scope.
        magnitude: rank attribution scores by ``|score|`` instead of the signed score (a
            token with a negative score pushes the output down, so the signed ranking removes
            it last).
        query: which attention row the views read (as in :func:`~attnprobe.compare`).
        n_steps: Integrated Gradients path points.
        sanity: run the model-randomisation check (Adebayo et al. 2018) on every source.
        randomize: with ``sanity``, how many of the top layers are re-initialised
            (default: the top half).
        sanity_threshold: a source whose mean Spearman correlation between its importance on
            the model and on the randomised copy is above this is flagged.
    """

    owner: ClassVar[str] = "faithfulness.evaluate()"

    levels: tuple[float, ...] = DEFAULT_LEVELS
    removal: str = "delete"
    fill: str | None = None
    curve_steps: int | None = 10
    view_layers: str = "last"
    magnitude: bool = False
    query: str | int = "auto"
    n_steps: int = 50
    sanity: bool = False
    randomize: int | None = None
    sanity_threshold: float = 0.5

    def __post_init__(self) -> None:
        if isinstance(self.levels, (str, bytes)) or not isinstance(self.levels, Iterable):
            raise InputError(f"levels must be a sequence of shares such as (0.1, 0.2); got "
                             f"{self.levels!r}")
        object.__setattr__(self, "levels", tuple(self.levels))
        # a repeated level would count twice in the AOPC (the mean over the levels)
        if len(set(self.levels)) != len(self.levels):
            raise InputError(f"a removal level is repeated: {self.levels}")
        for name in ("magnitude", "sanity"):
            if not isinstance(getattr(self, name), bool):
                raise InputError(f"{name} must be True or False; got {getattr(self, name)!r}")
        if self.removal not in KINDS:
            raise InputError(f"removal must be one of {', '.join(KINDS)}; got {self.removal!r}")
        if self.view_layers not in VIEW_LAYERS:
            raise InputError(f"view_layers must be one of {', '.join(VIEW_LAYERS)}; got "
                             f"{self.view_layers!r}")
        check_positive_ints("faithfulness", n_steps=self.n_steps, curve_steps=self.curve_steps,
                            randomize=self.randomize)
        if not -1 <= self.sanity_threshold <= 1:
            raise InputError(f"sanity_threshold must be a correlation in [-1, 1]; got "
                             f"{self.sanity_threshold!r}")


FAITHFULNESS_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(FaithfulnessOptions))
