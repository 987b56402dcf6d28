"""Model parallelism, one file per kind: pipeline stages, tensor-parallel layers, sharded data parallel.

Each module is a script `torchrun` starts (one process per device) that writes its results as JSON;
`launch.torchrun(...)` starts one from a notebook or a test.

Used by: notebooks 08 and 10, exercise 10, the capstone (13).
"""
