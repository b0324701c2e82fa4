"""The backends' faster scoring of CPU float32 logits: greedy p(token) and the top-k, one C call each
(mars.runtime.kernels). The decoder's acceptance functions (mars.decoding.acceptance) take it as `scoring` and
fall back to torch ops wherever a call returns None (a GPU's logits, another dtype, no C build)."""

from __future__ import annotations

import torch


class CScoring:
    """argmax_conf(logits) -> (tokens, p(token)) | None; top_probs(logits, k) -> (probabilities, tokens) | None."""

    @staticmethod
    def argmax_conf(logits: torch.Tensor):
        from mars.runtime.kernels import argmax_conf  # built on first use

        return argmax_conf(logits)

    @staticmethod
    def top_probs(logits: torch.Tensor, k: int):
        from mars.runtime.kernels import top_probs

        return top_probs(logits, k)


C_SCORING = CScoring()
