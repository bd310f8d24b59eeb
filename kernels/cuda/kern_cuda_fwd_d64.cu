/*
 * kern_cuda_fwd_d64.cu — the forward variants of head_dim 64 (kern_cuda_fwd.cuh). One translation
 * unit per head_dim so make -j builds them in parallel.
 */
#include "kern_cuda_fwd.cuh"

int kcuda::fwd_register_d64(FwdVariant (*v)[kNumShapes])
{
    return fwd_register<64>(v);
}
