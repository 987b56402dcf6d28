"""The CUDA halves of labkit's production kernels: thread-block-cluster kernels for Hopper, compiled at run time.

softmax_cluster.cu (long softmax rows) and layer_norm_bwd_cluster.cu (layer norm's backward over long rows) share
rows between the blocks of a cluster (helpers in cluster.cuh); `rtc` compiles them with NVRTC. The Triton wrappers
in labkit/kernels/softmax.py and layer_norm.py call them and fall back to Triton where they cannot run.
(Notebook 06's teaching kernels are elsewhere: labkit/cuda.)
"""
