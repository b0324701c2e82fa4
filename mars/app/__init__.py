"""The app's logic without the UI, one job per module; `app.py` at the repo root wires it to Gradio.

serving  the one shared model: start-up loading in the background, warm-up, threads, one pass at a time
session  a visitor's session and their runs' traces
sweep    one run per tau, compared with AR
Input checks live in `mars.app_inputs`; text, HTML and charts in `mars.viz`.
"""
