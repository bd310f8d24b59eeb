/*
 * patload_compute.c — patload's stand-in for a frontend's model compute (patload_compute.h).
 *
 * The gpu stand-in reaches the CUDA driver through libpat's shim (pat_cuda_shim.h) and cuBLAS
 * (libcublas.so.13/.12) with dlopen, declaring the few types and constants of cuBLAS it uses
 * (values from the CUDA 12/13 ABI), so patload builds without the CUDA toolkit and runs on
 * machines without a GPU. It works in the
 * primary context of the GPU that holds the staging buffers (the context libpat and the runtime
 * use) on a non-blocking stream of its own. One set of random weights serves every layer: each
 * layer still streams all of them from device memory (hundreds of MB for a 7B-class shape against
 * a 50 MB L2), which is what the real model's layers cost.
 */
#include "patload_compute.h"

#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pat_base.h"
#include "pat_cuda_shim.h"
#include "pat_half.h"
#include "patload_trace.h" /* pl_fail */

#define POOL_ELEMS (1u << 20) /* random values the cpu stand-in copies Q/K/V rows from */

typedef struct cublasContext *cublasHandle_t;

#define CUDA_R_32F          0
#define CUDA_R_16F          2
#define CUDA_R_16BF         14
#define CUBLAS_COMPUTE_32F  68
#define CUBLAS_GEMM_DEFAULT (-1)
#define CUBLAS_OP_N         0

#define CUBLAS_FUNCS(X)                                                                            \
    X(create, "cublasCreate_v2", (cublasHandle_t *))                                               \
    X(destroy, "cublasDestroy_v2", (cublasHandle_t))                                               \
    X(set_stream, "cublasSetStream_v2", (cublasHandle_t, CUstream))                                \
    X(gemm, "cublasGemmEx",                                                                        \
      (cublasHandle_t, int, int, int, int, int, const void *, const void *, int, int,              \
       const void *, int, int, const void *, void *, int, int, int, int))

#define DECL(name, sym, args) int(*name) args;
typedef struct cublas_api {
    CUBLAS_FUNCS(DECL)
} cublas_api_t;
#undef DECL

/* device buffers of the gpu stand-in (one weight set, reused by every layer) */
enum { W_Q, W_K, W_V, W_O, W_GATE, W_UP, W_DOWN, A_X, A_Y, A_G, A_U, A_D, N_BUF };

struct pl_compute {
    pl_compute_cfg_t cfg;
    pat_conn_t *conn;
    pat_buffers_t buf;
    double flops_tok; /* per layer */
    double pre_share; /* QKV part of flops_tok */
    /* cpu */
    uint8_t *pool;
    size_t pool_bytes, pool_off;
    /* gpu */
    void *blas_lib;
    const pat__cu_api_t *cu; /* the driver (pat_cuda_shim.h) */
    cublas_api_t blas;
    CUdevice dev;
    CUcontext ctx;
    CUstream stream;
    cublasHandle_t handle;
    CUdeviceptr d[N_BUF];
    char dev_name[128];
};

const char *pl_compute_name(pl_compute_kind_t k)
{
    return k == PL_COMPUTE_CPU ? "cpu" : k == PL_COMPUTE_GPU ? "gpu" : "none";
}

const char *pl_compute_device(const pl_compute_t *pc)
{
    return pc ? pc->dev_name : "";
}

/* FLOPs of one layer's GEMMs per token (QKV, O, MLP). */
static double flops_per_token(const pl_compute_cfg_t *c)
{
    double h = c->hidden, qd = (double)c->q_heads * c->head_dim,
           kvd = (double)c->kv_heads * c->head_dim;
    return 2.0 * h * (qd + 2 * kvd) + 2.0 * qd * h + 3 * 2.0 * h * c->ffn;
}

static uint32_t elem_bytes(uint32_t dtype)
{
    return dtype == PAT_F32 ? 4 : 2;
}

/* element i of an array of the model dtype (PAT_F16, PAT_BF16, PAT_F32) set to v */
static void store_elem(uint32_t dtype, void *dst, size_t i, float v)
{
    if (dtype == PAT_F16)
        ((uint16_t *)dst)[i] = pat_f32_to_f16(v);
    else if (dtype == PAT_BF16)
        ((uint16_t *)dst)[i] = pat_f32_to_bf16(v);
    else
        ((float *)dst)[i] = v;
}

