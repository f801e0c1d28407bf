# The FP8 (e4m3) Hopper forward kernel (src/cuda/hopper_fp8), called directly on
# hand-built params against a float64 reference; skips without an sm_90 device.
flashattn_add_test(test_cuda_forward_fp8 test_forward_fp8.cpp)
target_link_libraries(test_cuda_forward_fp8 PRIVATE CUDA::cudart_static)
