"""Hook-based capture and editing of attention (one seam for every kind of model), and the
text -> batch path every corpus analysis shares.

- :func:`capture` — the context manager: a model, a scope, and opt-in parts
  (:mod:`attnprobe.capture.parts`);
- :func:`extract` / :func:`head_stats` — texts in, maps or streaming statistics out;
  ``extract(..., generate=N)`` / :func:`generate_maps` — prompts continued by a causal LM, one
  map over prompt + generated tokens each (:mod:`attnprobe.capture.generation`); a capture
  around ``model.generate`` folds the KV-cache steps the same way
  (:mod:`attnprobe.capture.steps`);
- :mod:`attnprobe.inputs.text` — texts to padded batches (pairs, truncation, devices).
"""

from attnprobe.capture.calls import BatchPatterns
from attnprobe.capture.context import Capture, capture
from attnprobe.capture.corpus import extract, head_stats
from attnprobe.capture.generation import Generated, generate_maps
from attnprobe.capture.hooks import count_hooks, hook_point_paths
from attnprobe.capture.info import attention_sizes, model_info, model_scope
from attnprobe.capture.parts import Activations, Keep, Live, Part, Reduce, Scores, Values
from attnprobe.capture.rewrites import (
    Edit,
    EditKey,
    EditOutput,
    EditQuery,
    EditValue,
    Knockout,
)
from attnprobe.capture.sites import Site
from attnprobe.core.hook_point import HookPoint

__all__ = [
    "Activations",
    "BatchPatterns",
    "Capture",
    "Edit",
    "EditKey",
    "EditOutput",
    "EditQuery",
    "EditValue",
    "Generated",
    "HookPoint",
    "Keep",
    "Knockout",
    "Live",
    "Part",
    "Reduce",
    "Scores",
    "Site",
    "Values",
    "attention_sizes",
    "capture",
    "count_hooks",
    "extract",
    "generate_maps",
    "head_stats",
    "hook_point_paths",
    "model_info",
    "model_scope",
]
