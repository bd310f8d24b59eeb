/*
 * patd_gpu.c — what the cuda backend adds to the daemon (DESIGN.md §2): the MPS check, the two
 * arenas every GPU session takes a piece of, and one kern lane per executor.
 *
 *   signal arena   one sealed memfd of max_conns slices (ipc_gsig_bytes each), mapped into the
 *                  device once at start (d->sized.max_conns: a reload cannot raise the limit
 *                  past it); a session's handshake words live in its slice, so the
 *                  daemon's CPU can always store to them (releasing a wait without a stream)
 *   staging arena  one device allocation of gpu.staging_mb, exported once with a CUDA IPC handle;
 *                  a session's Q/K/V/O rows are a range of it (first fit, coalescing free list)
 *
 * Both are allocated once, so a HELLO or a reclaim makes no CUDA call at all: no allocation that
 * could fail late, no cudaFree that could synchronise behind a stalled client's wait, nothing on
 * the loop thread that touches a stream. The price: every client of one daemon can map the whole
 * staging allocation (one IPC handle names all of it) and every attached client gets the whole
 * signal arena's fd (no name: members of the socket group who never attached cannot open it;
 * sealed: no client can shrink it under the device's mapping), so one daemon serves one trust
 * domain; separate tenants get separate daemons (README, deployment).
 *
 * Thread context: start/stop on the main thread before/after the loop; conn_open/close on the
 * loop thread; check_fatal anywhere.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "patd_int.h"
#include "patd_log.h"
#include "pat_base.h"

#define RANGE_ALIGN (64u << 10) /* staging ranges start on 64 KiB: rows stay 16-byte aligned */

int patd_gpu_start(patd_t *d, uint32_t n_exec)
{
    const patd_config_t *cfg = &d->cfg;
    if (strcmp(kern_backend_name(d->be), "cuda"))
        return 0;
    d->gpu = 1;
    int rc = kern_device_info(d->be, &d->mps, d->dev_uuid);
    if (rc < 0) {
        patd_err("cuda: device info: %s", strerror(-rc));
        return rc;
    }
    if (!d->mps)
        patd_warn("!!! MPS is NOT active on GPU %u: frontends in other processes will be "
                  "time-sliced with patd, and every per-layer hand-off then waits for a context "
                  "switch (measured on an H100: ~290 us per round trip without MPS, ~9 us with; "
                  "tests/bench/RESULTS.md). Start the MPS control daemon (systemd/patd-mps.service "
                  "or `nvidia-cuda-mps-control -d`) before patd and the frontends. !!!",
                  cfg->device);
    else
        patd_notice("cuda: MPS is active on GPU %u (cross-process hand-offs stay on the GPU)",
                    cfg->device);

    d->gslice = ipc_gsig_bytes(d->model.n_layers);
    char name[IPC_NAME_LEN];
    snprintf(name, sizeof(name), "/patd.%.40s.gsig", cfg->name);
    ipc_shm_sweep(name); /* a crashed predecessor's arena */
    rc = ipc_shm_create_memfd(&d->garena, d->gslice * cfg->max_conns, d->model.n_layers);
    if (rc < 0) {
        patd_err("cuda: signal arena (%llu bytes): %s",
                 (unsigned long long)(d->gslice * cfg->max_conns), strerror(-rc));
        return rc;
    }
    void *dev = NULL;
    if ((rc = kern_host_map(d->be, d->garena.base, d->garena.bytes, &dev)) < 0) {
        patd_err("cuda: mapping the signal arena into the device: %s", strerror(-rc));
        return rc;
    }
    d->garena_dev = dev;
    d->gslot_used = pat_xcalloc(cfg->max_conns, 1);
    d->sized.max_conns = cfg->max_conns; /* a reload may lower it, never raise it past this */

    d->staging_bytes = (uint64_t)cfg->staging_mb << 20;
    if ((rc = kern_ipc_alloc(d->be, d->staging_bytes, &d->staging_dev, d->staging_handle)) < 0) {
        patd_err("cuda: staging arena of %u MiB: %s (lower gpu.staging_mb or pool.blocks)",
                 cfg->staging_mb, strerror(-rc));
        return rc;
    }
    patd_ranges_init(&d->ranges, d->staging_bytes, RANGE_ALIGN);

    d->lanes = pat_xcalloc(n_exec, sizeof(*d->lanes));
    for (uint32_t i = 0; i < n_exec; i++, d->n_lanes++)
        if ((rc = kern_lane_create(d->be, &d->lanes[i])) < 0) {
            patd_err("cuda: lane %u: %s%s", i, strerror(-rc),
                     rc == -ENOTSUP ? " (the device has no 64-bit stream memory operations)" : "");
            return rc;
        }
    patd_notice("cuda: %u lanes, staging arena %u MiB, signal arena %u slices of %llu bytes, "
                "enqueue depth %u",
                n_exec, cfg->staging_mb, cfg->max_conns, (unsigned long long)d->gslice,
                cfg->enqueue_depth);
    return 0;
}

void patd_gpu_stop(patd_t *d)
{
    if (!d->gpu)
        return;
    for (uint32_t i = 0; i < d->n_lanes; i++)
        kern_lane_free(d->lanes[i]);
    d->n_lanes = 0;
    free(d->lanes);
    d->lanes = NULL;
    kern_ipc_free(d->be, d->staging_dev);
    d->staging_dev = NULL;
    if (d->garena_dev)
        kern_host_unmap(d->be, d->garena.base);
    d->garena_dev = NULL;
    ipc_shm_close(&d->garena);
    free(d->gslot_used);
    d->gslot_used = NULL;
    patd_ranges_done(&d->ranges);
}

int patd_gpu_conn_open(patd_t *d, patd_conn_t *c, uint64_t bytes)
{
    uint32_t s = 0;
    while (s < d->sized.max_conns && d->gslot_used[s])
        s++;
    if (s == d->sized.max_conns)
        return -EMFILE;
    if (patd_ranges_alloc(&d->ranges, bytes, &c->dev_off) < 0)
        return -ENOMEM;
    d->gslot_used[s] = 1;
    c->gpu = 1;
    c->gslot = s;
    c->gsig = (uint8_t *)d->garena.base + s * d->gslice;
    c->gsig_dev = d->garena_dev + s * d->gslice;
    c->dev_base = (uint8_t *)d->staging_dev + c->dev_off;
    /* session serials grow: 2^24 epoch bumps per session before the next one's range */
    ipc_gsig_init(c->gsig, d->model.n_layers, (c->serial & 0xffffffffull) << 24);
    return 0;
}

void patd_gpu_conn_close(patd_t *d, patd_conn_t *c)
{
    if (!c->gpu)
        return;
    /* a client that is still alive sees the session closed; its words stay released */
    ipc_sig_t *g = c->gsig;
    atomic_store(&g->state, IPC_STATE_CLOSED);
    patd_ranges_free(&d->ranges, c->dev_off, c->lay.bytes);
    d->gslot_used[c->gslot] = 0;
    c->gpu = 0;
}

void patd_gpu_check_fatal(patd_t *d, int rc)
{
    char why[200];
    if (rc != -EIO || kern_fatal(d->be, why, sizeof(why)) == 0)
        return;
    patd_err("sticky CUDA error: %s. The GPU context is lost; exiting so that the service "
             "manager restarts patd (clients see ECONNRESET and reconnect)",
             why);
    fflush(stderr);
    _exit(70); /* EX_SOFTWARE: Restart=on-failure applies */
}
