"""Pure nn.Modules: one attention and one block, and every model built from them (no Lightning, Hydra or MLflow)."""
