"""One run path for every surface: validate -> take the pair's lock -> engine -> typed results.

No Gradio here. The app (`ui`), the JSON API (`api`) and the CLI are thin adapters over these plain
generators of dataclasses: `decode` and `step` (Traces), `race` (RaceStates), `sample_distribution`
(DistributionResults) and `replay` (Traces, RaceStates). Closing a generator cancels the run.
"""
