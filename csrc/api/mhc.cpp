// Torch-facing op of the mHC kernels (argument checks + launch only).
//   deepinfer_sm80::hc_prenorm_gemm   (out variant: out [n_splits, T, 24], sqrsum [n_splits, T])
#include "api/api_utils.h"
#include "mhc/mhc_kernels.h"

namespace deepinfer_sm80 {
namespace {

void hc_prenorm_gemm(const at::Tensor& x, const at::Tensor& fn, at::Tensor& out,
                     at::Tensor& sqrsum, int64_t sm_count) {
  const at::Device dev = x.device();
  api::check_cuda(x, "x", dev);
  api::check_dtype(x, "x", at::kBFloat16);
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, "x must be [num_tokens, K] with a contiguous "
              "last dim, got sizes ", x.sizes(), " strides ", x.strides());
  TORCH_CHECK(x.size(0) <= 1 || x.stride(0) % 8 == 0, "x's row stride must be a multiple of "
              "8 elements (16 bytes), got ", x.stride(0));
  TORCH_CHECK(api::aligned16(x.data_ptr()), "x must start 16-byte aligned");
  const int64_t T = x.size(0), K = x.size(1);
  api::check_cuda(fn, "fn", dev);
  api::check_dtype(fn, "fn", at::kFloat);
  TORCH_CHECK(fn.dim() == 2 && fn.size(0) == mhc::kPrenormN && fn.size(1) == K &&
                  fn.is_contiguous(),
              "fn must be a contiguous [", mhc::kPrenormN, ", K=", K, "] float32 tensor, got ",
              fn.sizes());
  TORCH_CHECK(api::aligned16(fn.data_ptr()), "fn must start 16-byte aligned");
  api::check_cuda(out, "out", dev);
  api::check_dtype(out, "out", at::kFloat);
  TORCH_CHECK(out.dim() == 3 && out.size(1) == T && out.size(2) == mhc::kPrenormN &&
                  out.is_contiguous(),
              "out must be a contiguous [n_splits, num_tokens, ", mhc::kPrenormN,
              "] float32 tensor, got ", out.sizes());
  TORCH_CHECK(reinterpret_cast<uintptr_t>(out.data_ptr()) % 8 == 0,
              "out must start 8-byte aligned (the kernel stores float2 pairs)");
  const int64_t n_splits = out.size(0);
  TORCH_CHECK(n_splits >= 1 && n_splits <= mhc::kPrenormMaxSplits,
              "n_splits (out.size(0)) must be in [1, ", mhc::kPrenormMaxSplits, "], got ", n_splits);
  TORCH_CHECK(K % mhc::kPrenormBK == 0 && K > 0, "K (", K, ") must be a positive multiple of ",
              mhc::kPrenormBK);
  TORCH_CHECK(n_splits <= K / mhc::kPrenormBK, "n_splits (", n_splits, ") must be at most K / ",
              mhc::kPrenormBK, " = ", K / mhc::kPrenormBK);
  api::check_cuda(sqrsum, "sqrsum", dev);
  api::check_dtype(sqrsum, "sqrsum", at::kFloat);
  TORCH_CHECK(sqrsum.dim() == 2 && sqrsum.size(0) == n_splits && sqrsum.size(1) == T &&
                  sqrsum.is_contiguous(),
              "sqrsum must be a contiguous [n_splits, num_tokens] float32 tensor, got ",
              sqrsum.sizes());
  TORCH_CHECK(T < (int64_t{1} << 31) && K < (int64_t{1} << 31), "too many tokens or columns");
  if (T == 0) return;
  c10::cuda::CUDAGuard guard(dev);
  mhc::PrenormGemmParams p;
  p.x = x.data_ptr();
  p.fn = fn.data_ptr<float>();
  p.out = out.data_ptr<float>();
  p.sqrsum = sqrsum.data_ptr<float>();
  p.x_stride = x.stride(0);
  p.num_tokens = static_cast<int>(T);
  p.k = static_cast<int>(K);
  p.n_splits = static_cast<int>(n_splits);
  mhc::launch_prenorm_gemm(p, api::limits(dev.index(), sm_count), api::stream());
  api::check_launch();
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(deepinfer_sm80, m) {
  m.def(
      "hc_prenorm_gemm(Tensor x, Tensor fn, Tensor(a!) out, Tensor(b!) sqrsum, "
      "int sm_count=0) -> ()");
}

TORCH_LIBRARY_IMPL(deepinfer_sm80, CUDA, m) { m.impl("hc_prenorm_gemm", &hc_prenorm_gemm); }

}  // namespace deepinfer_sm80
