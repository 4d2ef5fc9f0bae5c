"""Causal experiments on heads with a clean and a corrupted input: activation patching
(:func:`heads`), path patching (:func:`path`) and attribution patching (:func:`attribution`),
all through the capture seam (SDPA kept on the layers a forward does not patch), batched many
patches per forward, on the shared corpus signature (``distributed=`` included).

- :func:`heads` — each head's output / pattern / q / k / v from the other run
  (:mod:`attnprobe.patch.activation`);
- :func:`residual` / :func:`mlp` — the residual stream (``resid_pre`` / ``resid_mid`` /
  ``resid_post``) or the MLP output of each layer × position from the other run
  (:mod:`attnprobe.patch.stream_patching`, sites: :mod:`attnprobe.patch.stream`);
- :func:`path` — each sender's output reaching only the receivers' q / k / v
  (:mod:`attnprobe.patch.paths`);
- :func:`attribution` — the gradient estimate of :func:`heads` for every head (× position)
  from two forwards and one backward; :func:`agreement` correlates it with a real run;
- :func:`summary` — the mean effect per head (with ``ci=``: bootstrap confidence intervals,
  :mod:`attnprobe.patch.bootstrap`), as :func:`attnprobe.plot.patching_effect`
  draws it; :func:`run` — any registered experiment by name (:data:`EXPERIMENTS`).

Definitions: [causal methods](../guide/causal-methods.md); the table:
:mod:`attnprobe.patch.table`; which models serve which sites: :mod:`attnprobe.patch.sites`.

Example (``ref:induction``: a segment, then the segment again; the corrupted input has another
first half, so only the clean one can be continued by copying):

    >>> model, tok = ap.load_model("ref:induction")
    >>> clean = "t05 t11 t40 t03 t17 t42 t08 t55 t05 t11 t40 t03 t17 t42 t08 t55"
    >>> corrupt = "t60 t61 t62 t63 t01 t02 t04 t06 t05 t11 t40 t03 t17 t42 t08 t55"
    >>> copies = list(range(9, 16))  # the second copy ([BOS] is position 0)
    >>> table = ap.patch.heads(model, tok, [clean], [corrupt], "logit:next",
    ...                        metric_positions=copies)
    >>> ap.patch.summary(table).sort_values("effect", ascending=False).head(3)
"""

from attnprobe.patch.attribution_patching import Agreement, agreement
from attnprobe.patch.block_patching import mlp, residual
from attnprobe.patch.experiments import (
    EXPERIMENTS,
    attribution,
    heads,
    params_of,
    path,
    run,
)
from attnprobe.patch.sites import SITES
from attnprobe.patch.stream import STREAM_SITES
from attnprobe.patch.table import COLUMNS, PATH_COLUMNS, summary

__all__ = ["COLUMNS", "EXPERIMENTS", "PATH_COLUMNS", "SITES", "STREAM_SITES", "Agreement",
           "agreement", "attribution", "heads", "mlp", "params_of", "path", "residual", "run",
           "summary"]
