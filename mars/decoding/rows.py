"""A row's text on the host: its token ids, the text decoded so far and why it finished, and how a pass's
accepted run is taken into it (cut after a stop string first).

The host loop (mars.decoding.decoder) and the device step's host side (mars.decoding.device_loop) both keep
their rows here, so a stop string cuts and a pass's text piece reads the same on either path; the decoder
imports the device loop, so this is the one place both can import."""

from __future__ import annotations


class RowText:
    """What the host keeps of a row: its prompt and generated ids, their text and its finish reason."""

    def __init__(self, index: int, prompt: list[int]):
        self.index = index
        self.tokens = list(prompt)
        self.n_prompt = len(prompt)
        self.text = ""
        self.finish_reason: str | None = None

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.n_prompt:]


def cut_at_stop(tok, row: RowText, props: list[int], n: int, stops: tuple[str, ...], reason):
    """Cut the accepted run right after the token that completes a stop string."""
    if not stops or n == 0:
        return n, reason
    base = row.generated
    for k in range(1, n + 1):
        text = tok.decode(base + props[:k], skip_special_tokens=True)
        tail = text[max(0, len(row.text) - max(len(s) for s in stops)):]
        if any(s in tail for s in stops):
            return k, "stop"
    return n, reason


def take(tok, row: RowText, props: list[int], n: int, stops: tuple[str, ...], reason) -> tuple[int, str | None, str]:
    """Take the first n proposals (already cut at EOS and the length limit) into the row, cut after a stop
    string first; return (how many were taken, the row's finish reason, the text they added).

    The text is the whole answer decoded again, not the new ids alone: a multi-byte character split across
    two passes then reads right; where decoding again changed earlier text, the piece is all of it."""
    n, reason = cut_at_stop(tok, row, props, n, stops, reason)
    row.tokens.extend(props[:n])
    new_text = tok.decode(row.generated, skip_special_tokens=True)
    piece = new_text[len(row.text):] if new_text.startswith(row.text) else new_text
    row.text = new_text
    row.finish_reason = reason
    return n, reason, piece
