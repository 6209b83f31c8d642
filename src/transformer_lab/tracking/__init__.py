"""MLflow: runs, the model registry, serving records, the team server, sweep records."""
