"""Lightning modules: each wires a model to its loss, metrics and optimiser."""
