# The FP8 (e4m3) Hopper forward kernel (src/cuda/hopper_fp8), called directly on
# hand-built params against a float64 reference; skips without an sm_90 device.
flashattn_add_test(test_cuda_forward_fp8 test_forward_fp8.cpp)
target_link_libraries(test_cuda_forward_fp8 PRIVATE CUDA::cudart_static)
# d128's wide key tiles through the process default (FLASHATTN_CUDA_FP8_BLOCK_N, read once by
# default_schedule): the public-API suite again, prefixes fp8_block_n192. and fp8_block_n224.
# (the OverlapN192/OverlapN224 suites name the schedules themselves).
foreach(block_n 192 224)
  gtest_discover_tests(test_cuda_forward_fp8 DISCOVERY_TIMEOUT 120 TEST_PREFIX "fp8_block_n${block_n}."
                       TEST_FILTER "*HopperFp8PublicApi*" PROPERTIES ENVIRONMENT "FLASHATTN_CUDA_FP8_BLOCK_N=${block_n}")
endforeach()
