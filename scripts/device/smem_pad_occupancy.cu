// Resident 32-thread blocks per SM for a given dynamic shared-memory pad (what
// $DEEPINFER_GATHER_SMEM_PAD does to the gather's tile blocks), on the GPU this runs on.
//   nvcc -o /tmp/occ scripts/device/smem_pad_occupancy.cu && /tmp/occ 0 13312
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

__global__ void one_warp_block(int* p) {
  if (p != nullptr) p[threadIdx.x] = 0;
}

int main(int argc, char** argv) {
  int smem_sm = 0, reserved = 0;
  cudaDeviceGetAttribute(&smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, 0);
  cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, 0);
  std::printf("shared memory per SM %d B, reserved per block %d B\n", smem_sm, reserved);
  for (int i = 1; i < argc; ++i) {
    const int pad = std::atoi(argv[i]);
    int n = 0;
    const cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, one_warp_block, 32, pad);
    std::printf("pad %6d B: %d resident one-warp blocks per SM (%s)\n", pad, n, cudaGetErrorString(e));
  }
  return 0;
}
