"""What a load raises: every caller (app, CLI, bench) prints its message as it stands."""


class LoadError(RuntimeError):
    """A model, tokenizer or adapter could not be loaded; the message names what was tried."""


class AdapterError(LoadError):
    """The base model is fine but the adapter is missing or does not fit it (an app may run the bare model)."""
