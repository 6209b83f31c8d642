"""transformer-lab: from raw data to trained, evaluated and compared transformer models.

    from transformer_lab import pipeline
    pipeline("text-classification", model="artifacts/bert/sentiment")("a gripping film")
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    # `pipeline` imports torch and the models: only when asked for, so `import transformer_lab` stays light
    if name == "pipeline":
        from transformer_lab.inference.pipeline import pipeline

        return pipeline
    raise AttributeError(f"module 'transformer_lab' has no attribute {name!r}")
