// Checks the scalar codecs of csrc/common against NVIDIA's reference conversions.
//
// Built twice by the tests:
//   * on the host (any machine with nvcc): compares float_to_e4m3_satfinite with the
//     software path of __nv_cvt_float_to_fp8 from cuda_fp8.hpp, e4m3_to_float with the
//     fp8 -> half conversion, and ue8m0_encode_absmax with the `_C` op's log2f formula,
//     over a stride of all 2^32 float bit patterns (STRIDE=1: exhaustive);
//   * for a GPU with FP8 conversion instructions (sm_89+), where the same loop runs on
//     the device against cvt.rn.satfinite.e4m3x2.f32 (the intrinsic's hardware path).
// Prints "OK <checked>" or the first mismatches and exits non-zero.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/fp8_e4m3.cuh"
#include "common/ue8m0.cuh"

using namespace deepinfer_sm80;

__host__ __device__ inline uint32_t ref_encode(float x) {
  return static_cast<uint32_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

__host__ __device__ inline uint32_t ref_decode_bits(uint32_t code) {
  __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), __NV_E4M3);
  __half hv(h);
  return float_to_bits(__half2float(hv));
}

// The `_C` op's exponent: ceilf(log2f(fmaxf(absmax, 1e-4f) / 448.0f)).
inline int ref_exponent(float absmax) {
  return static_cast<int>(std::ceil(std::log2((double)fmaxf(absmax, 1e-4f) / 448.0)));
}

__global__ void device_encode_check(uint64_t start, uint64_t stride, uint64_t n,
                                    unsigned long long* mismatches, uint32_t* first) {
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
       i += (uint64_t)gridDim.x * blockDim.x) {
    const uint32_t bits = static_cast<uint32_t>(start + i * stride);
    const float x = bits_to_float(bits);
    if (float_to_e4m3_satfinite(x) != ref_encode(x)) {
      if (atomicAdd(mismatches, 1ull) == 0) *first = bits;
    }
  }
}

int main(int argc, char** argv) {
  const uint64_t stride = argc > 1 ? strtoull(argv[1], nullptr, 10) : 1;
  const bool on_device = argc > 2 && std::strcmp(argv[2], "device") == 0;
  int bad = 0;

  // Decode: all 256 codes, exact bits (NaN codes: both NaN).
  for (uint32_t c = 0; c < 256; ++c) {
    const uint32_t got = float_to_bits(e4m3_to_float(c));
    const uint32_t want = ref_decode_bits(c);
    const bool both_nan = std::isnan(bits_to_float(got)) && std::isnan(bits_to_float(want));
    if (got != want && !both_nan) {
      if (bad++ < 10) printf("decode %02x: got %08x want %08x\n", c, got, want);
    }
  }
  // Encode(decode(c)) round trip on every non-NaN code.
  for (uint32_t c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    if (float_to_e4m3_satfinite(e4m3_to_float(c)) != c) {
      if (bad++ < 10) printf("roundtrip %02x failed\n", c);
    }
  }
  // UE8M0: integer exponent vs the log2f formula, over positive finite floats.
  uint64_t checked = 0;
  for (uint64_t b = 0; b < 0x7F800000ull; b += stride * 7 + 1) {
    const float a = bits_to_float(static_cast<uint32_t>(b));
    const Ue8m0Scale s = ue8m0_encode_absmax(a);
    const int e = ref_exponent(a);
    const uint32_t want_byte = static_cast<uint32_t>(std::min(std::max(e + 127, 0), 255));
    if (s.byte != want_byte || s.inv_scale != std::ldexp(1.0f, -e)) {
      if (bad++ < 10) printf("ue8m0 absmax %a: got %u want %u\n", a, s.byte, want_byte);
    }
  }

  if (!on_device) {
    // Encode on the host: software path of the intrinsic.
    for (uint64_t b = 0; b < (1ull << 32); b += stride) {
      const float x = bits_to_float(static_cast<uint32_t>(b));
      ++checked;
      if (float_to_e4m3_satfinite(x) != ref_encode(x)) {
        if (bad++ < 10)
          printf("encode %08x (%a): got %02x want %02x\n", (uint32_t)b, x,
                 float_to_e4m3_satfinite(x), ref_encode(x));
      }
    }
  } else {
    unsigned long long* d_mis;
    uint32_t* d_first;
    cudaMalloc(&d_mis, sizeof(*d_mis));
    cudaMalloc(&d_first, sizeof(*d_first));
    cudaMemset(d_mis, 0, sizeof(*d_mis));
    const uint64_t n = ((1ull << 32) + stride - 1) / stride;
    device_encode_check<<<4096, 256>>>(0, stride, n, d_mis, d_first);
    unsigned long long mis = 0;
    uint32_t first = 0;
    cudaMemcpy(&mis, d_mis, sizeof(mis), cudaMemcpyDeviceToHost);
    cudaMemcpy(&first, d_first, sizeof(first), cudaMemcpyDeviceToHost);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) {
      printf("CUDA error: %s\n", cudaGetErrorString(err));
      return 2;
    }
    checked = n;
    if (mis) {
      printf("device encode: %llu mismatches, first %08x\n", mis, first);
      bad += 1;
    }
  }
  if (bad) {
    printf("FAIL %d\n", bad);
    return 1;
  }
  printf("OK %llu\n", (unsigned long long)checked);
  return 0;
}
