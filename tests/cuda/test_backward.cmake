# The CUDA backward tests (included from tests/cuda/CMakeLists.txt). They allocate
# device memory themselves, so they link the CUDA runtime.
find_package(CUDAToolkit REQUIRED)
flashattn_add_test(test_cuda_backward test_backward.cpp)
target_link_libraries(test_cuda_backward PRIVATE CUDA::cudart_static)
# Host-only: the dK/dV kernel's shared-memory addressing for every tile-table entry.
flashattn_add_test(test_cuda_backward_layout test_backward_layout.cpp)
target_include_directories(test_cuda_backward_layout PRIVATE ${PROJECT_SOURCE_DIR}/include)
# Host-only: the deterministic Hopper backward's dQ turns (key blocks of a query block)
# against the query blocks each key block's CTA visits, by brute force over many masks.
flashattn_add_test(test_cuda_hopper_bwd_dq_order test_hopper_bwd_dq_order.cpp)
target_include_directories(test_cuda_hopper_bwd_dq_order PRIVATE ${PROJECT_SOURCE_DIR}/include)
# The Hopper backward kernel (src/cuda/hopper_bwd) at its head dim, through the public API.
flashattn_add_test(test_cuda_backward_hopper test_backward_hopper.cpp)
target_link_libraries(test_cuda_backward_hopper PRIVATE CUDA::cudart_static)
# The backward configs of GPUs with less shared memory (A100, sm_86/sm_89), run on this
# GPU under a capped limit; FA2-class kernels only.
flashattn_add_test(test_cuda_backward_small_smem test_backward_small_smem.cpp)
target_link_libraries(test_cuda_backward_small_smem PRIVATE CUDA::cudart_static)
# The sm80 backward kernels with ALiBi and dropout (the Hopper backward switched off).
flashattn_add_test(test_cuda_backward_variants test_backward_variants.cpp)
target_link_libraries(test_cuda_backward_variants PRIVATE CUDA::cudart_static)
# The Hopper backward kernels under device masks (attn_mask, dBias, deterministic turns).
flashattn_add_test(test_cuda_masks_hopper_bwd test_masks_hopper_bwd.cpp)
target_link_libraries(test_cuda_masks_hopper_bwd PRIVATE CUDA::cudart_static)
# The same Hopper backward cases with kernel.cuh's lockstep schedule (the default is the
# overlapped one; FLASHATTN_CUDA_HOPPER_BWD_SCHEDULE=lockstep is read once per process:
# hence a second registration of each binary, ctest names prefixed "lockstep."), and the Hopper cases
# with the L2-section CTA order ("l2_order.", FLASHATTN_CUDA_HOPPER_BWD_ORDER=l2_sections:
# the deterministic turns under the other order, all three kernels).
foreach(lockstep_test test_cuda_backward_hopper test_cuda_backward test_cuda_masks_hopper_bwd)
  gtest_discover_tests(${lockstep_test} DISCOVERY_TIMEOUT 120 TEST_PREFIX "lockstep."
                       PROPERTIES ENVIRONMENT "FLASHATTN_CUDA_HOPPER_BWD_SCHEDULE=lockstep")
endforeach()
gtest_discover_tests(test_cuda_backward_hopper DISCOVERY_TIMEOUT 120 TEST_PREFIX "l2_order."
                     PROPERTIES ENVIRONMENT "FLASHATTN_CUDA_HOPPER_BWD_ORDER=l2_sections")
# The experimental deferred_dk schedule (d128, default mode; elsewhere it runs overlapped).
gtest_discover_tests(test_cuda_backward_hopper DISCOVERY_TIMEOUT 120 TEST_PREFIX "deferred_dk."
                     PROPERTIES ENVIRONMENT "FLASHATTN_CUDA_HOPPER_BWD_SCHEDULE=deferred_dk")
