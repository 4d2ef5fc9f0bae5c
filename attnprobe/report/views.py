"""Every notebook view of the report floor: importing this module registers them all in
:data:`attnprobe.core.html_view.RENDERERS` (it is the registry's ``PROVIDER``). A module of
views is one import here."""

from attnprobe.report import (  # noqa: F401 - they register on import
    circuit_views,
    faithfulness_views,
    notebook,
    patching_views,
)
