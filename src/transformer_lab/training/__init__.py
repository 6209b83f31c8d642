"""The training run: the Trainer and what it is handed (callbacks, strategies, baselines)."""