# The early dQ hand-off of the overlapped schedules (FLASHATTN_CUDA_HOPPER_BWD_DQ_HANDOFF=early,
# hopper_bwd/kernel.cuh: a step's kDqFull arrival right after its dQ stores; the default, late,
# arrives after the next step's S^T/dP^T issue): every Hopper case in the overlapped and
# deferred_dk schedules ("dq_handoff_early.", "dq_handoff_early_deferred_dk.") and the
# device-mask cases (listed steps, deterministic turns). The late one under many tiles per CTA
# runs in the "*_grid_3ctas" copies below. `ctest -R '^dq_handoff_early'` runs them all.
foreach(early_test test_cuda_backward_hopper test_cuda_masks_hopper_bwd)
  gtest_discover_tests(${early_test} DISCOVERY_TIMEOUT 120 TEST_PREFIX "dq_handoff_early."
                       PROPERTIES ENVIRONMENT "FLASHATTN_CUDA_HOPPER_BWD_DQ_HANDOFF=early")
endforeach()
gtest_discover_tests(test_cuda_backward_hopper DISCOVERY_TIMEOUT 120 TEST_PREFIX "dq_handoff_early_deferred_dk."
                     PROPERTIES ENVIRONMENT "FLASHATTN_CUDA_HOPPER_BWD_DQ_HANDOFF=early;FLASHATTN_CUDA_HOPPER_BWD_SCHEDULE=deferred_dk")
# The backward cases with the separate preprocess/dQ-conversion passes ("separate_passes.",
# FLASHATTN_CUDA_HOPPER_BWD_PASSES=separate: memsets, 2/4-byte-access kernels; the default
# is the fused passes; the FA2-class cases of test_cuda_backward run them too).
foreach(separate_test test_cuda_backward_hopper test_cuda_backward test_cuda_masks_hopper_bwd)
  gtest_discover_tests(${separate_test} DISCOVERY_TIMEOUT 120 TEST_PREFIX "separate_passes."
                       PROPERTIES ENVIRONMENT "FLASHATTN_CUDA_HOPPER_BWD_PASSES=separate")
endforeach()
# kernel.cuh's persistent grid (FLASHATTN_CUDA_HOPPER_BWD_GRID=persistent: one CTA per SM,
# each looping over tiles): every Hopper backward case again ("persistent_grid." prefix), and
# under a grid of 3 CTAs (FLASHATTN_CUDA_HOPPER_BWD_GRID_CTAS=3: every CTA runs many tiles)
# in each schedule, one ctest test per binary (two or three variables: set_tests_properties
# takes the list as it is). `ctest -R '^persistent_grid'` runs them all.
foreach(persistent_test test_cuda_backward_hopper test_cuda_backward test_cuda_masks_hopper_bwd)
  gtest_discover_tests(${persistent_test} DISCOVERY_TIMEOUT 120 TEST_PREFIX "persistent_grid."
                       PROPERTIES ENVIRONMENT "FLASHATTN_CUDA_HOPPER_BWD_GRID=persistent")
endforeach()
foreach(persistent_test test_cuda_backward_hopper test_cuda_masks_hopper_bwd)
  foreach(schedule overlapped lockstep deferred_dk)
    set(persistent_name "persistent_grid_3ctas.${schedule}.${persistent_test}")
    add_test(NAME ${persistent_name} COMMAND ${persistent_test})
    set_tests_properties(${persistent_name} PROPERTIES ENVIRONMENT
                         "FLASHATTN_CUDA_HOPPER_BWD_GRID=persistent;FLASHATTN_CUDA_HOPPER_BWD_GRID_CTAS=3;FLASHATTN_CUDA_HOPPER_BWD_SCHEDULE=${schedule}")
  endforeach()
endforeach()
# The same with the dynamic grid (FLASHATTN_CUDA_HOPPER_BWD_GRID=dynamic: the CTAs claim tiles
# from the workspace's counter, in the L2-section order): "dynamic_grid." and
# "dynamic_grid_3ctas.<schedule>.<binary>"; `ctest -R '^dynamic_grid'` runs them all.
foreach(dynamic_test test_cuda_backward_hopper test_cuda_backward test_cuda_masks_hopper_bwd)
  gtest_discover_tests(${dynamic_test} DISCOVERY_TIMEOUT 120 TEST_PREFIX "dynamic_grid."
                       PROPERTIES ENVIRONMENT "FLASHATTN_CUDA_HOPPER_BWD_GRID=dynamic")
