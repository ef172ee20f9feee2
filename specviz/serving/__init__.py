"""What serves runs to many people on one loaded pair: the session (the pair, its lock and its one model thread:
`session`, `model_thread`), whose turn it is (`turns`, with `hosts` for who is local), recordings of finished runs
(`recorded`) and the pace a run's events are shown at (`pacing`). Below the run paths, which take their turn and
their pair from here; it imports no run path and no adapter."""
