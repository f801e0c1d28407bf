// One split-KV decode kernel: __nv_bfloat16, kernel head dim 256 (tensor-core and sm_90 TMA kernels; FMA build: 4 and 8 rows per CTA).
#include "src/cuda/decode/launch_decode.cuh"

namespace flashattn::cuda::decode {
template bool run_decode<__nv_bfloat16, 256>(const KVCacheParams&, cudaStream_t, DecodeKernelChoice);
}  // namespace flashattn::cuda::decode