/* n random values in [-amp, amp] in the model dtype (xorshift; fixed seed: runs repeat) */
static void fill_random(void *dst, size_t n, uint32_t dtype, float amp, uint64_t seed)
{
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        store_elem(dtype, dst, i, amp * ((float)(s >> 40) / (float)(1u << 24) * 2.0f - 1.0f));
    }
}

/* Spins (the thread stays busy, as a frontend's compute thread would) for us microseconds. */
static void busy_wait(double us)
{
    if (us <= 0)
        return;
    uint64_t end = pat_now_ns() + (uint64_t)(us * 1e3);
    while (pat_now_ns() < end)
        __builtin_ia32_pause();
}

static void copy_rows(pl_compute_t *pc, uint8_t *dst, size_t bytes)
{
    while (bytes) {
        size_t n = pc->pool_bytes - pc->pool_off;
        if (n > bytes)
            n = bytes;
        memcpy(dst, pc->pool + pc->pool_off, n);
        dst += n;
        bytes -= n;
        pc->pool_off = (pc->pool_off + n + 4096) % (pc->pool_bytes / 2);
    }
}

/* ---------------------------------------------------------------- gpu */

static int gpu_open(pl_compute_t *pc, char *why, size_t why_len)
{
    int err = 0;
    const char *no_driver = NULL;
    if (!(pc->cu = pat__cu_load(&err, &no_driver)))
        return pl_fail(why, why_len, -ENOTSUP, "gpu compute: %s", no_driver);
    static const char *const names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && !pc->blas_lib; i++)
        pc->blas_lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!pc->blas_lib)
        return pl_fail(why, why_len, -ENOTSUP,
                       "gpu compute: no cuBLAS (libcublas.so.13/.12 on the library path): %s",
                       dlerror());
#define LOAD(name, sym, args)                                                                      \
    if (!(*(void **)&pc->blas.name = dlsym(pc->blas_lib, sym)))                                    \
        return pl_fail(why, why_len, -ENOTSUP, "gpu compute: cuBLAS lacks %s", sym);
    CUBLAS_FUNCS(LOAD)
#undef LOAD
    CUresult r;
    int ordinal = -1;
    if ((r = pc->cu->ptr_attr(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                              (CUdeviceptr)(uintptr_t)pc->buf.q)) != 0 ||
        (r = pc->cu->dev_get(&pc->dev, ordinal)) != 0)
        return pl_fail(why, why_len, -EIO, "gpu compute: finding the staging buffers' GPU: %s",
                       pat__cu_strerror(r));
    pc->cu->dev_name(pc->dev_name, sizeof(pc->dev_name), pc->dev);
    if ((r = pc->cu->ctx_retain(&pc->ctx, pc->dev)) != 0)
        return pl_fail(why, why_len, -EIO, "gpu compute: primary context: %s", pat__cu_strerror(r));
    if ((r = pc->cu->ctx_push(pc->ctx)) != 0)
        return pl_fail(why, why_len, -EIO, "gpu compute: cuCtxPushCurrent: %s",
                       pat__cu_strerror(r));
    int rc = 0;
    if ((r = pc->cu->stream_create(&pc->stream, CU_STREAM_NON_BLOCKING)) != 0) {
        rc = pl_fail(why, why_len, -EIO, "gpu compute: stream: %s", pat__cu_strerror(r));
        goto out;
    }
    if (pc->blas.create(&pc->handle) != 0 || pc->blas.set_stream(pc->handle, pc->stream) != 0) {
        rc = pl_fail(why, why_len, -EIO, "gpu compute: cuBLAS handle");
        goto out;
    }
    const pl_compute_cfg_t *c = &pc->cfg;
    size_t H = c->hidden, F = c->ffn, T = c->max_tokens, qd = (size_t)c->q_heads * c->head_dim,
           kvd = (size_t)c->kv_heads * c->head_dim;
    size_t elems[N_BUF] = {[W_Q] = H * qd,   [W_K] = H * kvd, [W_V] = H * kvd,  [W_O] = qd * H,
                           [W_GATE] = H * F, [W_UP] = H * F,  [W_DOWN] = F * H, [A_X] = T * H,
                           [A_Y] = T * H,    [A_G] = T * F,   [A_U] = T * F,    [A_D] = T * H};
    size_t eb = elem_bytes(c->dtype), most = 0;
    for (int i = 0; i < N_BUF; i++)
        most = elems[i] > most ? elems[i] : most;
    void *host = malloc(most * eb);
    if (!host) {
        rc = pl_fail(why, why_len, -ENOMEM, "gpu compute: out of host memory");
        goto out;
    }
    for (int i = 0; i < N_BUF && rc == 0; i++) {
        if ((r = pc->cu->mem_alloc(&pc->d[i], elems[i] * eb)) != 0) {
            rc = pl_fail(why, why_len, -ENOMEM, "gpu compute: %zu MiB of weights/activations: %s",
                         elems[i] * eb >> 20, pat__cu_strerror(r));
            break;
        }
        /* weights scaled by 1/sqrt(fan-in) keep every product near unit size */
        size_t fan_in = i == W_Q || i == W_K || i == W_V || i == W_GATE || i == W_UP ? H
                        : i == W_O                                                   ? qd
                        : i == W_DOWN                                                ? F
                                                                                     : 1;
        fill_random(host, elems[i], c->dtype, 1.0f / sqrtf((float)fan_in), (uint64_t)i + 1);
        if ((r = pc->cu->htod(pc->d[i], host, elems[i] * eb)) != 0)
            rc = pl_fail(why, why_len, -EIO, "gpu compute: upload: %s", pat__cu_strerror(r));
    }
    free(host);
