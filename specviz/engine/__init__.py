"""The engine: sampling warps, the accept/reject rule, the round loop, the AR baseline, events."""

from specviz.engine.autoregressive import autoregressive_generate
from specviz.engine.config import DecodeConfig
from specviz.engine.events import Round, Step
from specviz.engine.sampling import SamplingParams
from specviz.engine.speculative import speculative_generate

__all__ = ["DecodeConfig", "Round", "SamplingParams", "Step", "autoregressive_generate", "speculative_generate"]
