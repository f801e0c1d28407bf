# The CUDA backward tests (included from tests/cuda/CMakeLists.txt). They allocate
# device memory themselves, so they link the CUDA runtime.
find_package(CUDAToolkit REQUIRED)
flashattn_add_test(test_cuda_backward test_backward.cpp)
target_link_libraries(test_cuda_backward PRIVATE CUDA::cudart_static)
