/*
 * kern_cuda_fwd_d128.cu — the forward kernel of head_dim 128 (kern_cuda_fwd.cuh). One translation
 * unit per head_dim so make -j builds them in parallel.
 */
#include "kern_cuda_fwd.cuh"

int kcuda::fwd_register_d128(FwdVariant (&v)[2])
{
    return fwd_register_dim<128>(v);
}
