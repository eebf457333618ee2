// Torch-facing ops of the V4 KV-cache kernels (argument checks + launch only).
//   deepinfer_sm80::quantize_and_insert_k_cache
//   deepinfer_sm80::dequantize_and_gather_k_cache
// The Python wrappers (deepinfer_sm80/ops/cache.py) validate with friendlier messages;
// these checks keep the ops memory-safe when called directly.
#include "api/api_utils.h"
#include "cache/cache_kernels.h"
#include "common/kv_record.cuh"

namespace deepinfer_sm80 {
namespace {

// The cache's blocks: dim 0 is the block, everything after it must be contiguous bytes
// and hold at least block_size records. Returns the byte stride between blocks.
int64_t check_k_cache(const at::Tensor& k_cache, int64_t block_size, const at::Device& dev) {
  api::check_cuda(k_cache, "k_cache", dev);
  TORCH_CHECK(k_cache.element_size() == 1,
              "k_cache must be a 1-byte dtype (uint8 / float8 view), got ", k_cache.scalar_type());
  TORCH_CHECK(k_cache.dim() >= 2, "k_cache must be [num_blocks, block_bytes...], got ",
              k_cache.sizes());
  int64_t inner = 1;
  for (int64_t d = k_cache.dim() - 1; d >= 1; --d) {
    TORCH_CHECK(k_cache.size(d) == 1 || k_cache.stride(d) == inner,
                "k_cache must be contiguous inside a block (dim ", d, " stride ",
                k_cache.stride(d), ", expected ", inner, ")");
    inner *= k_cache.size(d);
  }
  TORCH_CHECK(block_size > 0 && block_size < (1 << 16), "block_size must be in [1, 65535], got ",
              block_size);
  TORCH_CHECK(inner >= kv_record::block_bytes(static_cast<int>(block_size)),
              "k_cache blocks hold ", inner, " bytes but block_size=", block_size, " needs ",
              kv_record::block_bytes(static_cast<int>(block_size)), " (", block_size, " x 584)");
  const int64_t stride = k_cache.size(0) > 1 ? k_cache.stride(0) : inner;
  TORCH_CHECK(stride >= inner, "k_cache.stride(0)=", stride, " overlaps its blocks");
  TORCH_CHECK(stride % 16 == 0 && api::aligned16(k_cache.data_ptr()),
              "k_cache blocks must be 16-byte aligned (stride(0)=", stride,
              "); vLLM pads blocks to a multiple of 576 bytes");
  return stride;
}

void quantize_and_insert_k_cache(const at::Tensor& k, at::Tensor& k_cache,
                                 const at::Tensor& slot_mapping, int64_t block_size,
                                 int64_t sm_count) {
  const at::Device dev = k.device();
  api::check_cuda(k, "k", dev);
  api::check_dtype(k, "k", at::kBFloat16);
  TORCH_CHECK(k.dim() == 2 && k.size(1) == kv_record::kHeadDim, "k must be [num_tokens, 512], got ",
              k.sizes());
  TORCH_CHECK(k.stride(1) == 1 && k.stride(0) % 8 == 0 && api::aligned16(k.data_ptr()),
              "k rows must be contiguous and 16-byte aligned (pass k.contiguous())");
  api::check_cuda(slot_mapping, "slot_mapping", dev);
  api::check_dtype(slot_mapping, "slot_mapping", at::kLong);
  TORCH_CHECK(slot_mapping.dim() == 1 && slot_mapping.is_contiguous(),
              "slot_mapping must be a contiguous 1-D int64 tensor");
  TORCH_CHECK(slot_mapping.size(0) <= k.size(0), "slot_mapping has ", slot_mapping.size(0),
              " entries but k only ", k.size(0), " rows");
  const int64_t stride = check_k_cache(k_cache, block_size, dev);
  c10::cuda::CUDAGuard guard(dev);
  InsertKParams p;
  p.k = reinterpret_cast<const uint16_t*>(k.data_ptr());
  p.k_row_stride = k.stride(0);
  p.slot_mapping = slot_mapping.data_ptr<int64_t>();
  p.cache = reinterpret_cast<uint8_t*>(k_cache.data_ptr());
  p.block_stride = stride;
  p.num_blocks = k_cache.size(0);
  p.block_size = static_cast<int>(block_size);
  p.num_tokens = static_cast<int>(slot_mapping.size(0));
  launch_insert_k(p, api::limits(dev.index(), sm_count), api::stream());
  api::check_launch();
}

void dequantize_and_gather_k_cache(at::Tensor& out, const at::Tensor& k_cache,
                                   const at::Tensor& seq_lens,
                                   const std::optional<at::Tensor>& gather_lens,
                                   const at::Tensor& block_table, int64_t block_size,
                                   int64_t offset, int64_t sm_count) {
  const at::Device dev = out.device();
  api::check_cuda(out, "out", dev);
  api::check_dtype(out, "out", at::kBFloat16);
  TORCH_CHECK(out.dim() == 3 && out.size(2) == kv_record::kHeadDim,
              "out must be [num_reqs, max_tokens, 512], got ", out.sizes());
  TORCH_CHECK(out.stride(2) == 1 && out.stride(1) % 8 == 0 && out.stride(0) % 8 == 0 &&
                  api::aligned16(out.data_ptr()),
              "out rows must be contiguous and 16-byte aligned");
  const int64_t stride = check_k_cache(k_cache, block_size, dev);
  api::check_cuda(seq_lens, "seq_lens", dev);
  api::check_dtype(seq_lens, "seq_lens", at::kInt);
  TORCH_CHECK(seq_lens.dim() == 1 && seq_lens.is_contiguous(), "seq_lens must be contiguous 1-D");
  const int64_t num_reqs = seq_lens.size(0);
  TORCH_CHECK(out.size(0) >= num_reqs, "out has ", out.size(0), " rows for ", num_reqs,
              " requests");
  if (gather_lens.has_value()) {
    api::check_cuda(*gather_lens, "gather_lens", dev);
    api::check_dtype(*gather_lens, "gather_lens", at::kInt);
    TORCH_CHECK(gather_lens->dim() == 1 && gather_lens->is_contiguous() &&
                    gather_lens->size(0) >= num_reqs,
                "gather_lens must be contiguous 1-D with >= num_reqs entries");
  }
  api::check_cuda(block_table, "block_table", dev);
  api::check_dtype(block_table, "block_table", at::kInt);
  TORCH_CHECK(block_table.dim() == 2 && block_table.size(0) >= num_reqs,
              "block_table must be [>= num_reqs, max_blocks], got ", block_table.sizes());
  TORCH_CHECK(offset >= 0, "offset must be >= 0, got ", offset);
  c10::cuda::CUDAGuard guard(dev);
  GatherKParams p;
  p.out = reinterpret_cast<uint16_t*>(out.data_ptr());
  p.out_stride0 = out.stride(0);
  p.out_stride1 = out.stride(1);
  p.out_rows = out.size(1);
  p.cache = reinterpret_cast<const uint8_t*>(k_cache.data_ptr());
  p.block_stride = stride;
  p.num_blocks = k_cache.size(0);
  p.seq_lens = seq_lens.data_ptr<int32_t>();
  p.gather_lens = gather_lens.has_value() ? gather_lens->data_ptr<int32_t>() : nullptr;
  p.block_table = block_table.data_ptr<int32_t>();
  p.bt_stride0 = block_table.stride(0);
  p.bt_stride1 = block_table.stride(1);
  p.max_blocks = static_cast<int>(block_table.size(1));
  p.block_size = static_cast<int>(block_size);
  p.offset = static_cast<int>(offset);
  p.num_reqs = static_cast<int>(num_reqs);
  if (num_reqs == 0 || out.size(1) == 0) return;
  launch_gather_k(p, api::limits(dev.index(), sm_count), api::stream());
  api::check_launch();
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(deepinfer_sm80, m) {
  m.def(
      "quantize_and_insert_k_cache(Tensor k, Tensor(a!) k_cache, Tensor slot_mapping, "
      "int block_size, int sm_count=0) -> ()");
  m.def(
      "dequantize_and_gather_k_cache(Tensor(a!) out, Tensor k_cache, Tensor seq_lens, "
      "Tensor? gather_lens, Tensor block_table, int block_size, int offset, "
      "int sm_count=0) -> ()");
}

TORCH_LIBRARY_IMPL(deepinfer_sm80, CUDA, m) {
  m.impl("quantize_and_insert_k_cache", &quantize_and_insert_k_cache);
  m.impl("dequantize_and_gather_k_cache", &dequantize_and_gather_k_cache);
}

}  // namespace deepinfer_sm80
