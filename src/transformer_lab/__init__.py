"""transformer-lab: from raw data to trained, evaluated and compared transformer models."""

__version__ = "0.1.0"
