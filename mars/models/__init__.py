"""What gets loaded: the embedded default model, any transformers causal LM, MARS adapters, the paper's
published checkpoints (`loading.load`, `hub.load_checkpoint`)."""
