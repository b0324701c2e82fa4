"""A visitor's session (their live tau, their run's control, their last runs) and how a run streams to it; and
`TabSession`, the state of a tab that runs one job at a time and offers its files (the Batch and Acceptance tabs)."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from mars.decoding.decoder import DecodeConfig, DecodeControl, check_tau
from mars.decoding.records import RunRecord


def _pieces(tokenizer, ids: list[int], skip_special_tokens: bool = False) -> list[str]:
    """Each token's text, cut so that the pieces join into the decoded whole (spaces of word-level
    tokenizers, characters split across byte-level tokens); decoding each token alone does neither.
    skip_special_tokens: special tokens' pieces are empty (one piece per id still)."""
    out, prev = [], ""
    for i in range(len(ids)):
        text = tokenizer.decode(ids[: i + 1], skip_special_tokens=skip_special_tokens)
        out.append(text[len(prev):] if text.startswith(prev) else text)
        prev = text
    return out


def settings_of(cfg: DecodeConfig) -> dict:
    return {"mode": cfg.mode, "tau": cfg.tau, "block_size": cfg.block_size,
            "max_new_tokens": cfg.max_new_tokens, "confidence": cfg.confidence, "backend": cfg.backend,
            "drafts": cfg.drafts, "tree_nodes": cfg.tree_nodes, "datastore": cfg.datastore}


def run_stream(holder, lm, prompt: str, prompt_ids, cfg, control) -> Iterator[RunRecord]:
    """Yield the growing run record after every pass (each pass's token texts filled in for the view);
    the last yield is the finished record. The row is queued for the model now, not at the first read: a race's
    two rows then join the same pass (mars.app.batching)."""
    return _grow(lm, RunRecord(cfg, list(prompt_ids), prompt=prompt), holder.passes(lm, prompt_ids, cfg, control),
                 control)


def _grow(lm, run: RunRecord, passes, control) -> Iterator[RunRecord]:
    try:
        for rec in passes:
            rec.token_texts = [lm.tokenizer.decode([t]) for t in rec.token_ids]
            # the struck drafts read as text, as the answer does: a lookup copy of the prompt's chat template
            # (`<|im_end|>`, `<|im_start|>`) is no text the model could have written there
            rec.rejected_texts = _pieces(lm.tokenizer, rec.rejected_token_ids, skip_special_tokens=True)
            yield run.add(rec)
    finally:
        passes.close()  # a reader that leaves early takes its row out of the model's passes
    yield run.finish(cancelled=control.cancelled)


def trace_json(run: RunRecord) -> dict:
    """A run as the app's API and trace download give it: RunRecord.to_dict (the project's one vocabulary:
    `passes` the count, `steps` one record per pass), plus the mode, prompt and settings."""
    return {"mode": run.config.mode, "prompt": run.prompt, "settings": settings_of(run.config)} | run.to_dict()


@dataclass
class Session:
    """One visitor's state (lives in a gr.State): their live tau, their run's control, their last runs."""

    tau: float = 0.9
    control: DecodeControl | None = None
    mars: RunRecord | None = None
    ar: RunRecord | None = None
    tokenizer: object = field(default=None, repr=False)  # the last run's own, for the inspector
    files: dict = field(default_factory=dict)

    follow_tau: bool = True  # False while a sweep runs: its tau values are fixed per run

    def new_control(self, tau: float | None = None) -> DecodeControl:
        """The control of a new run. With tau (the run's config's, already checked) the run follows the
        visitor's slider from there on; without, each run keeps its config's tau (a sweep)."""
        if self.control is not None:
            self.control.cancel()  # a new run supersedes an old one still going
        self.follow_tau = tau is not None
        self.tau = self.tau if tau is None else tau
        self.control = DecodeControl(tau)
        return self.control

    def set_tau(self, tau) -> None:
        """The visitor's tau, and the running generation's; checked once, by the core's check_tau."""
        if self.control is not None and self.follow_tau:
            self.control.tau = tau  # checked there; the decoder reads it before its next forward pass
            self.tau = self.control.tau
        else:
            self.tau = check_tau(tau)  # no run follows the slider now: the next run starts from it

    def stop(self) -> None:
        if self.control is not None:
            self.control.cancel()

    def clear(self) -> None:
        """End any run and forget the runs (the Clear button). The run's control is dropped too: a run writes
        into the session and the page only while its control is the session's (`app.generate`), so a run cut
        off here, between two of its passes, sends nothing more over the page just cleared."""
        self.stop()
        self.control = None
        self.mars = self.ar = None

    def close(self) -> None:
        """Gradio's delete_callback, once the visitor has gone: end any run, delete the run's files."""
        self.stop()
        folder = self.files.get("folder")
        if folder:
            shutil.rmtree(folder, ignore_errors=True)
        self.files = {}


@dataclass
class TabSession:
    """One visitor's state in a tab that runs one job at a time and offers its files for download (a gr.State,
    with `close` as its delete_callback): the running job's control and the folder of its files."""

    control: DecodeControl | None = None
    folder: str | None = None

    def stop(self) -> None:
        if self.control is not None:
            self.control.cancel()

    def close(self) -> None:
        """Gradio's delete_callback, once the visitor has gone: end any job, delete its files."""
        self.stop()
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)
        self.folder = None

    def new_folder(self, prefix: str) -> Path:
        """A fresh folder for the job's files; the previous job's is deleted (a visitor keeps one set)."""
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)
        folder = Path(tempfile.mkdtemp(prefix=prefix))
        self.folder = str(folder)
        return folder
