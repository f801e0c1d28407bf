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
# The persistent kernels' late-claim tile queue (FLASHATTN_CUDA_HOPPER_TILE_QUEUE, launch.hpp):
# with the named marks under both epilogues (the storer is a reader only in the tile-overlap
# one), on the mbarrier queue alone on the main suite. Prefixes late_claim.,
# late_claim_registers., late_claim_mbarrier.
foreach(hopper_test test_cuda_forward_hopper test_cuda_forward_hopper_variants test_cuda_masks_hopper)
  gtest_discover_tests(${hopper_test} DISCOVERY_TIMEOUT 120 TEST_PREFIX "late_claim."
                       PROPERTIES ENVIRONMENT "FLASHATTN_CUDA_HOPPER_TILE_QUEUE=late_claim")
endforeach()
# A second variable goes in ENVIRONMENT_MODIFICATION (CMake 3.22): PROPERTIES is flattened
# into set_tests_properties' arguments, so ENVIRONMENT keeps one entry.
gtest_discover_tests(test_cuda_forward_hopper DISCOVERY_TIMEOUT 120 TEST_PREFIX "late_claim_registers."
                     PROPERTIES ENVIRONMENT "FLASHATTN_CUDA_HOPPER_TILE_QUEUE=late_claim"
                                ENVIRONMENT_MODIFICATION "FLASHATTN_CUDA_HOPPER_EPILOGUE=set:registers")
gtest_discover_tests(test_cuda_forward_hopper DISCOVERY_TIMEOUT 120 TEST_PREFIX "late_claim_mbarrier."
                     PROPERTIES ENVIRONMENT "FLASHATTN_CUDA_HOPPER_TILE_QUEUE=late_claim_mbarrier")
# Short masked problems on the unmasked config (FLASHATTN_CUDA_HOPPER_SHORT_MASKED_TILES=unmasked:
# d64 causal/local/varlen up to 2k on block_m 192), with the late claim: prefix short_masked_unmasked.
foreach(hopper_test test_cuda_forward_hopper test_cuda_forward_hopper_variants)
  gtest_discover_tests(${hopper_test} DISCOVERY_TIMEOUT 120 TEST_PREFIX "short_masked_unmasked."
                       PROPERTIES ENVIRONMENT "FLASHATTN_CUDA_HOPPER_SHORT_MASKED_TILES=unmasked"
                                  ENVIRONMENT_MODIFICATION "FLASHATTN_CUDA_HOPPER_TILE_QUEUE=set:late_claim")
endforeach()
