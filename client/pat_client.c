/*
 * pat_client.c — libpat, patd's client library: what belongs to no session. The texts of its
 * error codes (pat_strerror), the default socket path, the library's version and its host OOM
 * handler.
 *
 * A session talks to patd over its control socket (a Unix stream of frames, ipc_proto.h), with
 * staging buffers in shared memory and the per-layer hand-off through futex signal words
 * (ipc_shm.h); pat_int.h lists which file owns what. Not thread-safe per connection (pat.h).
 * Host OOM aborts, like the rest of patd, reported as libpat's (oom_report below), not the
 * daemon's. The environment is read with secure_getenv: a set-uid frontend does not take its
 * socket path from whoever started it.
 */
#include "pat.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ipc_proto.h"
#include "pat_base.h"

/* Host OOM inside the frontend's process names libpat, not patd (pat_base.h). Installed when
 * the library is loaded, before any call can allocate; libpat.so's copy of daemon/base is its
 * own (hidden symbols), so this touches no other library's handler. */
static void oom_report(size_t bytes)
{
    fprintf(stderr, "libpat: host out of memory allocating %zu bytes\n", bytes);
}

__attribute__((constructor)) static void oom_install(void)
{
    pat_set_oom_handler(oom_report);
}

uint32_t pat_version(void)
{
    return PAT_VERSION;
}

/* What each code means from any public call that returns it (pat.h documents which call returns
 * what). The daemon's error table (ipc_err_text) names what a request was refused for; a few of
 * its codes mean something else from the library's own calls (-ENOENT from pat_connect is no
 * daemon, not an unknown sequence; -ENOTSUP from pat_attend_async is a host session), so these
 * texts cover every call's meaning. */
static const struct {
    int code;
    const char *text;
} client_errors[] = {
    {-ENOENT, "not found: no daemon (no socket at the path: pat_connect, pat_status, "
              "pat_admin), or a sequence id this session does not hold"},
    {-EOPNOTSUPP, "not supported: a GPU call on a host-memory session, or a request this daemon "
                  "does not offer (older release, retired opcode)"},
    {-ESRCH, "no step open (or no such step in flight)"},
    {-ETIMEDOUT, "timed out waiting for patd (a request, or a layer of the step)"},
    {-EIO, "a CUDA call failed (pat_last_error says which)"},
    {-EINVAL, "invalid argument or field value"},
    {-EPERM, "not permitted: only patd's user, root or daemon.admin_group may do this"},
    {-ECONNREFUSED, "no daemon (stale socket left by a crashed patd)"},
    {-ESTALE, "patd restarted since this session began (another instance answers): its "
              "sequences and KV are gone; reconnect"},
    {-EACCES, "permission denied on the socket (not in its group?)"},
};

const char *pat_strerror(int err)
{
    if (err == 0)
        return "success";
    if (err > 0)
        err = -err;
    for (size_t i = 0; i < PAT_ARRAY_SIZE(client_errors); i++)
        if (client_errors[i].code == err)
            return client_errors[i].text;
    const char *t = ipc_err_text(err);
    if (t)
        return t;
    return strerror(-err);
}

const char *pat_default_socket(void)
{
    static __thread char buf[512];
    const char *s = secure_getenv("PATD_SOCKET");
    if (s && *s)
        return s;
    const char *x = secure_getenv("XDG_RUNTIME_DIR");
    if (geteuid() == 0)
        return "/run/patd/patd.sock";
    if (x && *x)
        snprintf(buf, sizeof(buf), "%.480s/patd/patd.sock", x);
    else
        snprintf(buf, sizeof(buf), "/tmp/patd-%u/patd.sock", (unsigned)geteuid());
    return buf;
}

void pat_free(void *p)
{
    free(p);
}
