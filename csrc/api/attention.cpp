// SPDX-License-Identifier: Apache-2.0
// Torch-facing entry points of the SM80 sparse MLA attention kernels: argument checks,
// tile-configuration and split choice, launch. No math here.
//
//   sparse_mla_decode   drop-in for upstream's flash_mla_with_kvcache decode call
//   sparse_mla_prefill  drop-in for upstream's flash_mla_sparse_fwd
//   sparse_mla_plan     the configuration / split a call would use (for tests and docs)
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "../attention/params.h"
#include "../attention/plan.h"
#include "../common/env_knob.h"

namespace deepinfer_sm80::attention {
namespace {

using at::Tensor;

constexpr int64_t kRecordBytes = kDataBytes + kScaleBytes;
using plan::kMaxSplits;

int device_smem_cap(int64_t forced) {
  int dev = 0, optin = 0;
  C10_CUDA_CHECK(cudaGetDevice(&dev));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  return forced > 0 ? static_cast<int>(std::min<int64_t>(forced, optin)) : optin;
}

int device_sms(int64_t forced) {
  if (forced > 0) return static_cast<int>(forced);
  int dev = 0, sms = 0;
  C10_CUDA_CHECK(cudaGetDevice(&dev));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return sms;
}

LaunchInfo info_of(TileConfigId id, bool fp8) { return plan::info(id, fp8); }

TileConfigId choose_config(int64_t heads, bool fp8, int smem_cap) {
  TileConfigId id = TileConfigId::kH8;
  TORCH_CHECK(plan::widest_config(heads, fp8, smem_cap, &id),
              "sparse MLA attention: no tile configuration fits in ", smem_cap,
              " bytes of shared memory per block (the smallest needs ",
              info_of(TileConfigId::kH8, fp8).smem_bytes, ")");
  return id;
}

// Measurement knobs (read once): $DEEPINFER_ATTN_NARROW=0 turns the narrowing of
// plan::decode_config off; $DEEPINFER_ATTN_DECODE_HEADS=8|16|32|64 forces the decode
// configuration with that many heads per block when it fits the shared-memory cap.
TileConfigId choose_decode_config(int64_t tokens, int64_t heads, int64_t capacity, int sms,
                                  int smem_cap) {
  static const bool narrow = !knob_off("DEEPINFER_ATTN_NARROW");
  static const int forced_heads = knob_int("DEEPINFER_ATTN_DECODE_HEADS", 0);
  if (forced_heads > 0) {
    for (TileConfigId id : {TileConfigId::kH64, TileConfigId::kH32, TileConfigId::kH16, TileConfigId::kH8}) {
      const LaunchInfo li = plan::info(id, true);
      if (li.heads_per_block == forced_heads && li.smem_bytes <= smem_cap) return id;
    }
  }
  return plan::decode_config(choose_config(heads, true, smem_cap), tokens, heads, capacity, sms,
                             narrow);
}

int choose_splits(int64_t tokens, int64_t groups, int64_t capacity, const LaunchInfo& li,
                  int sms, int smem_cap) {
  return plan::decode_splits(tokens, groups, capacity, li, sms, smem_cap);
}

// SparseMlaParams::prefetch_lists; $DEEPINFER_ATTN_PREFETCH=0 (measurement knob) turns it off.
int prefetch_lists() {
  static const bool off = knob_off("DEEPINFER_ATTN_PREFETCH");
  return off ? 0 : 1;
}

// Prefill tail (plan::prefill_tail); $DEEPINFER_ATTN_PREFILL_TAIL=0 (measurement knob) runs
// every token as one block per head group instead.
plan::PrefillTail choose_prefill_tail(int64_t tokens, int64_t heads, int64_t capacity,
                                      const LaunchInfo& li, int sms, int smem_cap) {
  static const bool off = knob_off("DEEPINFER_ATTN_PREFILL_TAIL");
  if (off) return {0, 1};
  return plan::prefill_tail(tokens, plan::head_groups(heads, li), capacity, li, sms, smem_cap);
}

void check_16b(const Tensor& t, const char* name) {
  TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, name,
              " must start on a 16-byte boundary (pass a contiguous tensor)");
}

void check_rows(const Tensor& t, const char* name) {
  TORCH_CHECK(t.stride(-1) == 1, name, " must be contiguous in its last dimension");
  for (int d = 0; d < t.dim() - 1; ++d)
    TORCH_CHECK(t.size(d) <= 1 || t.stride(d) % 8 == 0, name,
                " strides must be multiples of 8 elements (16 bytes)");
  check_16b(t, name);
}

const int32_t* check_lens(const c10::optional<Tensor>& lens, int64_t tokens, const char* name) {
  if (!lens.has_value()) return nullptr;
  const Tensor& l = *lens;
  TORCH_CHECK(l.is_cuda() && l.scalar_type() == at::kInt && l.is_contiguous(), name,
              " must be a contiguous CUDA int32 tensor");
  TORCH_CHECK(l.numel() == tokens, name, " must have one entry per query token (", tokens, "), got ",
              l.numel());
  return l.data_ptr<int32_t>();
}

// The key source's per-token index list ([tokens, topk] or [tokens, 1, topk], -1 padded)
// and its optional lengths.
void attach_indices(KeySource& s, const Tensor& idx, const c10::optional<Tensor>& lens,
                    int64_t tokens, const char* name, const char* lens_name) {
  TORCH_CHECK(idx.is_cuda() && idx.scalar_type() == at::kInt, name, " must be a CUDA int32 tensor");
  TORCH_CHECK(idx.dim() == 2 || (idx.dim() == 3 && idx.size(1) == 1), name,
              " must be [tokens, topk] or [tokens, 1, topk], got ", idx.sizes());
  TORCH_CHECK(idx.size(0) == tokens, name, " has ", idx.size(0), " rows for ", tokens, " query tokens");
  TORCH_CHECK(idx.stride(-1) == 1, name, " must be contiguous in its last dimension");
  s.indices = idx.data_ptr<int32_t>();
  s.indices_stride = idx.stride(0);
  s.topk = static_cast<int>(idx.size(-1));
  s.lens = check_lens(lens, tokens, lens_name);
}

// Query and output rows: [tokens, ..., heads, 512] with the head dimension at head_dim.
void set_q_out(SparseMlaParams& p, const Tensor& q, const Tensor& out, int head_dim) {
  check_rows(q, "q");
  check_rows(out, "out");
  p.num_tokens = static_cast<int>(q.size(0));
  p.num_heads = static_cast<int>(q.size(head_dim));
  p.q = q.data_ptr();
  p.q_stride_tok = q.stride(0);
  p.q_stride_head = q.stride(head_dim);
  p.out = out.data_ptr();
  p.out_stride_tok = out.stride(0);
  p.out_stride_head = out.stride(head_dim);
}

KeySource check_fp8_cache(const Tensor& cache, const char* name) {
  TORCH_CHECK(cache.is_cuda() && cache.element_size() == 1, name,
              " must be the CUDA uint8 fp8_ds_mla paged cache");
  TORCH_CHECK(cache.dim() >= 3 && cache.size(-1) == kRecordBytes, name,
              " must be [num_blocks, block_size, (1,) 584], got ", cache.sizes());
  TORCH_CHECK(cache.stride(0) % 16 == 0, name, " block stride (", cache.stride(0),
              " bytes) must be a multiple of 16");
  TORCH_CHECK(cache.stride(0) >= cache.size(1) * kRecordBytes, name, " block stride (", cache.stride(0),
              ") is smaller than block_size * 584");
  check_16b(cache, name);
  KeySource s;
  s.base = static_cast<const uint8_t*>(cache.data_ptr());
  s.block_stride = cache.stride(0);
  s.block_size = static_cast<int>(cache.size(1));
  return s;
}

float* check_stat(const c10::optional<Tensor>& t, int64_t tokens, int64_t heads, const char* name,
                  int64_t& s_tok, int64_t& s_head) {
  if (!t.has_value()) return nullptr;
  const Tensor& x = *t;
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == at::kFloat, name, " must be a CUDA float32 tensor");
  TORCH_CHECK(x.dim() >= 2 && x.size(0) == tokens && x.size(1) == heads, name,
              " must be [tokens, heads(, 1)], got ", x.sizes());
  s_tok = x.stride(0);
  s_head = x.stride(1);
  return x.data_ptr<float>();
}

