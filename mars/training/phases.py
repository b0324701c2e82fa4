"""Where a training step's time goes: wall time split into named phases, as data for the train log.

Phases (mars.training.train): `data` (waiting for the next batch: building its layout when no DataLoader
worker does, and its copy to the device), `forward_backward`, `optimizer` (clip, step, schedule, zero) and
`other` (loss bookkeeping, logging, checkpoints). On CUDA the work is queued, so each mark first waits for
the device (`sync`): the phases then add up to the wall time and `data` is time the GPU sat idle waiting
for the host. The waits cost a little overlap; that is the price of knowing.
"""

from __future__ import annotations

import time
from typing import Callable

PHASES = ("data", "forward_backward", "optimizer", "other")


class PhaseTimer:
    def __init__(self, sync: Callable[[], None] | None = None, clock: Callable[[], float] = time.perf_counter):
        self.sync = sync or (lambda: None)
        self.clock = clock
        self.last = clock()
        self.open: dict[str, float] = dict.fromkeys(PHASES, 0.0)  # since the last `take`
        self.total: dict[str, float] = dict.fromkeys(PHASES, 0.0)  # since the start

    def mark(self, phase: str) -> None:
        """The time since the previous mark was spent in `phase`."""
        if phase not in self.open:
            raise ValueError(f"unknown phase {phase!r}; one of {PHASES}")
        self.sync()
        now = self.clock()
        self.open[phase] += now - self.last
        self.total[phase] += now - self.last
        self.last = now

    def take(self) -> dict[str, float]:
        """Seconds per phase since the last take (one optimizer step's worth), then start again."""
        out = {k: round(v, 4) for k, v in self.open.items()}
        self.open = dict.fromkeys(PHASES, 0.0)
        return out


def throughput(rows: list[dict], skip: int = 1) -> dict:
    """Sequences per second and each phase's share of the time, from train log rows (`step`, `seconds`,
    `sequences`, `phases`), leaving out the first `skip` steps (one-off costs: kernels, allocator, workers)."""
    rows = [r for r in rows if "phases" in r]
    if len(rows) <= skip:
        raise ValueError(f"need more than {skip} logged steps with phases, got {len(rows)}")
    first, last = rows[skip - 1]["sequences"] if skip else 0, rows[-1]["sequences"]
    kept = rows[skip:]
    phase = {k: sum(r["phases"].get(k, 0.0) for r in kept) for k in PHASES}
    seconds = sum(phase.values())  # the kept steps' wall time (the phases add up to it)
    sequences = last - first
    steps = len(kept)
    return {"steps": steps, "sequences": sequences, "seconds": round(seconds, 3),
            "sequences_per_s": round(sequences / seconds, 2) if seconds > 0 else None,
            "steps_per_s": round(steps / seconds, 3) if seconds > 0 else None,
            "ms_per_step": {k: round(1000 * v / steps, 1) for k, v in phase.items()},
            "share": {k: round(v / seconds, 3) if seconds else None for k, v in phase.items()}}
