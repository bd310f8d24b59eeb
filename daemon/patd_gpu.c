/*
 * patd_gpu.c — what the cuda backend adds to the daemon (DESIGN.md §2): the MPS check, the two
 * arenas every GPU session takes a piece of, and one kern lane per executor.
 *
 *   signal arena   one sealed memfd of max_conns slices (ipc_gsig_bytes each), mapped into the
 *                  device once at start (d->sized.max_conns: a reload cannot raise the limit
 *                  past it); a session's handshake words live in its slice, so the
 *                  daemon's CPU can always store to them (releasing a wait without a stream)
 *   staging        a session's Q/K/V/O rows are an allocation of its own (kern_share_alloc: CUDA
 *                  virtual memory with a POSIX descriptor handle), made at HELLO and exported as
 *                  a descriptor that goes to its one client beside the reply and is closed here
 *                  once sent; importing it maps that session's rows and nothing else, so one
 *                  client cannot read or write another's (until protocol 5 one CUDA IPC handle
 *                  named a single arena of every session's rows). gpu.staging_mb bounds what the
 *                  open sessions' allocations add up to.
 *
 * HELLO therefore makes CUDA calls on the loop thread (create, map, export) and so does a
 * reclaim (unmap, release): none of them is a stream call or waits for the device's work
 * (tests/gpu/test_vmm_share.cu times them beside a running kernel), and a reclaim runs only once
 * the session's executor has drained its lane (patd_conn_reap). A client that keeps its import
 * mapped after its session ends keeps that memory in its own process until it exits; it is no
 * longer counted here, and another session's allocation is never the same memory.
 *
 * The signal arena stays one memfd registered with the device at start: every attached GPU client
 * gets its fd (no name: members of the socket group who never attached cannot open it; sealed:
 * no client can shrink it under the device's mapping), so an attached client can write another
 * session's handshake words (README, deployment). A slice of its own per session would need a
 * host registration per HELLO and an unregistration per reclaim, and cudaHostUnregister waited
 * for a kernel running on another stream (399 ms behind a 400 ms kernel, H100, test_vmm_share):
 * on the loop thread a reclaim would wait behind every client's queued GPU work, a stalled
 * client's included (a per-session memfd was built and measured, 2026-11-26, and not kept).
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
    d->staging_used = 0;
    { /* the driver must share device memory by descriptor: probe it once, now */
        kern_share_t probe;
        if ((rc = kern_share_alloc(d->be, 1, &probe)) < 0) {
            patd_err("cuda: a staging allocation shared by descriptor: %s%s", strerror(-rc),
                     rc == -ENOTSUP ? " (the driver or GPU has no virtual memory management "
                                      "with POSIX descriptor handles)"
                                    : "");
            return rc;
        }
        kern_share_free(d->be, &probe);
    }

    d->lanes = pat_xcalloc(n_exec, sizeof(*d->lanes));
    for (uint32_t i = 0; i < n_exec; i++, d->n_lanes++)
        if ((rc = kern_lane_create(d->be, &d->lanes[i])) < 0) {
            patd_err("cuda: lane %u: %s%s", i, strerror(-rc),
                     rc == -ENOTSUP ? " (the device has no 64-bit stream memory operations)" : "");
            return rc;
        }
    patd_notice("cuda: %u lanes, staging up to %u MiB, signal arena %u slices of %llu bytes, "
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
    if (d->garena_dev)
        kern_host_unmap(d->be, d->garena.base);
    d->garena_dev = NULL;
    ipc_shm_close(&d->garena);
    free(d->gslot_used);
    d->gslot_used = NULL;
}

int patd_gpu_conn_open(patd_t *d, patd_conn_t *c, uint64_t bytes)
{
    uint32_t s = 0;
    while (s < d->sized.max_conns && d->gslot_used[s])
        s++;
    if (s == d->sized.max_conns)
        return -EMFILE;
    if (bytes > d->staging_bytes - d->staging_used)
        return -ENOSPC;
    int rc = kern_share_alloc(d->be, bytes, &c->share);
    if (rc < 0)
        return rc;
    if (c->share.map_bytes > d->staging_bytes - d->staging_used) {
        kern_share_free(d->be, &c->share);
        return -ENOSPC;
    }
    d->staging_used += c->share.map_bytes;
    d->gslot_used[s] = 1;
    c->gpu = 1;
    c->gslot = s;
    c->gsig = (uint8_t *)d->garena.base + s * d->gslice;
    c->gsig_dev = d->garena_dev + s * d->gslice;
    c->dev_base = c->share.dev;
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
    d->staging_used -= c->share.map_bytes;
    kern_share_free(d->be, &c->share);
    c->dev_base = NULL;
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
