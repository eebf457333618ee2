// A CPU op whose TORCH_CHECK fails: does a plain extension built with our flags raise? (cpp_errors.sh)
#include <ATen/ATen.h>
#include <torch/library.h>
void boom(const at::Tensor& x) { TORCH_CHECK(x.dim() == 5, "boom: x must be 5-D, got ", x.sizes()); }
TORCH_LIBRARY(errt, m) { m.def("boom(Tensor x) -> ()"); }
TORCH_LIBRARY_IMPL(errt, CPU, m) { m.impl("boom", &boom); }
