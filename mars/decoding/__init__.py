"""The decoding algorithm: one generator (`decoder.decode_steps`) for MARS, AR, verified and Jacobi decoding,
single prompts and batches, on a block-level KV cache; the modes, the draft tree, the acceptance rule, every
attention mask, the cache's bookkeeping, the drafts (n-gram lookup, a datastore table handed in) and the run
records. No C, no file reads, no training: what runs the model is `mars.runtime`, passed in or made by name."""
