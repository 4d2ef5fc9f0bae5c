"""Label rules beyond the built-in ones of :mod:`attnprobe.heads.labels`, one module each:
every module here is imported when the labels are (:func:`attnprobe.heads.labels.
discover_rules`), so a new label is one module here with its ``@rule(...)`` entry — its rank,
family, colour, the thresholds it reads (with their defaults) and its README phrase — plus its
test. Nothing else names it."""
