"""Loading draft/target pairs (the embedded default, hub ids, local folders, GGUF files) and cheaper drafts."""

from specviz.models.loading import load_pair, load_spec
from specviz.models.pair import EMBEDDED, ModelLoadError, ModelPair, PairSpec
from specviz.models.prompting import encode_prompt

__all__ = ["EMBEDDED", "ModelLoadError", "ModelPair", "PairSpec", "encode_prompt", "load_pair", "load_spec"]
