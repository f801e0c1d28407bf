# The Hopper (flash3) forward tests; they allocate device memory themselves (CUDA runtime).
flashattn_add_test(test_cuda_forward_hopper test_forward_hopper.cpp)
target_link_libraries(test_cuda_forward_hopper PRIVATE CUDA::cudart_static)
