// 16/8-byte vector memory access and 64-bit address helpers shared by the kernels.
//
// ld_nc_*: read-only loads through the non-coherent path (ld.global.nc); only for data
// that no thread writes during the kernel. ld_*: plain loads. st_*: plain stores.
// All pointers must be naturally aligned (16 B for v4, 8 B for v2); the torch-facing
// launchers check alignment before choosing a vectorised kernel.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

namespace deepinfer_sm80 {

// Read-only global loads. kL2Hint: with the L2 prefetch-size hint (PTX ISA 7.4, sm_80+),
// on a miss the L2 fetches the whole aligned 256-byte block around the address.
template <bool kL2Hint = false>
__device__ __forceinline__ uint4 ld_nc_v4(const void* p) {
  uint4 v;
  if constexpr (kL2Hint) {
    asm volatile("ld.global.nc.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
  } else {
    asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
  }
  return v;
}

// L2 eviction-priority cache policies (createpolicy, PTX ISA 7.4, sm_80+) and loads / stores
// that carry one (.L2::cache_hint): a whole-line hint of how long the line should stay in L2.
__device__ __forceinline__ uint64_t l2_policy_evict_first() {
  uint64_t pol;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}
__device__ __forceinline__ uint2 ld_nc_v2_pol(const void* p, uint64_t pol) {
  uint2 v;
  asm volatile("ld.global.nc.L2::cache_hint.L2::256B.v2.u32 {%0, %1}, [%2], %3;"
               : "=r"(v.x), "=r"(v.y) : "l"(p), "l"(pol));
  return v;
}
__device__ __forceinline__ uint4 ld_nc_v4_pol(const void* p, uint64_t pol) {
  uint4 v;
  asm volatile("ld.global.nc.L2::cache_hint.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p), "l"(pol));
  return v;
}
__device__ __forceinline__ void st_v4_pol(void* p, uint4 v, uint64_t pol) {
  asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1, %2, %3, %4}, %5;"
               :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "l"(pol) : "memory");
}

template <bool kL2Hint = false>
__device__ __forceinline__ uint2 ld_nc_v2(const void* p) {
  uint2 v;
  if constexpr (kL2Hint) {
    asm volatile("ld.global.nc.L2::256B.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  } else {
    asm volatile("ld.global.nc.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  }
  return v;
}

__device__ __forceinline__ uint32_t ld_nc_u32(const void* p) {
  uint32_t v;
  asm volatile("ld.global.nc.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}

// Streaming read-only load that does not allocate in L1 (data read exactly once).
__device__ __forceinline__ uint4 ld_nc_na_v4(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ uint4 ld_v4(const void* p) {
  return *reinterpret_cast<const uint4*>(p);
}

__device__ __forceinline__ void st_v4(void* p, uint4 v) {
  *reinterpret_cast<uint4*>(p) = v;
}

__device__ __forceinline__ void st_v2(void* p, uint2 v) {
  *reinterpret_cast<uint2*>(p) = v;
}

// Streaming store (evict-first): output written once and not re-read by this kernel.
__device__ __forceinline__ void st_cs_v4(void* p, uint4 v) {
  asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};"
               :
               : "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

// 64-bit byte offset helpers: always widen before multiplying.
__host__ __device__ __forceinline__ int64_t mul64(int64_t a, int64_t b) { return a * b; }

template <typename T>
__host__ __device__ __forceinline__ T* byte_offset(T* p, int64_t bytes) {
  return reinterpret_cast<T*>(reinterpret_cast<char*>(p) + bytes);
}
template <typename T>
__host__ __device__ __forceinline__ const T* byte_offset(const T* p, int64_t bytes) {
  return reinterpret_cast<const T*>(reinterpret_cast<const char*>(p) + bytes);
}

__host__ __device__ __forceinline__ bool is_aligned(const void* p, int bytes) {
  return (reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes)) == 0;
}

}  // namespace deepinfer_sm80
