"""Loading draft/target pairs: the embedded default, hub ids, local folders, GGUF files."""

from specviz.models.loading import EMBEDDED, ModelLoadError, ModelPair, load_pair
from specviz.models.prompting import encode_prompt

__all__ = ["EMBEDDED", "ModelLoadError", "ModelPair", "encode_prompt", "load_pair"]