endforeach()
foreach(dynamic_test test_cuda_backward_hopper test_cuda_masks_hopper_bwd)
  foreach(schedule overlapped lockstep deferred_dk)
    set(dynamic_name "dynamic_grid_3ctas.${schedule}.${dynamic_test}")
    add_test(NAME ${dynamic_name} COMMAND ${dynamic_test})
    set_tests_properties(${dynamic_name} PROPERTIES ENVIRONMENT
                         "FLASHATTN_CUDA_HOPPER_BWD_GRID=dynamic;FLASHATTN_CUDA_HOPPER_BWD_GRID_CTAS=3;FLASHATTN_CUDA_HOPPER_BWD_SCHEDULE=${schedule}")
  endforeach()
endforeach()
# The dK/dV epilogue through shared memory and TMA stores (FLASHATTN_CUDA_HOPPER_BWD_EPILOGUE=tma,
# hopper_bwd/kernel.cuh; the default stores them from registers): every Hopper backward case
# again ("epilogue_tma." prefix), deferred_dk's ("epilogue_tma_deferred_dk."), and under grids
# of 3 CTAs (many tiles per CTA: the staging stage and dS^T rows handed back between tiles) in
# both schedules that have it. `ctest -R '^epilogue_tma'` runs them all.
foreach(epilogue_test test_cuda_backward_hopper test_cuda_backward test_cuda_masks_hopper_bwd)
  gtest_discover_tests(${epilogue_test} DISCOVERY_TIMEOUT 120 TEST_PREFIX "epilogue_tma."
                       PROPERTIES ENVIRONMENT "FLASHATTN_CUDA_HOPPER_BWD_EPILOGUE=tma")
endforeach()
gtest_discover_tests(test_cuda_backward_hopper DISCOVERY_TIMEOUT 120 TEST_PREFIX "epilogue_tma_deferred_dk."
                     PROPERTIES ENVIRONMENT "FLASHATTN_CUDA_HOPPER_BWD_EPILOGUE=tma;FLASHATTN_CUDA_HOPPER_BWD_SCHEDULE=deferred_dk")
foreach(epilogue_test test_cuda_backward_hopper test_cuda_masks_hopper_bwd)
  foreach(grid persistent dynamic)
    foreach(schedule overlapped deferred_dk)
      set(epilogue_name "epilogue_tma_${grid}_grid_3ctas.${schedule}.${epilogue_test}")
      add_test(NAME ${epilogue_name} COMMAND ${epilogue_test})
      set_tests_properties(${epilogue_name} PROPERTIES ENVIRONMENT
                           "FLASHATTN_CUDA_HOPPER_BWD_EPILOGUE=tma;FLASHATTN_CUDA_HOPPER_BWD_GRID=${grid};FLASHATTN_CUDA_HOPPER_BWD_GRID_CTAS=3;FLASHATTN_CUDA_HOPPER_BWD_SCHEDULE=${schedule}")
    endforeach()
  endforeach()
endforeach()
# Dropout's draws made by each warp that uses them (FLASHATTN_CUDA_HOPPER_BWD_DROPOUT_DRAW=twice;
# the default makes each once per step, hopper_bwd/kernel.cuh's draw exchange): the Hopper backward's
# dropout cases in each schedule (the masks' backward suites: tests/cuda/CMakeLists.txt),
# compared with the CPU element by element as in the default. `ctest -R '^dropout_draw_twice'`.
gtest_discover_tests(test_cuda_backward_hopper DISCOVERY_TIMEOUT 120 TEST_PREFIX "dropout_draw_twice."
                     TEST_FILTER "*Dropout*" PROPERTIES ENVIRONMENT "FLASHATTN_CUDA_HOPPER_BWD_DROPOUT_DRAW=twice")
foreach(schedule lockstep deferred_dk)
  gtest_discover_tests(test_cuda_backward_hopper DISCOVERY_TIMEOUT 120 TEST_PREFIX "dropout_draw_twice_${schedule}."
                       TEST_FILTER "*Dropout*" PROPERTIES ENVIRONMENT
                       "FLASHATTN_CUDA_HOPPER_BWD_DROPOUT_DRAW=twice;FLASHATTN_CUDA_HOPPER_BWD_SCHEDULE=${schedule}")
endforeach()
