"""The app's logic without the UI, one job per module; `app.py` at the repo root wires it to Gradio.

serving  the one shared model: start-up loading in the background, warm-up, threads, one pass at a time
session  a visitor's session and their runs' traces
sweep    one run per tau, compared with AR; several prompts as one batch per tau (the acceptance lab)
inputs   a visitor's inputs, checked with the core's checkers under the server's own caps
viz      text, HTML and charts (pure functions)
batch, batch_viz, tabs   the Batch tab (one batch on the block-level cache) and the paper checkpoints' list
accept_tab, accept_viz   the Acceptance tab (mars.evaluation.acceptance_lab in the page) and its charts
accept_inspect   a row of the Acceptance table's pass, decoded again for the Generate tab's inspector
"""
