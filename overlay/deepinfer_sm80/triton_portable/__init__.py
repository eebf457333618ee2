"""Portable Triton baselines for SM80/SM86 (software e4m3, uint8 at the boundary).

These are what other Ampere ports of DeepSeek-V4 run; the bench compares the CUDA kernels
of this package against them. Importing this package needs triton.
"""

from deepinfer_sm80.triton_portable.gather import dequantize_and_gather_k_cache

__all__ = ["dequantize_and_gather_k_cache"]
