"""gnnflow's graph library: formats, ingest, normalization, partitioning, compression, sampling.

DGL reads its tensor backend from ``DGLBACKEND`` when it is first imported; gnnflow's is
PyTorch. It is set here, once, because every DGL user (the partitioning and sampling
modules here, and `training.aggregate`, which imports this package first) imports
``graphs`` before DGL. An explicit setting in the environment wins.
"""

import os

DGL_BACKEND = "pytorch"
os.environ.setdefault("DGLBACKEND", DGL_BACKEND)
