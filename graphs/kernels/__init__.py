"""Numerical kernels the stages call: Bloom filters, quantization, METIS and coarsening, edge keys, id codes, negative sampling."""
