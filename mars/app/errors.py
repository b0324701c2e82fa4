"""The app's two kinds of error on the page, and what each leaves in the server log.

Gradio prints a traceback for every `gr.Error` a handler raises (print_exception=True by default): ~37 lines in
the log for an empty prompt, 770 for twenty ordinary typos, burying the failures that matter. So:

- `visitor_error(message)`: input the app refuses (empty prompt, too long, out of range, no mask token...): the
  message on the page, nothing in the log. Every handler raises these through here.
- `failure_error(e, what)`: something that should not happen: its own traceback (the real one, where it failed)
  goes to the log once, through the logger, and the visitor reads one sentence. Gradio's own print would show
  only the `raise gr.Error(...) from None` line and its internals, not the frames that failed.
"""

from __future__ import annotations

import logging

import gradio as gr

LOG = logging.getLogger("mars.app")


def visitor_error(message) -> gr.Error:
    """A `gr.Error` for input the app refuses: shown to the visitor, not printed in the log. `message`: text, or
    the ValueError (or any exception) whose text it is."""
    return gr.Error(str(message), print_exception=False)


def failure_error(e: BaseException, what: str, prefix: str = "The run failed") -> gr.Error:
    """A `gr.Error` for an unexpected failure `e` (call inside its `except`): the traceback is logged under
    `what`, the visitor reads `prefix: Type: message`; out of GPU memory is one logged line and one sentence."""
    from mars.models.device import is_oom, oom_message

    if is_oom(e):
        LOG.warning("%s: out of GPU memory", what)
        return gr.Error(f"{prefix}: " + oom_message("try fewer new tokens or a shorter prompt, or wait for other "
                                                     "runs"), print_exception=False)
    LOG.error(what, exc_info=e)
    return gr.Error(f"{prefix}: {type(e).__name__}: {e}", print_exception=False)
