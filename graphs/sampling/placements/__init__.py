"""The built-in placements (minibatch_shards' ``placement``), one module each;
`graphs.sampling.placement` imports every module here on its first lookup, so a new strategy is a
new module in this folder."""
