// One split-KV decode kernel over an FP8 (e4m3) cache: q/out __half, kernel head dim 256 (kernel_mma_fp8.cuh).
#include "src/cuda/decode/launch_decode_fp8.cuh"

namespace flashattn::cuda::decode {
template bool run_decode_fp8<__half, 256>(const KVCacheParams&, cudaStream_t);
}  // namespace flashattn::cuda::decode
