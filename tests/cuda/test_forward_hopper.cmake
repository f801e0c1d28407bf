# The Hopper (flash3) forward tests; they allocate device memory themselves (CUDA runtime).
flashattn_add_test(test_cuda_forward_hopper test_forward_hopper.cpp)
target_link_libraries(test_cuda_forward_hopper PRIVATE CUDA::cudart_static)
# The Hopper forward with ALiBi and dropout (needs the CPU reference's ALiBi/dropout).
flashattn_add_test(test_cuda_forward_hopper_variants test_forward_hopper_variants.cpp)
target_link_libraries(test_cuda_forward_hopper_variants PRIVATE CUDA::cudart_static)
# attn_mask and block masks on the Hopper forward: its tile sizes against the masks' blocks.
flashattn_add_test(test_cuda_masks_hopper test_masks_hopper.cpp)
target_link_libraries(test_cuda_masks_hopper PRIVATE CUDA::cudart_static)
# The same suites with the persistent kernels' register epilogue (the default is the
# tile-overlap schedule: two Q buffers, O through shared memory to TMA stores, kernel.cuh):
# every test again, prefixed registers_epilogue.
foreach(hopper_test test_cuda_forward_hopper test_cuda_forward_hopper_variants test_cuda_masks_hopper)
  gtest_discover_tests(${hopper_test} DISCOVERY_TIMEOUT 120 TEST_PREFIX "registers_epilogue."
                       PROPERTIES ENVIRONMENT "FLASHATTN_CUDA_HOPPER_EPILOGUE=registers")
endforeach()
