// src/cuda/ptx/arch.cuh — which device code is being compiled: the one place the PTX
// wrappers and kernels ask for the instructions of a target.
//
//   FLASHATTN_HOPPER_DEVICE_CODE  sm_90a device code: the architecture-specific
//                                 ("a") features wgmma and setmaxnreg exist only there,
//                                 not on sm_90 nor on later architectures (PTX ISA
//                                 "Architecture-specific features"). The Hopper forward
//                                 and backward kernels compile their bodies under it.
//   FLASHATTN_SM90_DEVICE_CODE    sm_90 and newer: the tensor-map and bulk copies
//                                 (cp.async.bulk[.tensor], cp.reduce.async.bulk),
//                                 mbarrier transaction counts, thread-block clusters,
//                                 griddepcontrol (PDL), float2 atomicAdd. The decode
//                                 kernels and the FA2-class backward use those parts
//                                 under it (they use no wgmma), so a later GPU runs
//                                 them too; below, they take their sm_80 path.
// Both are 0 in host code (a Hopper kernel's body is then empty).
#pragma once

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FLASHATTN_HOPPER_DEVICE_CODE 1
#else
#define FLASHATTN_HOPPER_DEVICE_CODE 0
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define FLASHATTN_SM90_DEVICE_CODE 1
#else
#define FLASHATTN_SM90_DEVICE_CODE 0
#endif
