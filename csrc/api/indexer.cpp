// Torch-facing ops of the lightning indexer's scorer (argument checks + launch):
//   deepinfer_sm80::indexer_paged_keys (out variant; csrc/index/indexer_keys.cu, paged cache; with
//                                       rows_per_req >= 1 the rows kernel, indexer_rows.cu)
//   deepinfer_sm80::indexer_flat_keys  (out variant; over a flat workspace: by default the
//                                       kernel whose blocks share K across rows, indexer_rows.cu)
//   deepinfer_sm80::row_topk_keys      (out variant; csrc/index/row_topk.cu)
//   deepinfer_sm80::row_topk_indices   (the same top-k written as int32 column indices)
//   deepinfer_sm80::candidate_block_keys, candidate_mask
//                                      (DeepSeek-V4.1's candidate step on a decode's column
//                                       tile; csrc/index/candidate_blocks.cu)
#include <optional>

#include "api/api_utils.h"
#include "index/index_kernels.h"

namespace deepinfer_sm80 {
namespace {

void check_i32_vec(const at::Tensor& t, const char* name, const at::Device& dev, int64_t n) {
  api::check_cuda(t, name, dev);
  api::check_dtype(t, name, at::kInt);
  TORCH_CHECK(t.dim() == 1 && t.is_contiguous() && t.size(0) >= n, name,
              " must be a contiguous 1-D int32 tensor with >= ", n, " entries");
}

// The checks both scorers share: q, weights, lo / hi, the column window, out, chunk and
// smem_cap. Returns the params with those fields set (rows, heads, columns, chunk: 0 = the
// launcher's); each op adds its K source.
IndexerKeysParams checked_rows(const at::Tensor& out, const at::Tensor& q, const at::Tensor& w,
                               const at::Tensor& lo, const at::Tensor& hi, int64_t col0, int64_t n_cols,
                               int64_t chunk, int64_t smem_cap) {
  const at::Device dev = q.device();
  api::check_cuda(q, "q", dev);
  api::check_dtype(q, "q", at::kByte);
  TORCH_CHECK(q.dim() == 3 && q.size(2) == 128 && q.is_contiguous(),
              "q must be contiguous uint8 [rows, heads, 128], got ", q.sizes());
  const int64_t rows = q.size(0), heads = q.size(1);
  TORCH_CHECK(heads == 16 || heads == 32 || heads == 64, "heads must be 16, 32 or 64, got ", heads);
  TORCH_CHECK(rows <= INT32_MAX, "too many rows: ", rows);
  TORCH_CHECK(api::aligned16(q.data_ptr()), "q must be 16-byte aligned");
  api::check_cuda(w, "weights", dev);
  api::check_dtype(w, "weights", at::kFloat);
  TORCH_CHECK(w.dim() == 2 && w.size(0) >= rows && w.size(1) == heads && w.is_contiguous(),
              "weights must be contiguous fp32 [>= rows, heads]");
  check_i32_vec(lo, "lo", dev, rows);
  check_i32_vec(hi, "hi", dev, rows);
  TORCH_CHECK(col0 >= 0 && n_cols >= 0 && col0 + n_cols <= INT32_MAX,
              "columns [col0, col0 + n_cols) must lie in [0, 2^31)");
  api::check_cuda(out, "out", dev);
  api::check_dtype(out, "out", at::kLong);
  TORCH_CHECK(out.dim() == 2 && out.size(0) >= rows && out.size(1) >= n_cols && out.stride(1) == 1,
              "out must be int64 [>= rows, >= n_cols] with a contiguous last dim");
  TORCH_CHECK(chunk <= 0 || (chunk % kIndexerKeysChunkStep == 0 && chunk <= INT32_MAX),
              "chunk must be <= 0 (automatic) or a multiple of ", kIndexerKeysChunkStep);
  if (chunk > 0) {
    TORCH_CHECK((n_cols + chunk - 1) / chunk <= 65535, "n_cols=", n_cols, " with chunk=", chunk,
                " needs more than 65535 column chunks; pass a larger chunk");
  }
  TORCH_CHECK(smem_cap >= 0, "smem_cap must be >= 0 (0 = the device's limit)");
  IndexerKeysParams p;
  p.out = out.data_ptr<int64_t>();
  p.out_stride0 = out.stride(0);
  p.q = q.data_ptr<uint8_t>();
  p.w = w.data_ptr<float>();
  p.lo = lo.data_ptr<int32_t>();
  p.hi = hi.data_ptr<int32_t>();
  p.rows = static_cast<int>(rows);
  p.heads = static_cast<int>(heads);
  p.col0 = static_cast<int>(col0);
  p.n_cols = static_cast<int>(n_cols);
  p.chunk = static_cast<int>(chunk > 0 ? chunk : 0);  // 0: the launcher sizes it
  return p;
}

DeviceLimits limits_for(const at::Tensor& q, int64_t sm_count, int64_t smem_cap) {
  return api::limits(q.device().index(), sm_count).with_overrides(0, static_cast<int>(smem_cap));
}

void indexer_paged_keys(at::Tensor& out, const at::Tensor& q, const at::Tensor& w,
                        const at::Tensor& pages, const at::Tensor& block_table,
                        const at::Tensor& row_req, const at::Tensor& lo, const at::Tensor& hi,
                        int64_t col0, int64_t n_cols, int64_t block_size, int64_t chunk,
                        int64_t sm_count, int64_t smem_cap, int64_t rows_per_req, bool fill) {
  IndexerKeysParams p = checked_rows(out, q, w, lo, hi, col0, n_cols, chunk, smem_cap);
  p.fill = fill;
  const at::Device dev = q.device();
  api::check_cuda(pages, "kv_cache", dev);
  api::check_dtype(pages, "kv_cache", at::kByte);
  TORCH_CHECK(block_size > 0 && block_size <= (1 << 20), "block_size must be in [1, 2^20]");
  TORCH_CHECK(pages.dim() == 2 && pages.stride(1) == 1 && pages.size(1) >= block_size * 132,
              "kv_cache must be uint8 [num_pages, >= block_size * 132] with contiguous rows");
  TORCH_CHECK(pages.stride(0) % 16 == 0 && api::aligned16(pages.data_ptr()),
              "kv_cache pages must start at 16-byte aligned addresses");
  api::check_cuda(block_table, "block_table", dev);
  api::check_dtype(block_table, "block_table", at::kInt);
  TORCH_CHECK(block_table.dim() == 2, "block_table must be 2-D, got ", block_table.sizes());
  check_i32_vec(row_req, "row_req", dev, p.rows);
  if (chunk > 0) {
    TORCH_CHECK(chunk / block_size + 2 <= kIndexerKeysMaxPages, "chunk=", chunk,
                " spans more than ", kIndexerKeysMaxPages - 2, " pages of ", block_size,
                " columns; pass a smaller chunk");
  }
  TORCH_CHECK(rows_per_req >= 0 && rows_per_req <= 8, "rows_per_req must be in [0, 8], got ", rows_per_req);
  if (p.rows == 0 || p.n_cols == 0) return;
  c10::cuda::CUDAGuard guard(dev);
  const DeviceLimits lim = limits_for(q, sm_count, smem_cap);
  p.pages = pages.data_ptr<uint8_t>();
  p.page_stride = pages.stride(0);
  p.num_pages = pages.size(0);
  p.block_table = block_table.data_ptr<int32_t>();
  p.bt_stride0 = block_table.stride(0);
  p.bt_stride1 = block_table.stride(1);
  p.num_reqs = static_cast<int>(block_table.size(0));
  p.max_blocks = static_cast<int>(block_table.size(1));
  p.row_req = row_req.data_ptr<int32_t>();
  p.block_size = static_cast<int>(block_size);
  p.group_rows = static_cast<int>(rows_per_req);
  if (rows_per_req >= 1 && indexer_rows_fits(p.heads, lim, p.group_rows)) {
    launch_indexer_rows(p, lim, api::stream());  // blocks of a request's rows share its K
  } else {
    launch_indexer_keys(p, lim, api::stream());
  }
  api::check_launch();
}

// The prefill form: K from the gathered workspace (k_codes uint8 [Nk, 128], k_scale fp32 [Nk]);
// row r sees global columns [lo[r], hi[r]); columns at or past Nk are never read.
void indexer_flat_keys(at::Tensor& out, const at::Tensor& q, const at::Tensor& w,
                       const at::Tensor& k_codes, const at::Tensor& k_scale, const at::Tensor& lo,
                       const at::Tensor& hi, int64_t col0, int64_t n_cols, int64_t chunk,
                       int64_t sm_count, int64_t smem_cap, int64_t kernel) {
  IndexerKeysParams p = checked_rows(out, q, w, lo, hi, col0, n_cols, chunk, smem_cap);
  const at::Device dev = q.device();
  api::check_cuda(k_codes, "k_codes", dev);
  api::check_dtype(k_codes, "k_codes", at::kByte);
  TORCH_CHECK(k_codes.dim() == 2 && k_codes.size(1) == 128 && k_codes.stride(1) == 1,
              "k_codes must be uint8 [Nk, 128] with contiguous rows, got ", k_codes.sizes());
  TORCH_CHECK(k_codes.size(0) <= 1 || k_codes.stride(0) % 16 == 0,
              "k_codes rows must be 16-byte aligned (row stride ", k_codes.stride(0), " bytes)");
  TORCH_CHECK(api::aligned16(k_codes.data_ptr()), "k_codes must start at a 16-byte aligned address");
  api::check_cuda(k_scale, "k_scale", dev);
  api::check_dtype(k_scale, "k_scale", at::kFloat);
  TORCH_CHECK(k_scale.dim() == 1 && k_scale.is_contiguous() && k_scale.size(0) >= k_codes.size(0),
              "k_scale must be contiguous fp32 [>= Nk]");
  TORCH_CHECK(kernel >= 0 && kernel <= 2, "kernel must be 0 (automatic), 1 (a warp per row) or 2 "
              "(rows sharing K), got ", kernel);
  if (p.rows == 0 || p.n_cols == 0) return;
  c10::cuda::CUDAGuard guard(dev);
  const DeviceLimits lim = limits_for(q, sm_count, smem_cap);
  TORCH_CHECK(kernel != 2 || indexer_rows_fits(p.heads, lim),
              "kernel=2 (rows sharing K) does not fit the shared-memory cap of ", lim.max_dynamic_smem,
              " bytes with ", p.heads, " heads; pass kernel=0 or 1");
  p.num_k = k_codes.size(0);
  // an empty workspace may have no storage; k_codes != nullptr is what selects flat mode, and
  // with num_k = 0 no column is read, so any valid address does
  p.k_codes = p.num_k > 0 ? k_codes.data_ptr<uint8_t>() : q.data_ptr<uint8_t>();
  p.k_stride = p.num_k <= 1 ? 128 : k_codes.stride(0);
  p.k_scales = p.num_k > 0 ? k_scale.data_ptr<float>() : w.data_ptr<float>();
  if (kernel != 1 && indexer_rows_fits(p.heads, lim)) {
    launch_indexer_rows(p, lim, api::stream());
  } else {
    launch_indexer_keys(p, lim, api::stream());
  }
  api::check_launch();
}

// A row window's bound: int32 [>= rows] on the keys' device, contiguous.
static void check_window(const at::Tensor& t, const char* name, const at::Tensor& keys) {
  api::check_cuda(t, name, keys.device());
  api::check_dtype(t, name, at::kInt);
  TORCH_CHECK(t.dim() == 1 && t.is_contiguous() && t.size(0) >= keys.size(0), name,
              " must be a contiguous int32 [>= rows] tensor (rows = ", keys.size(0), "), got shape ",
              t.sizes());
}

// The row top-k's checks and launch; out is int64 keys or (as_indices) int32 column indices.
// hi (and lo): the visible window of each row, see RowTopkParams (index_kernels.h).
// best: a running best [>= rows, m] merged in front of the window (RowTopkParams::win_head).
// Whether the bytes two 2-D tensors span (first to last element, row strides >= 0) intersect.
bool row_topk_overlap(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  auto span = [](const at::Tensor& t) {
    const auto* p = static_cast<const char*>(t.data_ptr());
    const int64_t last = (t.size(0) - 1) * t.stride(0) + (t.size(1) - 1) * t.stride(1);
    return std::make_pair(p, p + (last + 1) * static_cast<int64_t>(t.element_size()));
  };
  const auto [a0, a1] = span(a);
  const auto [b0, b1] = span(b);
  return a0 < b1 && b0 < a1;
}

void row_topk(at::Tensor& out, const at::Tensor& keys, int64_t k, bool as_indices,
              const std::optional<at::Tensor>& lo, const std::optional<at::Tensor>& hi, int64_t col0,
              int64_t prefix, const std::optional<at::Tensor>& best) {
  const at::Device dev = keys.device();
  api::check_cuda(keys, "keys", dev);
  api::check_dtype(keys, "keys", at::kLong);
  TORCH_CHECK(keys.dim() == 2 && keys.stride(1) == 1 && keys.size(1) <= INT32_MAX,
              "keys must be int64 [rows, n] with a contiguous last dim");
  TORCH_CHECK(k >= 1 && k <= kRowTopkMaxK, "k must be in [1, ", kRowTopkMaxK, "], got ", k);
  api::check_cuda(out, "out", dev);
  api::check_dtype(out, "out", as_indices ? at::kInt : at::kLong);
  TORCH_CHECK(out.dim() == 2 && out.size(0) >= keys.size(0) && out.size(1) >= k && out.stride(1) == 1,
              "out must be ", as_indices ? "int32" : "int64",
              " [>= rows, >= k] with a contiguous last dim");
  TORCH_CHECK(keys.size(0) <= INT32_MAX, "too many rows");
  TORCH_CHECK(hi.has_value() || !lo.has_value(), "lo needs hi (the window is [lo, hi))");
  TORCH_CHECK(prefix >= 0 && prefix <= keys.size(1), "prefix must be in [0, n = ", keys.size(1),
              "], got ", prefix);
  if (hi.has_value()) check_window(*hi, "hi", keys);
  if (lo.has_value()) check_window(*lo, "lo", keys);
  if (best.has_value()) {
    TORCH_CHECK(hi.has_value() && prefix == 0, "best needs hi and prefix = 0 (it is the prefix)");
    api::check_cuda(*best, "best", dev);
    api::check_dtype(*best, "best", at::kLong);
    TORCH_CHECK(best->dim() == 2 && best->size(0) >= keys.size(0) && best->stride(1) == 1 &&
                    best->size(1) <= INT32_MAX - keys.size(1),
                "best must be int64 [>= rows, m] with a contiguous last dim");
  }
  // out may be best itself (the same rows: a running best merged in place; each row's block reads
  // its keys before it writes), nothing else it overlaps
  TORCH_CHECK(!row_topk_overlap(out, keys), "out must not overlap keys");
  if (best.has_value()) {
    const bool in_place = out.data_ptr() == best->data_ptr() && out.stride(0) == best->stride(0);
    TORCH_CHECK(in_place || !row_topk_overlap(out, *best),
                "out must be best itself (the same data and row stride) or not overlap it");
  }
  if (keys.size(0) == 0) return;
  c10::cuda::CUDAGuard guard(dev);
  RowTopkParams p;
  p.keys = keys.data_ptr<int64_t>();
  p.key_stride = keys.stride(0);
  p.out = as_indices ? nullptr : out.data_ptr<int64_t>();
  p.out_idx = as_indices ? out.data_ptr<int32_t>() : nullptr;
  p.out_stride = out.stride(0);
  p.rows = static_cast<int>(keys.size(0));
  p.n = static_cast<int>(keys.size(1));
  p.k = static_cast<int>(k);
  if (hi.has_value()) {
    p.win_hi = hi->data_ptr<int32_t>();
    p.win_lo = lo.has_value() ? lo->data_ptr<int32_t>() : nullptr;
    p.win_col0 = col0;
    p.win_prefix = static_cast<int>(prefix);
    if (best.has_value() && best->size(1) > 0) {
      p.win_head = best->data_ptr<int64_t>();
      p.win_head_stride = best->stride(0);
      p.win_prefix = static_cast<int>(best->size(1));
      p.n += p.win_prefix;  // the kernel's n counts the prefix too
    }
  }
  // long windows and few rows: two launches, chunks of each row first (RowTopkParams::split_*)
  at::Tensor ws;
  RowTopkSplit split;
  split.blocks = row_topk_split_blocks(p, api::limits(dev.index(), 0).sm_count);
  if (split.blocks > 0) {
    ws = at::empty({p.rows, split.blocks, p.k}, keys.options());
    split.ws = ws.data_ptr<int64_t>();
  }
  launch_row_topk(p, api::stream(), split);
  api::check_launch();
}

void row_topk_keys(at::Tensor& out, const at::Tensor& keys, int64_t k,
                   const std::optional<at::Tensor>& lo, const std::optional<at::Tensor>& hi,
                   int64_t col0, int64_t prefix, const std::optional<at::Tensor>& best) {
  row_topk(out, keys, k, false, lo, hi, col0, prefix, best);
}

void row_topk_indices(at::Tensor& out, const at::Tensor& keys, int64_t k,
                      const std::optional<at::Tensor>& lo, const std::optional<at::Tensor>& hi,
                      int64_t col0, int64_t prefix, const std::optional<at::Tensor>& best) {
  row_topk(out, keys, k, true, lo, hi, col0, prefix, best);
}

// The candidate step's shared checks: keys int64 [rows, >= n_cols] (contiguous last dim), hi
// and lo (optional) int32 [>= rows], the tile [col0, col0 + n_cols).
CandidateParams checked_candidate(const at::Tensor& keys, const at::Tensor& hi,
                                  const std::optional<at::Tensor>& lo, int64_t col0,
                                  int64_t n_cols, int64_t block_size) {
  const at::Device dev = keys.device();
  api::check_cuda(keys, "keys", dev);
  api::check_dtype(keys, "keys", at::kLong);
  TORCH_CHECK(keys.dim() == 2 && keys.stride(1) == 1 && keys.size(0) <= INT32_MAX,
              "keys must be int64 [rows, n] with a contiguous last dim, got ", keys.sizes());
  TORCH_CHECK(block_size >= 1 && block_size <= (1 << 20), "block_size must be in [1, 2^20], got ",
              block_size);
  TORCH_CHECK(col0 >= 0 && n_cols >= 0 && col0 + n_cols <= INT32_MAX && n_cols <= keys.size(1),
              "columns [col0, col0 + n_cols) must lie in [0, 2^31) with n_cols <= keys.size(1)");
  check_i32_vec(hi, "hi", dev, keys.size(0));
  if (lo.has_value()) check_i32_vec(*lo, "lo", dev, keys.size(0));
  CandidateParams p;
  p.keys = keys.data_ptr<int64_t>();
  p.key_stride = keys.stride(0);
  p.col0 = static_cast<int>(col0);
  p.n_cols = static_cast<int>(n_cols);
  p.hi = hi.data_ptr<int32_t>();
  p.lo = lo.has_value() ? lo->data_ptr<int32_t>() : nullptr;
  p.rows = static_cast<int>(keys.size(0));
  p.block_size = static_cast<int>(block_size);
  return p;
}

// best[r, b] for the visible blocks of the tile (CandidateParams::best, ::merge); visible_blocks[r]
// (optional) the rows' visible blocks.
void candidate_block_keys(at::Tensor& best, const at::Tensor& keys, const at::Tensor& hi,
                          int64_t col0, int64_t n_cols, int64_t block_size,
                          const std::optional<at::Tensor>& visible_blocks,
                          const std::optional<at::Tensor>& lo, bool merge) {
  CandidateParams p = checked_candidate(keys, hi, lo, col0, n_cols, block_size);
  TORCH_CHECK(merge || (!lo.has_value() && col0 % block_size == 0 && n_cols % block_size == 0),
              "without merge the tile must hold whole blocks: no lo, and col0 (", col0,
              ") and n_cols (", n_cols, ") multiples of block_size (", block_size, ")");
  api::check_cuda(best, "best", keys.device());
  api::check_dtype(best, "best", at::kLong);
  TORCH_CHECK(best.dim() == 2 && best.size(0) >= keys.size(0) && best.stride(1) == 1,
              "best must be int64 [>= rows, blocks] with a contiguous last dim, got ", best.sizes());
  if (!lo.has_value()) {
    const int64_t need = (col0 + n_cols + block_size - 1) / block_size;
    TORCH_CHECK(best.size(1) >= need, "best must be int64 [>= rows, >= ceil((col0 + n_cols) / ",
                "block_size) = ", need, "], got ", best.sizes());
  }
  if (visible_blocks.has_value()) check_i32_vec(*visible_blocks, "visible_blocks", keys.device(), keys.size(0));
  if (p.rows == 0) return;
  c10::cuda::CUDAGuard guard(keys.device());
  p.best = best.data_ptr<int64_t>();
  p.best_stride = best.stride(0);
  p.merge = merge;
  p.visible_blocks = visible_blocks.has_value() ? visible_blocks->data_ptr<int32_t>() : nullptr;
  launch_candidate_block_keys(p, api::limits(keys.device().index(), 0).sm_count, api::stream());
  api::check_launch();
}

// keys of visible columns outside the rows' listed blocks -> INT64_MIN (CandidateParams::listed).
void candidate_mask(at::Tensor& keys, const at::Tensor& blocks, const at::Tensor& hi, int64_t col0,
                    int64_t n_cols, int64_t block_size, const std::optional<at::Tensor>& lo) {
  CandidateParams p = checked_candidate(keys, hi, lo, col0, n_cols, block_size);
  api::check_cuda(blocks, "blocks", keys.device());
  api::check_dtype(blocks, "blocks", at::kInt);
  TORCH_CHECK(blocks.dim() == 2 && blocks.size(0) >= keys.size(0) && blocks.size(1) <= INT32_MAX &&
                  (blocks.size(1) <= 1 || blocks.stride(1) == 1),
              "blocks must be int32 [>= rows, K] with a contiguous last dim, got ", blocks.sizes());
  if (p.rows == 0 || p.n_cols == 0) return;
  c10::cuda::CUDAGuard guard(keys.device());
  p.listed = blocks.data_ptr<int32_t>();
  p.listed_stride = blocks.stride(0);
  p.n_listed = static_cast<int>(blocks.size(1));
  launch_candidate_mask(p, api::limits(keys.device().index(), 0).sm_count, api::stream());
  api::check_launch();
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(deepinfer_sm80, m) {
  m.def(
      "indexer_paged_keys(Tensor(a!) out, Tensor q, Tensor weights, Tensor kv_cache, "
      "Tensor block_table, Tensor row_req, Tensor lo, Tensor hi, int col0, int n_cols, "
      "int block_size, int chunk=0, int sm_count=0, int smem_cap=0, int rows_per_req=0, "
      "bool fill=True) -> ()");
  m.def(
      "indexer_flat_keys(Tensor(a!) out, Tensor q, Tensor weights, Tensor k_codes, "
      "Tensor k_scale, Tensor lo, Tensor hi, int col0, int n_cols, int chunk=0, "
      "int sm_count=0, int smem_cap=0, int kernel=0) -> ()");
  m.def(
      "row_topk_keys(Tensor(a!) out, Tensor keys, int k, Tensor? lo=None, Tensor? hi=None, "
      "int col0=0, int prefix=0, Tensor? best=None) -> ()");
  m.def(
      "row_topk_indices(Tensor(a!) out, Tensor keys, int k, Tensor? lo=None, Tensor? hi=None, "
      "int col0=0, int prefix=0, Tensor? best=None) -> ()");
  m.def(
      "candidate_block_keys(Tensor(a!) best, Tensor keys, Tensor hi, int col0, int n_cols, "
      "int block_size, Tensor(b!)? visible_blocks=None, Tensor? lo=None, bool merge=False) -> ()");
  m.def(
      "candidate_mask(Tensor(a!) keys, Tensor blocks, Tensor hi, int col0, int n_cols, "
      "int block_size, Tensor? lo=None) -> ()");
}

TORCH_LIBRARY_IMPL(deepinfer_sm80, CUDA, m) {
  m.impl("indexer_paged_keys", &indexer_paged_keys);
  m.impl("indexer_flat_keys", &indexer_flat_keys);
  m.impl("row_topk_keys", &row_topk_keys);
  m.impl("row_topk_indices", &row_topk_indices);
  m.impl("candidate_block_keys", &candidate_block_keys);
  m.impl("candidate_mask", &candidate_mask);
}

}  // namespace deepinfer_sm80
