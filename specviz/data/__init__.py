"""Package data: the shipped prompts, traces and the fitted acceptance model, found with importlib.resources."""
