"""The built-in layer types (``model.conv``), one module each: the ``nn.Module`` (DGL's
computation and parameter names, over a `training.blocks.Block`) and its registered
`training.layer_registry.LayerKind`. `training.layer_registry` imports every module here on its
first lookup, so a new layer is a new module in this folder (docs/extending.md)."""
