"""Texts in, model inputs out: the one path every corpus analysis takes from texts (strings or
token ids) to padded batches (:mod:`~attnprobe.inputs.text`), the most tokens a model takes
(:mod:`~attnprobe.inputs.length_limit`), token ids as given
(:mod:`~attnprobe.inputs.token_ids`), and a corpus prepared once for a chain of analyses
(:mod:`~attnprobe.inputs.prepared`)."""
