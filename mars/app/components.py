"""Gradio components the app uses in place of Gradio's own, where Gradio's behaviour is not what a visitor needs.

`ClampedSlider`: Gradio checks a slider's value on the server (Slider.preprocess) and refuses one outside its
range: 9999 typed into the pass inspector's box after a run of 67 passes read "Value 9999 is greater than maximum
value 66." in a red toast, and left a traceback in the server log. This slider takes the nearest end instead
(9999: the last pass). Drawn by Gradio's own slider (`is_template`). Gradio writes a stub of this module beside
it (components.pyi, git-ignored) when it is imported, as for any component class.
"""

from __future__ import annotations

import gradio as gr


class ClampedSlider(gr.Slider):
    is_template = True  # the page draws it with Gradio's slider (Block.get_block_name: the base class's name)

    def preprocess(self, payload):
        low, high = self.minimum, self.maximum
        if isinstance(payload, (int, float)) and not isinstance(payload, bool) and not low <= payload <= high:
            payload = low if payload != payload else min(max(payload, low), high)  # NaN (a raw client's): the start
        return super().preprocess(payload)
