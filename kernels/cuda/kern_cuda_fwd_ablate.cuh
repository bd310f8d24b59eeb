/*
 * kern_cuda_fwd_ablate.cuh — the timing ablations of the pair kernel, for tests/gpu/ablate.sh only:
 * its builds compile the backend with nvcc -DKCUDA_ABLATE=i (1 to 4, a WsAblate), which makes
 * kern_cuda_fwd.cuh include this header and register fwd_pair<T, D, WsAblate(i)> where it
 * registers fwd_pair<T, D> (WS_FULL). The shipped build never includes it, so it instantiates no
 * ablation. The ablated kernels' outputs are wrong by design; only their times mean anything.
 */
#ifndef KERN_CUDA_FWD_ABLATE_CUH
#define KERN_CUDA_FWD_ABLATE_CUH

#if !defined(KCUDA_ABLATE) || KCUDA_ABLATE < 1 || KCUDA_ABLATE > 4
#error "kern_cuda_fwd_ablate.cuh: tests/gpu/ablate.sh's builds only, with KCUDA_ABLATE 1 to 4"
#endif

namespace kcuda
{

template <typename T, int D, int KV> constexpr auto pair_kernel()
{
    return fwd_pair<T, D, static_cast<WsAblate>(KCUDA_ABLATE), KV>;
}

} // namespace kcuda

#endif
