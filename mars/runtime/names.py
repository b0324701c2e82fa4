"""The names a user may pick for what runs the model and where, with nothing imported: the settings check
them (mars.settings), the backends and the device setting act on them."""

# what runs the model (mars.runtime.backends says what each one is)
RUNNERS = ("auto", "fast", "hf", "fast-bf16", "fast-int8", "auto-int8", "static")
# and the device step (a whole decoding step on the device, mars.decoding.device_step): the decoder, the CLI and
# the bench take it; a server does not (MARS_BACKEND: the app's inspector and lookup drafts run on the host)
BACKENDS = RUNNERS + ("static-device",)
# where it runs (mars.models.device): auto is CUDA when present
DEVICES = ("auto", "cpu", "cuda")
