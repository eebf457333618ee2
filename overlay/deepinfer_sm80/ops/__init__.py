"""Drop-in SM80 replacements of upstream vLLM ops (need the built extension).

``deepinfer_sm80.ops.cache``: quantize_and_insert_k_cache, dequantize_and_gather_k_cache.
``deepinfer_sm80.ops.index``: compute_global_topk_indices_and_lens, combine_topk_swa_indices.
``deepinfer_sm80.ops.attention``: the sparse MLA attention calls.
"""

from deepinfer_sm80.ops.cache import dequantize_and_gather_k_cache, quantize_and_insert_k_cache
from deepinfer_sm80.ops.index import (
    combine_topk_swa_indices,
    compute_global_topk_indices_and_lens,
)

__all__ = [
    "quantize_and_insert_k_cache",
    "dequantize_and_gather_k_cache",
    "compute_global_topk_indices_and_lens",
    "combine_topk_swa_indices",
]