const float* check_sink(const c10::optional<Tensor>& sink, int64_t heads) {
  if (!sink.has_value()) return nullptr;
  const Tensor& s = *sink;
  TORCH_CHECK(s.is_cuda() && s.scalar_type() == at::kFloat && s.is_contiguous(),
              "attn_sink must be a contiguous CUDA float32 tensor");
  TORCH_CHECK(s.numel() >= heads, "attn_sink has ", s.numel(), " entries for ", heads, " heads");
  return s.data_ptr<float>();
}

void sparse_mla_decode(const Tensor& q, const Tensor& swa_cache, const Tensor& swa_indices,
                       const c10::optional<Tensor>& swa_lens, const c10::optional<Tensor>& extra_cache,
                       const c10::optional<Tensor>& extra_indices,
                       const c10::optional<Tensor>& extra_lens, const c10::optional<Tensor>& attn_sink,
                       double scale, Tensor& out, const c10::optional<Tensor>& lse, int64_t num_sms,
                       int64_t smem_cap, int64_t num_splits) {
  TORCH_CHECK(q.is_cuda() && q.scalar_type() == at::kBFloat16, "q must be a CUDA bfloat16 tensor");
  TORCH_CHECK(q.dim() == 4 && q.size(1) == 1 && q.size(3) == kHeadDim,
              "q must be [tokens, 1, heads, 512] (one row per decode token), got ", q.sizes());
  TORCH_CHECK(out.sizes() == q.sizes() && out.scalar_type() == at::kBFloat16,
              "out must be a bfloat16 tensor shaped like q");
  c10::cuda::CUDAGuard guard(q.device());
  const int64_t T = q.size(0), H = q.size(2);

  SparseMlaParams p;
  set_q_out(p, q, out, 2);
  p.src[0] = check_fp8_cache(swa_cache, "swa_cache");
  attach_indices(p.src[0], swa_indices, swa_lens, T, "swa_indices", "swa_lens");
  p.num_sources = 1;
  if (extra_cache.has_value() || extra_indices.has_value()) {
    TORCH_CHECK(extra_cache.has_value() && extra_indices.has_value(),
                "extra_cache and extra_indices go together");
    p.src[1] = check_fp8_cache(*extra_cache, "extra_cache");
    attach_indices(p.src[1], *extra_indices, extra_lens, T, "extra_indices", "extra_lens");
    p.num_sources = 2;
  }
  p.sink = check_sink(attn_sink, H);
  p.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
  p.lse = check_stat(lse, T, H, "lse", p.lse_stride_tok, p.lse_stride_head);
  if (T == 0 || H == 0) return;

  const int cap = device_smem_cap(smem_cap);
  const int sms = device_sms(num_sms);
  const int64_t capacity = p.src[0].topk + (p.num_sources > 1 ? p.src[1].topk : 0);
  const TileConfigId id = choose_decode_config(T, H, capacity, sms, cap);
  const LaunchInfo li = plan::info(id, true);
  const int64_t groups = plan::head_groups(H, li);
  int splits = num_splits > 0 ? static_cast<int>(std::min<int64_t>(num_splits, kMaxSplits))
                              : choose_splits(T, groups, capacity, li, sms, cap);
  splits = static_cast<int>(std::min<int64_t>(splits, plan::tiles(capacity, li)));
  p.num_splits = std::max(1, splits);
  p.keys_per_split = plan::keys_per_split(capacity, p.num_splits, li);

  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  Tensor part_o, part_ml;
  if (p.num_splits > 1) {
    part_o = at::empty({T, p.num_splits, H, kHeadDim}, q.options().dtype(at::kFloat));
    part_ml = at::empty({T, p.num_splits, 3, H}, q.options().dtype(at::kFloat));
    p.part_o = part_o.data_ptr<float>();
    p.part_ml = part_ml.data_ptr<float>();
  }
  p.prefetch_lists = prefetch_lists();
  C10_CUDA_CHECK(launch_decode(p, id, stream));
  if (p.num_splits > 1) C10_CUDA_CHECK(launch_sparse_mla_combine(p, stream));
}

