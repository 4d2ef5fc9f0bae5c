"""Hook-based capture and editing of attention (one seam for every kind of model)."""

from attnprobe.capture.context import Capture, capture
from attnprobe.capture.hook_point import HookPoint
from attnprobe.capture.hooks import count_hooks, hook_point_paths
from attnprobe.capture.sites import Site

__all__ = ["Capture", "HookPoint", "Site", "capture", "count_hooks", "hook_point_paths"]
