"""Perturbation experiments: change attention weights (or a head's output) and measure how
much the model's output cares.

Modules: ``interventions`` (one registry of small parameter objects: permute, uniform, zero,
mean-ablate, erase, Dirichlet re-draw), ``context`` (apply one inside a context that restores
the model and verifies it took effect), ``measures`` (output and attention change),
``adversarial`` (the most different attention that keeps the output within ε), ``importance``
(Michel et al.'s head importance and the pruning curve) and ``run`` (the experiments as tidy
tables).
"""
