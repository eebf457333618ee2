# SPDX-License-Identifier: Apache-2.0
"""DeepSeek-V4.1 lightning indexer on SM80/SM86 (no DeepGEMM): the indexer of
``DeepseekV41AmpereSparseAttention`` (docs/v41-status.md of DeepInfer-SM80).

``DeepseekV41AmpereIndexer`` is V4.1's ``DeepseekV4Indexer`` with
* ``attn_cls`` -> V4's ``AmpereSparseAttnIndexer``, which takes V4.1's candidate blocks
  (the candidate-source layer writes them, later indexers mask to them:
  ``deepinfer_sm80.ampere.indexer.CandidateStep``) and scores exactly dequantised FP8
  with a deterministic top-k, instead of DeepGEMM's MQA-logits kernels;
* ``forward_q`` through the software-e4m3 Triton writer
  (``deepinfer_sm80.triton_writers.indexer_q_rope_quant``): V4.1 calls V4's
  ``fused_indexer_q_rope_quant`` directly, whose kernels (CuTe DSL, Triton ``fp8e4nv``)
  need SM89+.
Keys are written by upstream's ``indexer_k_norm_rope_store``, which patch 7 makes encode
e4m3 in software below 9.0. The FP8 indexer cache (132-byte page) is kept: MXFP4 and the
sparse-logits scorer (``indexer_sparse_logits``) need SM100.
"""

from __future__ import annotations

from deepinfer_sm80.triton_writers import indexer_q_rope_quant
from vllm.models.deepseek_v4.nvidia.ampere_indexer import AmpereSparseAttnIndexer
from vllm.models.deepseek_v41.attention import DeepseekV4Indexer


class DeepseekV41AmpereIndexer(DeepseekV4Indexer):
    attn_cls = AmpereSparseAttnIndexer

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if not isinstance(self.indexer_op, AmpereSparseAttnIndexer):
            raise ValueError(
                "DeepSeek-V4.1 on SM80/SM86 scores the FP8 indexer cache densely: "
                "leave attention_config.indexer_sparse_logits off (it needs SM100)")

    def forward_q(self, qr, qr_scale, indexer_weights, positions, rotary_emb):
        q = self._wq_b_proj(qr, qr_scale)
        q = q.view(-1, self.n_head, self.head_dim)
        q_fp8, weights = indexer_q_rope_quant(
            positions, q, rotary_emb.cos_sin_cache, indexer_weights, self.softmax_scale,
            self.n_head**-0.5)
        return q_fp8, None, weights
