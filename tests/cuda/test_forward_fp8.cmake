# The FP8 (e4m3) Hopper forward kernel (src/cuda/hopper_fp8), called directly on
# hand-built params against a float64 reference; skips without an sm_90 device.
flashattn_add_test(test_cuda_forward_fp8 test_forward_fp8.cpp)
target_link_libraries(test_cuda_forward_fp8 PRIVATE CUDA::cudart_static)
# The wide key tiles through the process default (FLASHATTN_CUDA_FP8_BLOCK_N, read once by
# default_schedule; the OverlapN* suites name the schedules themselves): the public-API suite
# again, prefixes fp8_block_n160_224. (d64 at 160, d128 at 224) and fp8_block_n192. (d128).
gtest_discover_tests(test_cuda_forward_fp8 DISCOVERY_TIMEOUT 120 TEST_PREFIX "fp8_block_n160_224."
                     TEST_FILTER "*HopperFp8PublicApi*" PROPERTIES ENVIRONMENT "FLASHATTN_CUDA_FP8_BLOCK_N=160,224")
gtest_discover_tests(test_cuda_forward_fp8 DISCOVERY_TIMEOUT 120 TEST_PREFIX "fp8_block_n192."
                     TEST_FILTER "*HopperFp8PublicApi*" PROPERTIES ENVIRONMENT "FLASHATTN_CUDA_FP8_BLOCK_N=192")
