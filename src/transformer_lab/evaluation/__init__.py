"""Evaluation of trained models, one module per family; their scores go into the training run
they score (tracking/evaluations.py)."""