void sparse_mla_prefill(const Tensor& q, const Tensor& kv, const Tensor& indices,
                        const c10::optional<Tensor>& topk_length, const c10::optional<Tensor>& attn_sink,
                        double scale, Tensor& out, const c10::optional<Tensor>& max_logits,
                        const c10::optional<Tensor>& lse, int64_t smem_cap, int64_t num_sms) {
  TORCH_CHECK(q.is_cuda() && q.scalar_type() == at::kBFloat16, "q must be a CUDA bfloat16 tensor");
  TORCH_CHECK(q.dim() == 3 && q.size(2) == kHeadDim, "q must be [tokens, heads, 512], got ", q.sizes());
  TORCH_CHECK(kv.is_cuda() && kv.scalar_type() == at::kBFloat16, "kv must be a CUDA bfloat16 tensor");
  TORCH_CHECK((kv.dim() == 3 && kv.size(1) == 1 && kv.size(2) == kHeadDim) ||
                  (kv.dim() == 2 && kv.size(1) == kHeadDim),
              "kv must be [s_kv, 1, 512] (one kv head), got ", kv.sizes());
  TORCH_CHECK(out.sizes() == q.sizes() && out.scalar_type() == at::kBFloat16,
              "out must be a bfloat16 tensor shaped like q");
  check_rows(kv, "kv");
  c10::cuda::CUDAGuard guard(q.device());
  const int64_t T = q.size(0), H = q.size(1);

  SparseMlaParams p;
  set_q_out(p, q, out, 1);
  KeySource& s = p.src[0];
  s.base = static_cast<const uint8_t*>(kv.data_ptr());
  s.row_stride = kv.stride(0) * 2;
  s.num_rows = kv.size(0);
  attach_indices(s, indices, topk_length, T, "indices", "topk_length");
  p.num_sources = 1;
  p.sink = check_sink(attn_sink, H);
  p.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
  p.lse = check_stat(lse, T, H, "lse", p.lse_stride_tok, p.lse_stride_head);
  p.max_logits = check_stat(max_logits, T, H, "max_logits", p.ml_stride_tok, p.ml_stride_head);
  if (T == 0 || H == 0) return;
  const int cap = device_smem_cap(smem_cap);
  const TileConfigId id = choose_config(H, false, cap);
  const LaunchInfo li = plan::info(id, false);
  const plan::PrefillTail tail = choose_prefill_tail(T, H, s.topk, li, device_sms(num_sms), cap);
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  p.prefetch_lists = prefetch_lists();
  p.whole_tokens = static_cast<int>(T - tail.tokens);
  Tensor part_o, part_ml;
  if (tail.tokens > 0) {
    // the last partial wave's tokens: key lists split tail.splits ways (after the whole
    // blocks, in the same launch), partials merged by the combine (plan::prefill_tail)
    p.num_splits = tail.splits;
    p.keys_per_split = plan::keys_per_split(s.topk, tail.splits, li);
    part_o = at::empty({tail.tokens, tail.splits, H, kHeadDim}, q.options().dtype(at::kFloat));
    part_ml = at::empty({tail.tokens, tail.splits, 3, H}, q.options().dtype(at::kFloat));
    p.part_o = part_o.data_ptr<float>();
    p.part_ml = part_ml.data_ptr<float>();
  }
  C10_CUDA_CHECK(launch_prefill(p, id, stream));
  if (tail.tokens > 0) {
    // the combine sees the split tokens only
    SparseMlaParams pt = p;
    pt.num_tokens = static_cast<int>(tail.tokens);
    pt.out = static_cast<at::BFloat16*>(p.out) + p.whole_tokens * p.out_stride_tok;
    if (p.lse != nullptr) pt.lse = p.lse + p.whole_tokens * p.lse_stride_tok;
    if (p.max_logits != nullptr) pt.max_logits = p.max_logits + p.whole_tokens * p.ml_stride_tok;
    C10_CUDA_CHECK(launch_sparse_mla_combine(pt, stream));
  }
}

