"""A fake Hugging Face Hub on 127.0.0.1: the model-info API answers with the file sizes and parameter counts
a test gives; every request is recorded, so a test can show that nothing was downloaded (no `/resolve/`).

The real `huggingface_hub.HfApi(endpoint=...)` talks to it, so the app's sizing reads the Hub's real JSON
shape through the real client, with no network.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GB = 10 ** 9


class FakeHub:
    def __init__(self, models: dict[str, dict]):
        """models: repo id -> {"files": {filename: bytes}, "params": int or None}."""
        self.models = models
        self.requests: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                hub.requests.append(self.path)
                path = self.path.split("?")[0]
                prefix = "/api/models/"
                repo = path[len(prefix):].split("/revision/")[0] if path.startswith(prefix) else None
                model = hub.models.get(repo)
                if model is None:
                    self.send_response(404)
                    self.send_header("content-type", "application/json")
                    self.send_header("x-error-code", "RepoNotFound")
                    self.end_headers()
                    self.wfile.write(b'{"error": "Repository not found"}')
                    return
                body = {"id": repo, "modelId": repo, "sha": "0" * 40, "private": False,
                        "siblings": [{"rfilename": f, "size": n} for f, n in model["files"].items()]}
                if model.get("params"):
                    body["safetensors"] = {"parameters": {"BF16": model["params"]}, "total": model["params"]}
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def model_info(self, repo_id: str):
        """What the app's policy calls (Policy.hub_info): the real client, pointed here."""
        from huggingface_hub import HfApi

        return HfApi(endpoint=self.url, token=False).model_info(repo_id, files_metadata=True, timeout=10)

    @property
    def downloads(self) -> list[str]:
        return [p for p in self.requests if "/resolve/" in p]

    def close(self):
        self.server.shutdown()
        self.server.server_close()
