"""Numbers from events, shared by the bench and the app: statistics, the speedup model, divergence, distributions."""
