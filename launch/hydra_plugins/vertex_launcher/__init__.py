"""A Hydra launcher that runs every job of a sweep as a Vertex AI CustomJob: ``hydra/launcher=vertex``."""

__version__ = "0.1.0"
