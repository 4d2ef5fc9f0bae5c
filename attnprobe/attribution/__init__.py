"""Attention versus gradient attributions: Captum adapters, attention-derived importance and
the agreement between them.

Modules: ``targets`` (what is explained: a class, a logit, a similarity, a next token),
``methods`` (gradient and perturbation attributions), ``views`` (importance read off the
attention: raw rows, rollout, flow, attention × gradient, norms), ``metrics`` (rank and
distribution agreement) and ``compare`` (all of it over a corpus, as tidy tables).
Captum and transformers are imported when a function needs them.
"""