out:;
    CUcontext dummy;
    pc->cu->ctx_pop(&dummy);
    return rc;
}

/* row-major C[T x N] = A[T x K] . W[K x N] (cuBLAS is column-major: C^T = W^T A^T) */
static int gemm(pl_compute_t *pc, uint32_t T, uint32_t N, uint32_t K, CUdeviceptr A, CUdeviceptr W,
                CUdeviceptr C)
{
    static const float one = 1.0f, zero = 0.0f;
    int dt = pc->cfg.dtype == PAT_F32    ? CUDA_R_32F
             : pc->cfg.dtype == PAT_BF16 ? CUDA_R_16BF
                                         : CUDA_R_16F;
    int r = pc->blas.gemm(pc->handle, CUBLAS_OP_N, CUBLAS_OP_N, (int)N, (int)T, (int)K, &one,
                          (const void *)(uintptr_t)W, dt, (int)N, (const void *)(uintptr_t)A, dt,
                          (int)K, &zero, (void *)(uintptr_t)C, dt, (int)N, CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT);
    return r == 0 ? 0 : -EIO;
}

static int gpu_step(pl_compute_t *pc, uint32_t T)
{
    const pl_compute_cfg_t *c = &pc->cfg;
    uint32_t H = c->hidden, F = c->ffn, qd = c->q_heads * c->head_dim,
             kvd = c->kv_heads * c->head_dim;
    CUdeviceptr q = (CUdeviceptr)(uintptr_t)pc->buf.q, k = (CUdeviceptr)(uintptr_t)pc->buf.k,
                v = (CUdeviceptr)(uintptr_t)pc->buf.v, o = (CUdeviceptr)(uintptr_t)pc->buf.o;
    CUdeviceptr *d = pc->d;
    int rc = 0, hr = 0;
    if (pc->cu->ctx_push(pc->ctx) != 0)
        return -EIO;
    for (uint32_t l = 0; l < c->n_layers && rc == 0; l++) {
        rc = gemm(pc, T, qd, H, d[A_X], d[W_Q], q);
        rc = rc ? rc : gemm(pc, T, kvd, H, d[A_X], d[W_K], k);
        rc = rc ? rc : gemm(pc, T, kvd, H, d[A_X], d[W_V], v);
        if (rc == 0 && (hr = pat_attend_async(pc->conn, l, pc->stream)) < 0)
            break;
        rc = rc ? rc : gemm(pc, T, H, qd, o, d[W_O], d[A_Y]);
        rc = rc ? rc : gemm(pc, T, F, H, d[A_Y], d[W_GATE], d[A_G]);
        rc = rc ? rc : gemm(pc, T, F, H, d[A_Y], d[W_UP], d[A_U]);
        rc = rc ? rc : gemm(pc, T, H, F, d[A_G], d[W_DOWN], d[A_D]);
    }
    if (pc->cu->stream_sync(pc->stream) != 0 && rc == 0)
        rc = -EIO;
    CUcontext dummy;
    pc->cu->ctx_pop(&dummy);
    return hr < 0 ? hr : rc;
}

