"""What the analysis scripts share (not part of the attnprobe library): writing a run folder
with its provenance (:mod:`.runs`) and side-by-side timing for benchmarks (:mod:`.benchmarking`).

Scripts run as ``python analyses/<name>.py`` import it as ``harness`` (their folder is first on
``sys.path``); the tests put ``analyses/`` on the path the same way.
"""
