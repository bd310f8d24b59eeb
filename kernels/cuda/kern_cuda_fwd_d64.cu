/*
 * kern_cuda_fwd_d64.cu — the forward kernel of head_dim 64 (kern_cuda_fwd.cuh). One translation
 * unit per head_dim so make -j builds them in parallel.
 */
#include "kern_cuda_fwd.cuh"

int kcuda::fwd_register_d64(FwdVariant (&v)[2])
{
    return fwd_register_dim<64>(v);
}
