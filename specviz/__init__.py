"""specviz: see speculative decoding work."""

__version__ = "0.1.0"
