"""What runs the device step (mars.decoding.device_step): a static KV buffer whose rows sit at their own cache
lengths, the model's fixed-shape pass over it, and one CUDA graph per whole decoding step.

The decoding hands over a step as a callable over tensors it owns (its state and its output ring); this module
only runs it: on CUDA the first call of each key (mode, batch bucket, width) runs the step once on a side stream
(the warm-up: it IS that step, so the state moves on exactly once) and captures it; every later call replays the
graph, one launch for the pass, the scoring, the acceptance and the commit. Elsewhere (the CPU) the step runs
eagerly: the same tensor ops, which the tests check token for token against the host loop.

Unlike mars.runtime.static.StaticBackend, columns are per row: row r's token at position p has its KV at
column p (no left padding), so rows never wait for each other at cache-block ends. Columns [capacity,
capacity + scratch) take what is never kept (masks, padding, a finished row's window), one column per slot.
"""

from __future__ import annotations

import torch

from mars.runtime.static import BATCHES, bucket, static_model


class StepRunner:
    """The runner `mars.decoding.device_loop` drives: `forward` (the pass, tensors in, logits out) and `run`
    (one whole step, captured per key on CUDA)."""

    def __init__(self, model, batch: int, capacity: int, scratch: int):
        self.slm = static_model(model)
        f = self.slm.fast
        self.device = f.device
        self.batch = bucket(batch, BATCHES) or batch  # finished and padding rows keep their slots
        self.capacity, self.scratch = capacity, scratch
        shape = (f.n_layers, self.batch, f.n_kv, capacity + scratch, f.head_dim)
        with torch.inference_mode():
            # zeros, not empty: a masked key's weight is exactly 0, but 0 * NaN from stale memory is NaN
            self.k = torch.zeros(shape, dtype=f.dtype, device=self.device)
            self.v = torch.zeros(shape, dtype=f.dtype, device=self.device)
        self.mask_token_id = self.slm.mask_token_id
        self.max_positions = self.slm.max_positions
        self.graphs_on = self.device.type == "cuda"
        # the decoder queues the next steps before it builds the last ones' records where the device runs apart
        self.asynchronous = self.graphs_on
        self._graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self._pool = None

    def forward(self, ids, positions, allowed, cols, gated: bool) -> torch.Tensor:
        """ids, positions, cols (b, W) long, allowed (b, W, capacity + scratch) bool, all on the device;
        float32 logits (b, W, V). Writes the window's KV at `cols`."""
        gated = gated and self.mask_token_id is not None  # no gated adapter: masks are plain inputs
        return self.slm.run_step(ids, positions, allowed, cols, self, gated)

    def run(self, key: tuple | None, step) -> None:
        """One decoding step `step()` (it reads and writes only tensors that live as long as the run); key None:
        never captured."""
        with torch.inference_mode():
            if not self.graphs_on or key is None:  # key None: a step of its own width (the prefill), run once
                step()
                return
            graph = self._graphs.get(key)
            if graph is not None:
                graph.replay()
                return
            # NOT exercised on the CPU machines this was written on: the GPU session checks it
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                step()  # warm-up (lazy initialisation, cuBLAS workspaces): this step's real run
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            # capture records without running: the next call's replay is the next step
            with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                step()
            self._graphs[key] = graph


def make_step_runner(model, cfg, batch: int, capacity: int, scratch: int) -> StepRunner:
    """The decoder's default device-step runner (mars.runtime.backends.make_step_runner calls this)."""
    return StepRunner(model, batch, capacity, scratch)
