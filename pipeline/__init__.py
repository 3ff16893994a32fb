"""uniter-pipeline: stages and the data library for UNITER-style V+L pretraining."""

__version__ = "0.1.0"
