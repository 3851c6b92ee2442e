"""The file formats between stages: one owner per stage folder (its file names, version and summary), the shard format and manifest, DGL's distributed format, and the array file codecs."""
