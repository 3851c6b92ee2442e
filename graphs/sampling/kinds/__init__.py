"""The built-in samplers, one module each; `graphs.sampling.registry` imports every module
here on its first lookup, so a new sampler is a new module in this folder (docs/extending.md)."""
