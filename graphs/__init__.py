"""gnnflow's graph library, one folder per kind of module: stages/ (ingest, normalization,
partitioning, compression, edge split), sampling/ (the shards stage), formats/ (the files
between stages), kernels/, infra/ and synthetic/ (docs/architecture.md).

DGL reads its tensor backend from ``DGLBACKEND`` when it is first imported; gnnflow's is
PyTorch. It is set here, once, because every DGL user (the partitioning and sampling
modules here, and `training.aggregate`, which imports this package first) imports
``graphs`` before DGL. An explicit setting in the environment wins.
"""

import os

DGL_BACKEND = "pytorch"
os.environ.setdefault("DGLBACKEND", DGL_BACKEND)
