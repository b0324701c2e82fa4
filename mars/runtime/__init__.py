"""What runs the model: the backends (transformers, the lean CPU path, its int8 matrices, the fixed-shape
CUDA-graph path), the C kernels (csrc/) and CPU feature probing. It never decides what is accepted and never
imports `mars.decoding`."""
