/*
 * pat_cuda_shim.c — loads the CUDA driver for client/ (pat_cuda_shim.h): one dlopen and one
 * cuInit per process, whoever asks first (libpat's GPU session or patload's gpu compute).
 *
 * A missing driver is an expected condition (libpat on a machine without a GPU, talking to a
 * daemon on the cpu backend): it is reported, never printed. The handle is never closed: the
 * entry points may be in use by another thread until the process exits.
 */
#include "pat_cuda_shim.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>

static pat__cu_api_t cu;
static int cu_err = -ENOSYS; /* 0 once loaded and initialised */
static char cu_why[160];
static pthread_once_t cu_once = PTHREAD_ONCE_INIT;

static void cu_load(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(cu_why, sizeof(cu_why), "cannot load the CUDA driver (libcuda.so.1): %s",
                 dlerror());
        return;
    }
#define PAT__CU_SYM(field, sym, params)                                                            \
    if (!(*(void **)&cu.field = dlsym(h, sym))) {                                                  \
        snprintf(cu_why, sizeof(cu_why), "the CUDA driver lacks %s (too old?)", sym);              \
        return;                                                                                    \
    }
    PAT__CU_FUNCS(PAT__CU_SYM)
#undef PAT__CU_SYM
    CUresult r = cu.init(0);
    if (r != 0) {
        snprintf(cu_why, sizeof(cu_why), "cuInit failed (CUresult %d): no usable GPU", r);
        cu_err = -ENODEV;
        return;
    }
    cu_err = 0;
}

const pat__cu_api_t *pat__cu_load(int *ret_err, const char **why)
{
    pthread_once(&cu_once, cu_load);
    if (cu_err == 0)
        return &cu;
    if (ret_err)
        *ret_err = cu_err;
    if (why)
        *why = cu_why;
    return NULL;
}

const char *pat__cu_strerror(CUresult r)
{
    const char *s = NULL;
    pthread_once(&cu_once, cu_load); /* a no-op after the load; orders the read of cu_err */
    if (cu_err == 0 && cu.err_string(r, &s) == 0 && s)
        return s;
    return "unknown CUDA error";
}
