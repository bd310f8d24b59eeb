/*
 * patd_gpu.c — what the cuda backend adds to the daemon: the MPS check (without MPS every
 * per-layer hand-off waits for a context switch), the two allocations of its own every GPU
 * session gets, and the lanes (patd_lanes.c).
 *
 *   signal slice   a session's handshake words (ipc_gsig_bytes) are pinned host memory of its
 *                  own (kern_share_alloc with KERN_SHARE_HOST: CUDA virtual memory on the host
 *                  NUMA node, exported as a descriptor), which the device and the daemon's CPU
 *                  reach at one address, so the CPU can always store to them (releasing a wait
 *                  without a stream). Its descriptor goes to the session's one client, which
 *                  maps it the same way; no other client can name it, so none can stall or
 *                  confuse another session's steps
 *   staging        a session's Q/K/V/O rows are an allocation of its own (kern_share_alloc: CUDA
 *                  virtual memory with a POSIX descriptor handle), made at HELLO and exported as
 *                  a descriptor that goes to its one client beside the reply and is closed here
 *                  once sent; importing it maps that session's rows and nothing else, so one
 *                  client cannot read or write another's. limits.staging_mb (also read as
 *                  gpu.staging_mb) bounds what the open sessions' allocations add up to.
 *
 * HELLO therefore makes CUDA calls on the loop thread (create, map, export) and so does a
 * reclaim (unmap, release): none of them is a stream call or waits for the device's work
 * (tests/gpu/test_vmm_share.cu times them beside a running kernel, for device and host memory),
 * and a reclaim runs only once the lane thread has drained the session's lane (patd_conn_reap). A
 * client that keeps its imports mapped after its session ends keeps that memory in its own
 * process until it exits; it is no longer counted here, and another session's allocations are
 * never the same memory. (A slice registered with cudaHostRegister instead would need an
 * unregistration per reclaim, and cudaHostUnregister waits for a kernel running on another
 * stream: 399 ms behind a 400 ms kernel on an H100,
 * tests/bench/log/2026-11-26-work-items-staging.md.) Host memory through the virtual memory calls
 * needs a CUDA 12.2 driver or later: without it patd does not start on the cuda backend.
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

int patd_gpu_start(patd_t *d)
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
                  "switch (measured on an H100: ~290 us per round trip without MPS, ~10 us with; "
                  "tests/bench/log/2026-11-27-units-sockets-fuzz.md). Start the MPS control daemon "
                  "(systemd/patd-mps.service or `nvidia-cuda-mps-control -d`) before patd and the "
                  "frontends. !!!",
                  cfg->device);
    else
        patd_notice("cuda: MPS is active on GPU %u (cross-process hand-offs stay on the GPU)",
                    cfg->device);

    /* the driver must share device and host memory by descriptor: probe both once, now */
    for (unsigned host = 0; host < 2; host++) {
        kern_share_t probe;
        if ((rc = kern_share_alloc(d->be, 1, host ? KERN_SHARE_HOST : 0, &probe)) < 0) {
            patd_err("cuda: %s shared by descriptor: %s%s",
                     host ? "a signal slice (host memory)" : "a staging allocation", strerror(-rc),
                     rc == -ENOTSUP ? " (the driver or GPU has no virtual memory management of "
                                      "this memory with POSIX descriptor handles; host memory "
                                      "needs a CUDA 12.2 driver or later)"
                                    : "");
            return rc;
        }
        kern_share_free(d->be, &probe);
    }

    if ((rc = patd_lanes_start(d, d->lanes_want)) < 0)
        return rc;
    patd_notice("cuda: %u lanes (gpu.lanes%s), staging up to %u MiB (limits.staging_mb), a signal "
                "slice of %llu bytes per session, enqueue depth %u",
                d->lanes.n, d->cfg.lanes ? "" : " = auto", cfg->staging_mb,
                (unsigned long long)ipc_gsig_bytes(d->model.n_layers), cfg->enqueue_depth);
    return 0;
}

void patd_gpu_stop(patd_t *d)
{
    if (!d->gpu)
        return;
    patd_lanes_stop(d);
}

int patd_gpu_conn_open(patd_t *d, patd_conn_t *c, uint64_t bytes)
{
    /* HELLO checked `bytes` against limits.staging_mb (patd_conn.c); what counts is the
     * allocation, rounded up to the driver's granularity */
    const uint64_t budget = (uint64_t)d->cfg.staging_mb << 20;
    int rc = kern_share_alloc(d->be, bytes, 0, &c->share);
    if (rc < 0)
        return rc;
    if (c->share.map_bytes > budget || d->staging_used > budget - c->share.map_bytes) {
        kern_share_free(d->be, &c->share);
        return -ENOSPC;
    }
    const uint32_t nl = d->model.n_layers;
    if ((rc = kern_share_alloc(d->be, ipc_gsig_bytes(nl), KERN_SHARE_HOST, &c->gsig_share)) < 0) {
        kern_share_free(d->be, &c->share);
        return rc;
    }
    d->staging_used += c->share.map_bytes;
    c->gpu = 1;
    c->gsig = c->gsig_share.dev;
    c->dev_base = c->share.dev;
    /* the slice is the session's own: its epochs need not grow past an earlier session's, but
     * a serial-based start keeps a stale value from one session meaningless in the next */
    ipc_gsig_init(c->gsig, nl, (c->serial & 0xffffffffull) << 24);
    return 0;
}

void patd_gpu_conn_close(patd_t *d, patd_conn_t *c)
{
    if (!c->gpu)
        return;
    /* a client that is still alive sees the session closed in its mapping of the slice, which
     * outlives ours, and every wait its streams may hold passes now: a step it began that never
     * ran (refused by a drain, then the session ended before its STEP_END) would otherwise hold
     * them until its watcher sees this process exit */
    ipc_sig_t *g = c->gsig;
    /* past any step's value the client used */
    ipc_gsig_release(c->gsig, d->model.n_layers, atomic_load(&g->epoch) + 1);
    atomic_store(&g->state, IPC_STATE_CLOSED);
    d->staging_used -= c->share.map_bytes;
    kern_share_free(d->be, &c->share);
    kern_share_free(d->be, &c->gsig_share);
    c->gsig = NULL;
    c->dev_base = NULL;
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
