"""Figures from result objects and tidy tables (seaborn + matplotlib; the ``report`` extra).

Every function takes a result object or the tidy table it gives, draws into a new matplotlib
``Figure`` (or into ``ax=`` and returns that Axes), and never shows it, opens a pyplot window
or changes global matplotlib state; save it with ``fig.savefig("heads.svg")``. matplotlib and
seaborn are imported on first use (a missing extra is an error naming ``attnprobe[report]``).

==========================  ===================================================================
function                    draws (from)
==========================  ===================================================================
:func:`attention_head`      one head: query × key heatmap with the tokens (AttentionMap / table)
:func:`model_view`          every head as a small heatmap, layers × heads (AttentionMap / table)
:func:`head_grid`           layer × head cells coloured by label (Census / ``classify()``)
:func:`layer_profile`       label shares per layer, stacked bars (Census / ``classify()`` /
                            ``layer_profile()``)
:func:`offset_profile`      attention mass per relative offset, per head (Census / ``offsets()``)
:func:`syntax_accuracy`     best head vs best fixed offset per relation (Census / ``syntax()``)
:func:`head_clusters`       heads at their MDS coordinates, coloured by label (Census /
                            ``clusters()``)
:func:`agreement_by_layer`  attention vs attribution per layer, a line per view (Comparison /
                            ``summary()`` / ``table``)
:func:`token_heat`          scores on the tokens, a row per method or view (Comparison /
                            TokenAttributions / their table)
:func:`head_effects`        mean change per head of a perturbation, layer × head heatmap
                            (``perturb.run`` table)
:func:`pruning_curve`       output metrics vs heads pruned (``perturb.run`` importance table)
:func:`patching_effect`     mean normalised effect per patch, layer × head (heads × position
                            for ``positions="each"``) (``patch.heads`` / ``path`` /
                            ``attribution`` table)
:func:`generation_attention`  what the step that wrote each token attended to, and its share
                            on the prompt (AttentionMap from ``extract(..., generate=N)``)
:func:`logit_attribution`   each head's direct part of a metric (layer × head) and the
                            component groups as bars (LogitAttribution / its table)
:func:`composition`         Q/K/V-composition, writer heads × reader heads per kind
                            (Composition / its table)
==========================  ===================================================================
"""

from attnprobe.plot.attention import attention_head, model_view
from attnprobe.plot.attribution import agreement_by_layer, token_heat
from attnprobe.plot.circuits import composition, logit_attribution
from attnprobe.plot.generation import generation_attention
from attnprobe.plot.heads import head_clusters, head_grid, layer_profile
from attnprobe.plot.offsets import offset_profile
from attnprobe.plot.patching import patching_effect
from attnprobe.plot.perturbation import head_effects, pruning_curve
from attnprobe.plot.syntax import syntax_accuracy

__all__ = ["agreement_by_layer", "attention_head", "composition", "generation_attention",
           "head_clusters", "head_effects", "head_grid", "layer_profile", "logit_attribution",
           "model_view", "offset_profile", "patching_effect", "pruning_curve", "syntax_accuracy",
           "token_heat"]
