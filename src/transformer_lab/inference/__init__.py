"""Using trained models: pipeline() tasks, loading, export, predict, generate, few-shot."""
