"""The decoder core: one generator (`decoding.decode_steps`) for MARS, AR, verified and Jacobi decoding,
batch 1 and batches, on a block-level KV cache. No UI, no training, no files: the app, the CLI, the bench
and the evaluation all read its `records`."""
