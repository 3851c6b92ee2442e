"""The built-in edge partitioners (metis_partitions' ``vertex_cut``), one module each;
`graphs.stages.vertex_cut` imports every module here on its first lookup, so a new one is a new
module in this folder."""
