"""MARS: multi-token generation from an ordinary causal LM (Mask AutoRegression).

Nothing heavy happens at import time: torch and transformers are imported by the
submodules that need them, and models load only when `mars.models.loading.load` is called.
"""

__version__ = "0.1.0"
