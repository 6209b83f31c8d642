"""Kept for models logged before inference/served.py took this module's place: their logged code
(`from transformer_lab.serving import PipelineModel`) still loads. New code imports inference.served."""

from transformer_lab.inference.served import PipelineModel  # noqa: F401