/* ---------------------------------------------------------------- cpu / none */

static int host_step(pl_compute_t *pc, uint32_t T)
{
    const pl_compute_cfg_t *c = &pc->cfg;
    double us =
        c->kind == PL_COMPUTE_CPU ? c->layer_us + (double)T * pc->flops_tok / (c->tflops * 1e6) : 0;
    for (uint32_t l = 0; l < c->n_layers; l++) {
        busy_wait(us * pc->pre_share);
        copy_rows(pc, pc->buf.q, (size_t)T * pc->buf.q_row_bytes);
        copy_rows(pc, pc->buf.k, (size_t)T * pc->buf.kv_row_bytes);
        copy_rows(pc, pc->buf.v, (size_t)T * pc->buf.kv_row_bytes);
        int rc = pat_attend(pc->conn, l);
        if (rc < 0)
            return rc;
        busy_wait(us * (1 - pc->pre_share));
    }
    return 0;
}

int pl_compute_step(pl_compute_t *pc, uint32_t n_tokens)
{
    return pc->cfg.kind == PL_COMPUTE_GPU ? gpu_step(pc, n_tokens) : host_step(pc, n_tokens);
}

int pl_compute_create(const pl_compute_cfg_t *cfg, pat_conn_t *conn, pl_compute_t **ret, char *why,
                      size_t why_len)
{
    pl_compute_t *pc = calloc(1, sizeof(*pc));
    if (!pc)
        return pl_fail(why, why_len, -ENOMEM, "out of memory");
    pc->cfg = *cfg;
    pc->conn = conn;
    int rc = pat_buffers(conn, &pc->buf);
    if (rc < 0) {
        pl_fail(why, why_len, rc, "pat_buffers: %s", pat_strerror(rc));
        goto fail;
    }
    pc->flops_tok = flops_per_token(cfg);
    double qkv = 2.0 * cfg->hidden * (double)(cfg->q_heads + 2 * cfg->kv_heads) * cfg->head_dim;
    pc->pre_share = qkv / pc->flops_tok;
    if (cfg->kind == PL_COMPUTE_GPU) {
        if (!pc->buf.on_gpu) {
            rc = pl_fail(why, why_len, -ENOTSUP,
                         "gpu compute needs a GPU session (the daemon runs the cpu backend)");
            goto fail;
        }
        if ((rc = gpu_open(pc, why, why_len)) < 0)
            goto fail;
    } else {
        if (pc->buf.on_gpu) {
            rc = pl_fail(why, why_len, -ENOTSUP,
                         "a GPU session's Q/K/V are device memory: use --compute gpu");
            goto fail;
        }
        pc->pool_bytes = (size_t)POOL_ELEMS * elem_bytes(cfg->dtype);
        if (!(pc->pool = malloc(pc->pool_bytes))) {
            rc = pl_fail(why, why_len, -ENOMEM, "out of memory");
            goto fail;
        }
        fill_random(pc->pool, POOL_ELEMS, cfg->dtype, 1.0f, 7);
    }
    *ret = pc;
    return 0;
fail:
    pl_compute_free(pc);
    return rc;
}

void pl_compute_free(pl_compute_t *pc)
{
    if (!pc)
        return;
    if (pc->ctx && pc->cu->ctx_push(pc->ctx) == 0) {
        if (pc->stream)
            pc->cu->stream_sync(pc->stream);
        if (pc->handle)
            pc->blas.destroy(pc->handle);
        for (int i = 0; i < N_BUF; i++)
            if (pc->d[i])
                pc->cu->mem_free(pc->d[i]);
        if (pc->stream)
            pc->cu->stream_destroy(pc->stream);
        CUcontext dummy;
        pc->cu->ctx_pop(&dummy);
        pc->cu->ctx_release(pc->dev);
    }
    if (pc->blas_lib)
        dlclose(pc->blas_lib);
    free(pc->pool);
    free(pc);
}
