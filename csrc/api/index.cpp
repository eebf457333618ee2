// Torch-facing ops of the sparse-attention index kernels (argument checks + launch only).
//   deepinfer_sm80::compute_global_topk_indices_and_lens (out variant)
//   deepinfer_sm80::combine_topk_swa_indices             (out variant, fills -1 itself)
#include "api/api_utils.h"
#include "index/index_kernels.h"

namespace deepinfer_sm80 {
namespace {

void check_i32_1d(const at::Tensor& t, const char* name, const at::Device& dev, int64_t min_len) {
  api::check_cuda(t, name, dev);
  api::check_dtype(t, name, at::kInt);
  TORCH_CHECK(t.dim() == 1 && t.is_contiguous(), name, " must be a contiguous 1-D int32 tensor");
  TORCH_CHECK(t.size(0) >= min_len, name, " has ", t.size(0), " entries, needs >= ", min_len);
}

bool rows_vec4(const at::Tensor& t) {
  return t.size(-1) % 4 == 0 && (t.size(0) <= 1 || t.stride(0) % 4 == 0) &&
         api::aligned16(t.data_ptr());
}

void compute_global_topk_indices_and_lens(at::Tensor& global_idx, at::Tensor& lens,
                                          const at::Tensor& topk_indices,
                                          const at::Tensor& token_to_req_indices,
                                          const at::Tensor& block_table, int64_t block_size,
                                          const at::Tensor& is_valid_token, int64_t sm_count) {
  const at::Device dev = topk_indices.device();
  api::check_cuda(topk_indices, "topk_indices", dev);
  api::check_dtype(topk_indices, "topk_indices", at::kInt);
  TORCH_CHECK(topk_indices.dim() == 2 && topk_indices.stride(1) == 1,
              "topk_indices must be [num_tokens, topk] with a contiguous last dim");
  const int64_t T = topk_indices.size(0);
  api::check_cuda(global_idx, "global_topk_indices", dev);
  api::check_dtype(global_idx, "global_topk_indices", at::kInt);
  TORCH_CHECK(global_idx.sizes() == topk_indices.sizes() && global_idx.stride(1) == 1,
              "global_topk_indices must match topk_indices' shape with a contiguous last dim");
  check_i32_1d(lens, "topk_lens", dev, T);
  check_i32_1d(token_to_req_indices, "token_to_req_indices", dev, T);
  api::check_cuda(is_valid_token, "is_valid_token", dev);
  api::check_dtype(is_valid_token, "is_valid_token", at::kBool);
  TORCH_CHECK(is_valid_token.dim() == 1 && is_valid_token.is_contiguous() &&
                  is_valid_token.size(0) >= T,
              "is_valid_token must be a contiguous 1-D bool tensor with >= num_tokens entries");
  api::check_cuda(block_table, "block_table", dev);
  api::check_dtype(block_table, "block_table", at::kInt);
  TORCH_CHECK(block_table.dim() == 2, "block_table must be 2-D, got ", block_table.sizes());
  TORCH_CHECK(block_size > 0, "block_size must be > 0");
  if (T == 0) return;
  c10::cuda::CUDAGuard guard(dev);
  GlobalTopkParams p;
  p.global_idx = global_idx.data_ptr<int32_t>();
  p.global_stride0 = global_idx.stride(0);
  p.lens = lens.data_ptr<int32_t>();
  p.topk = topk_indices.data_ptr<int32_t>();
  p.topk_stride0 = topk_indices.stride(0);
  p.token_to_req = token_to_req_indices.data_ptr<int32_t>();
  p.block_table = block_table.data_ptr<int32_t>();
  p.bt_stride0 = block_table.stride(0);
  p.bt_stride1 = block_table.stride(1);
  p.num_reqs = static_cast<int>(block_table.size(0));
  p.max_blocks = static_cast<int>(block_table.size(1));
  p.block_size = static_cast<int>(block_size);
  p.is_valid_token = is_valid_token.data_ptr<bool>();
  p.num_tokens = static_cast<int>(T);
  p.k = static_cast<int>(topk_indices.size(1));
  p.vec4 = rows_vec4(topk_indices) && rows_vec4(global_idx);
  launch_global_topk(p, api::limits(dev.index(), sm_count), api::stream());
  api::check_launch();
}

void combine_topk_swa_indices(at::Tensor& idx, at::Tensor& lens, const at::Tensor& topk_indices,
                              const at::Tensor& query_start_loc, const at::Tensor& seq_lens,
                              const at::Tensor& gather_lens, int64_t window_size,
                              int64_t compress_ratio, int64_t topk, int64_t M, int64_t N,
                              const std::optional<at::Tensor>& left_visible,
                              const std::optional<at::Tensor>& right_visible,
                              int64_t max_image_tokens, int64_t sm_count, bool v41) {
  const at::Device dev = topk_indices.device();
  api::check_cuda(topk_indices, "topk_indices", dev);
  api::check_dtype(topk_indices, "topk_indices", at::kInt);
  TORCH_CHECK(topk_indices.dim() == 2 && topk_indices.stride(1) == 1,
              "topk_indices must be [num_tokens, width] with a contiguous last dim");
  const int64_t T = topk_indices.size(0);
  TORCH_CHECK(topk >= 0 && topk <= topk_indices.size(1), "topk=", topk,
              " must be in [0, topk_indices.shape[1]=", topk_indices.size(1), "]");
  // V4.1's kernel takes ratio 0 (an SWA-only layer: no top-k column) and has no image path
  TORCH_CHECK(window_size >= 1 && compress_ratio >= (v41 ? 0 : 1) && max_image_tokens >= 0,
              "window_size and compress_ratio must be >= 1 (v41: ratio >= 0), max_image_tokens >= 0");
  TORCH_CHECK(!v41 || (!left_visible.has_value() && max_image_tokens == 0),
              "v41 (DeepSeek-V4.1's combine) has no image visibility (left/right_visible, "
              "max_image_tokens)");
  api::check_cuda(idx, "combined_indices", dev);
  api::check_dtype(idx, "combined_indices", at::kInt);
  TORCH_CHECK(idx.dim() == 2 && idx.size(0) == T && idx.stride(1) == 1,
              "combined_indices must be [num_tokens, width] with a contiguous last dim");
  check_i32_1d(lens, "combined_lens", dev, T);
  const int64_t R = seq_lens.size(0);
  check_i32_1d(seq_lens, "seq_lens", dev, 0);
  check_i32_1d(gather_lens, "gather_lens", dev, R);
  check_i32_1d(query_start_loc, "query_start_loc", dev, R + 1);
  const bool has_image = left_visible.has_value();
  TORCH_CHECK(has_image == right_visible.has_value(),
              "left_visible and right_visible must be given together");
  if (has_image) {
    check_i32_1d(*left_visible, "left_visible", dev, T);
    check_i32_1d(*right_visible, "right_visible", dev, T);
  }
  if (T == 0) return;
  c10::cuda::CUDAGuard guard(dev);
  CombineParams p;
  p.idx = idx.data_ptr<int32_t>();
  p.idx_stride0 = idx.stride(0);
  p.width = static_cast<int>(idx.size(1));
  p.lens = lens.data_ptr<int32_t>();
  p.topk = topk_indices.data_ptr<int32_t>();
  p.topk_stride0 = topk_indices.stride(0);
  p.query_start_loc = query_start_loc.data_ptr<int32_t>();
  p.seq_lens = seq_lens.data_ptr<int32_t>();
  p.gather_lens = gather_lens.data_ptr<int32_t>();
  p.left_visible = has_image ? left_visible->data_ptr<int32_t>() : nullptr;
  p.right_visible = has_image ? right_visible->data_ptr<int32_t>() : nullptr;
  p.num_reqs = static_cast<int>(R);
  p.num_tokens = static_cast<int>(T);
  p.window = static_cast<int>(window_size);
  p.ratio = compress_ratio > 0 ? static_cast<int>(compress_ratio) : 1;
  p.top_k = compress_ratio > 0 ? static_cast<int>(topk) : 0;  // ratio 0 (v41): no top-k column
  p.v41 = v41;
  p.image_width = has_image ? static_cast<int>(max_image_tokens) : 0;
  p.M = static_cast<int32_t>(M);
  p.N = static_cast<int32_t>(N);
  p.vec4 = rows_vec4(idx) && (topk == 0 || rows_vec4(topk_indices));
  launch_combine_topk_swa(p, api::limits(dev.index(), sm_count), api::stream());
  api::check_launch();
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(deepinfer_sm80, m) {
  m.def(
      "compute_global_topk_indices_and_lens(Tensor(a!) global_topk_indices, "
      "Tensor(b!) topk_lens, Tensor topk_indices, Tensor token_to_req_indices, "
      "Tensor block_table, int block_size, Tensor is_valid_token, int sm_count=0) -> ()");
  m.def(
      "combine_topk_swa_indices(Tensor(a!) combined_indices, Tensor(b!) combined_lens, "
      "Tensor topk_indices, Tensor query_start_loc, Tensor seq_lens, Tensor gather_lens, "
      "int window_size, int compress_ratio, int topk, int M, int N, Tensor? left_visible, "
      "Tensor? right_visible, int max_image_tokens, int sm_count=0, bool v41=False) -> ()");
}

TORCH_LIBRARY_IMPL(deepinfer_sm80, CUDA, m) {
  m.impl("compute_global_topk_indices_and_lens", &compute_global_topk_indices_and_lens);
  m.impl("combine_topk_swa_indices", &combine_topk_swa_indices);
}

}  // namespace deepinfer_sm80
