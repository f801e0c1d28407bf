# The Hopper (flash3) forward tests; they allocate device memory themselves (CUDA runtime).
flashattn_add_test(test_cuda_forward_hopper test_forward_hopper.cpp)
target_link_libraries(test_cuda_forward_hopper PRIVATE CUDA::cudart_static)
# The Hopper forward with ALiBi and dropout (needs the CPU reference's ALiBi/dropout).
flashattn_add_test(test_cuda_forward_hopper_variants test_forward_hopper_variants.cpp)
target_link_libraries(test_cuda_forward_hopper_variants PRIVATE CUDA::cudart_static)
# attn_mask and block masks on the Hopper forward: its tile sizes against the masks' blocks.
flashattn_add_test(test_cuda_masks_hopper test_masks_hopper.cpp)
target_link_libraries(test_cuda_masks_hopper PRIVATE CUDA::cudart_static)
# The same two binaries again with the dropout keep masks drawn by the producer warpgroup
# (hopper/kernel.cuh's mask ring; the default draws them in the consumers): every
# dropout case, with and without attn_mask / block masks, on the other path.
gtest_discover_tests(test_cuda_forward_hopper_variants TEST_SUFFIX .producer_masks DISCOVERY_TIMEOUT 120
                     PROPERTIES ENVIRONMENT FLASHATTN_CUDA_HOPPER_DROPOUT=producer)
gtest_discover_tests(test_cuda_masks_hopper TEST_SUFFIX .producer_masks DISCOVERY_TIMEOUT 120
                     PROPERTIES ENVIRONMENT FLASHATTN_CUDA_HOPPER_DROPOUT=producer)
