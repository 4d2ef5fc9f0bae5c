"""The metric kinds, one module each, discovered by
:func:`~attnprobe.core.metric_kind.metric_kinds` (ordered by each module's ``RANK``).

A new kind is one module here calling :func:`~attnprobe.core.metric_kind.metric_kind` with
its :class:`~attnprobe.core.metric_kind.MetricKind`; the list of kinds is the registry
(``python -m attnprobe.readme`` writes it into the README).
"""