// [heads_per_block, keys_per_tile, threads, smem_bytes, splits, split_tokens] that a call
// would use: decode splits every token (split_tokens = num_tokens when splits > 1), prefill
// only the tokens of its last partial wave (split_tokens of them, splits each).
std::vector<int64_t> sparse_mla_plan(int64_t num_tokens, int64_t num_heads, int64_t capacity, bool fp8,
                                     int64_t num_sms, int64_t smem_cap) {
  const int cap = device_smem_cap(smem_cap);
  const int sms = device_sms(num_sms);
  const TileConfigId id = fp8 ? choose_decode_config(num_tokens, num_heads, capacity, sms, cap)
                              : choose_config(num_heads, fp8, cap);
  const LaunchInfo li = info_of(id, fp8);
  if (!fp8) {
    const plan::PrefillTail tail = choose_prefill_tail(num_tokens, num_heads, capacity, li, sms, cap);
    return {li.heads_per_block, li.keys_per_tile, li.threads, li.smem_bytes, tail.splits, tail.tokens};
  }
  const int splits = choose_splits(num_tokens, plan::head_groups(num_heads, li), capacity, li, sms, cap);
  return {li.heads_per_block, li.keys_per_tile, li.threads, li.smem_bytes, splits,
          splits > 1 ? num_tokens : 0};
}

}  // namespace
}  // namespace deepinfer_sm80::attention

TORCH_LIBRARY_FRAGMENT(deepinfer_sm80, m) {
  m.def(
      "sparse_mla_decode(Tensor q, Tensor swa_cache, Tensor swa_indices, Tensor? swa_lens, "
      "Tensor? extra_cache, Tensor? extra_indices, Tensor? extra_lens, Tensor? attn_sink, "
      "float scale, Tensor(a!) out, Tensor(b!)? lse, int num_sms=0, int smem_cap=0, "
      "int num_splits=0) -> ()");
  m.def(
      "sparse_mla_prefill(Tensor q, Tensor kv, Tensor indices, Tensor? topk_length, "
      "Tensor? attn_sink, float scale, Tensor(a!) out, Tensor(b!)? max_logits, Tensor(c!)? lse, "
      "int smem_cap=0, int num_sms=0) -> ()");
  m.def(
      "sparse_mla_plan(int num_tokens, int num_heads, int capacity, bool fp8, int num_sms=0, "
      "int smem_cap=0) -> int[]",
      &deepinfer_sm80::attention::sparse_mla_plan);
}

TORCH_LIBRARY_IMPL(deepinfer_sm80, CUDA, m) {
  m.impl("sparse_mla_decode", &deepinfer_sm80::attention::sparse_mla_decode);
  m.impl("sparse_mla_prefill", &deepinfer_sm80::attention::sparse_mla_prefill);
}
