/*
 * kern_cuda_fwd_d256.cu — the forward variants of head_dim 256: fp16 and bf16 x every shape of
 * KCUDA_SHAPES that fits in shared memory. One translation unit per head_dim so make -j builds
 * them in parallel.
 */
#include "kern_cuda_fwd.cuh"

namespace kcuda
{

template <typename T, int M, int N> static int reg(FwdVariant *v)
{
    if constexpr (Geom<256, M, N>::SMEM <= kMaxSmem)
        return fwd_prepare<T, 256, M, N>(v);
    v->fn = nullptr; /* does not fit: not compiled */
    return 0;
}

int fwd_register_d256(FwdVariant (*v)[kNumShapes])
{
    int r = 0, i = 0;
#define KCUDA_REG(m, n)                                                                            \
    if (r == 0)                                                                                    \
        r = reg<__half, m, n>(&v[0][i]);                                                           \
    if (r == 0)                                                                                    \
        r = reg<__nv_bfloat16, m, n>(&v[1][i]);                                                    \
    i++;
    KCUDA_SHAPES(KCUDA_REG)
#undef KCUDA_REG
    return r;
}

} // namespace kcuda
