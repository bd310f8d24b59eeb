/*
 * patd_persist.c — the pool and the prefix cache's index outlive the daemon (patd_persist.h).
 */
#include "patd_persist.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include "patd_int.h"
#include "patd_log.h"
#include "pat_base.h"

/* What must be equal for an earlier pool's blocks to mean the same to this run. */
static void identity(const patd_t *d, const kern_probe_t *pr, kv_index_id_t *id)
{
    const patd_config_t *c = &d->cfg;
    /* block size: its own. An fp8 pool adds its KV dtype and factor (another factor, other
     * blocks); a 16-bit one hashes the six words it always did, so an upgrade keeps its cache */
    uint32_t scale_bits;
    memcpy(&scale_bits, &d->model.kv_scale, 4);
    const uint64_t shape[8] = {c->model_id,
                               c->layers,
                               c->q_heads,
                               c->kv_heads,
                               c->head_dim,
                               c->dtype,
                               kern_kv_dtype(&d->model),
                               scale_bits};
    const int fp8 = kern_kv_fp8(&d->model);
    memset(id, 0, sizeof(*id));
    id->model_id = XXH3_64bits(shape, (fp8 ? 8 : 6) * sizeof(shape[0]));
    id->block_bytes = kern_block_bytes(&d->model);
    id->n_blocks = c->blocks;
    id->block_size = c->block_size;
    id->layout = KV_INDEX_LAYOUT;
    id->driver = pr->driver;
    memcpy(id->device, pr->uuid, sizeof(id->device));
}

/* The fence: <runtime_dir>/<name>.lock, held while this process lives. 0 or -errno (EWOULDBLOCK:
 * another daemon holds it). */
static int fence(patd_t *d)
{
    char path[400];
    if (mkdir(d->cfg.runtime_dir, 0755) < 0 && errno != EEXIST)
        return -errno;
    snprintf(path, sizeof(path), "%.255s/%.63s.lock", d->cfg.runtime_dir, d->cfg.name);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return -errno;
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        int rc = -errno;
        close(fd);
        return rc;
    }
    d->persist.lock_fd = fd;
    return 0;
}

/* Maps the index given back and checks it; 0, or -errno with why filled. */
static int index_take(patd_persist_t *p, int fd, char *why, size_t why_len)
{
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size < (off_t)kv_index_bytes(0)) {
        snprintf(why, why_len, "the index given back is no index (not a file, or too short)");
        return -EPROTO;
    }
    /* mapped at its own size: the check then names what differs (a pool of another size is
     * another geometry), not only that the sizes do */
    const uint64_t bytes = (uint64_t)st.st_size;
    void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        snprintf(why, why_len, "mapping the index: %s", strerror(errno));
        return -ENOMEM;
    }
    int rc = kv_index_check(m, bytes, &p->id, why, why_len);
    if (rc == 0 && bytes != p->index_bytes) { /* cannot be: the geometry fixes the size */
        snprintf(why, why_len, "the index's size does not match this pool's");
        rc = -EPROTO;
    }
    if (rc < 0) {
        munmap(m, bytes);
        return rc;
    }
    p->index = m;
    p->index_fd = fd;
    return 0;
}

/* A new, empty index. 0 or -errno. */
static int index_new(patd_persist_t *p)
{
    int fd = pat_memfd_new(PATD_FDNAME_INDEX, p->index_bytes, F_SEAL_SHRINK | F_SEAL_GROW);
    if (fd < 0)
        return fd;
    void *m = mmap(NULL, p->index_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        int rc = -errno;
        close(fd);
        return rc;
    }
    kv_index_format(m, &p->id);
    p->index = m;
    p->index_fd = fd;
    return 0;
}

void patd_persist_begin(patd_t *d, const kern_probe_t *pr, kern_config_t *kc)
{
    patd_persist_t *p = &d->persist;
    memset(p, 0, sizeof(*p));
    p->given_pool = p->index_fd = p->lock_fd = p->upgrade_fd = p->successor_fd = -1;
    int given_index = -1;
    patd_listen_fd_t fds[PATD_FDS_MAX];
    const uint32_t n = patd_listen_fds(fds, PATD_FDS_MAX);
    for (uint32_t i = 0; i < n; i++) {
        int *slot = !strcmp(fds[i].name, PATD_FDNAME_POOL)      ? &p->given_pool
                    : !strcmp(fds[i].name, PATD_FDNAME_INDEX)   ? &given_index
                    : !strcmp(fds[i].name, PATD_FDNAME_UPGRADE) ? &p->upgrade_fd
                                                                : NULL;
        if (slot && *slot < 0)
            *slot = fds[i].fd;
        else {
            patd_warn("pool.persist: a descriptor named '%s' given at start is not patd's; "
                      "closed",
                      fds[i].name);
            close(fds[i].fd);
        }
    }
    p->given = p->given_pool >= 0 || given_index >= 0;
    if (p->upgrade_fd >= 0)
        patd_notice("upgrade: started by pid %d to take over from it", (int)getppid());
    char why[256] = "";
    if (!strcmp(d->cfg.persist, "off"))
        snprintf(why, sizeof(why), "pool.persist = off");
    else if (d->notify.fd < 0 && !p->given)
        snprintf(why, sizeof(why), "no service manager keeps descriptors ($NOTIFY_SOCKET unset)");
    else if (p->upgrade_fd < 0) { /* a successor takes the fence once its predecessor lets go */
        int rc = fence(d);
        if (rc < 0)
            snprintf(why, sizeof(why), "another patd holds %.80s/%.40s.lock (%s)",
                     d->cfg.runtime_dir, d->cfg.name, strerror(-rc));
    }
    if (why[0]) { /* nothing kept: what was given back stays with the manager */
        if (p->given)
            patd_notice("pool.persist: the cache starts empty: %s", why);
        else
            patd_info("pool.persist: not kept: %s", why);
        if (p->given_pool >= 0)
            close(p->given_pool);
        if (given_index >= 0)
            close(given_index);
        p->given_pool = -1;
        return;
    }
    identity(d, pr, &p->id);
    p->index_bytes = kv_index_bytes(p->id.n_blocks);
    if (p->given_pool >= 0 && given_index >= 0 && index_take(p, given_index, why, sizeof(why)) == 0)
        p->adopt = 1;
    else if (p->given && !why[0])
        snprintf(why, sizeof(why), "the %s descriptor was not given back",
                 p->given_pool < 0 ? "pool's" : "index's");
    if (!p->adopt) {
        if (given_index >= 0)
            close(given_index);
        if (p->given_pool >= 0)
            close(p->given_pool);
        p->given_pool = -1;
        if (p->given)
            patd_notice("pool.persist: the cache starts empty: %s", why);
        int rc = index_new(p);
        if (rc < 0) {
            patd_warn("pool.persist: the index's memory: %s; not kept", strerror(-rc));
            return;
        }
    }
    kc->pool_keep = 1;
    kc->pool_fd = p->given_pool;
    p->on = 1;
}

static void store(patd_t *d, const char *name, int fd)
{
    int rc = patd_notify_fds(&d->notify, name, &fd, 1);
    if (rc < 0)
        patd_warn("pool.persist: handing %s to the service manager: %s (a restart starts empty)",
                  name, strerror(-rc));
}

int patd_persist_fallback(patd_t *d, kern_config_t *kc)
{
    patd_persist_t *p = &d->persist;
    if (!p->on)
        return 0;
    if (p->given_pool >= 0) { /* the pool given back did not map: a new one, an empty index */
        patd_notice("pool.persist: the cache starts empty: the pool's memory given back could "
                    "not be mapped");
        close(p->given_pool);
        p->given_pool = -1;
        p->adopt = 0;
        kv_index_format(p->index, &p->id);
        kc->pool_fd = -1;
        return 1;
    }
    patd_warn("pool.persist: the backend cannot keep this pool; not kept");
    p->on = 0;
    kc->pool_keep = 0;
    return 1;
}

void patd_persist_adopt(patd_t *d)
{
    patd_persist_t *p = &d->persist;
    if (p->given_pool >= 0) { /* the backend holds its own duplicate now */
        close(p->given_pool);
        p->given_pool = -1;
    }
    if (!p->on)
        return;
    p->adopt_ns = pat_now_ns();
    if (p->adopt) {
        kv_adopt_t *e = pat_xmalloc((size_t)p->id.n_blocks * sizeof(*e));
        const uint32_t n = kv_index_entries(p->index, e, &p->torn);
        int rc = kv_pool_adopt(d->pool, e, n, &p->adopted, &p->rejected);
        free(e);
        if (rc < 0)
            patd_warn("pool.persist: adopting the cache: %s", strerror(-rc));
        patd_notice("pool.persist: adopted %u cached blocks (%.1f MiB of KV) from before the "
                    "start in %.1f ms; %u dropped (%u torn entries and the chains below them)",
                    p->adopted, p->adopted * (double)p->id.block_bytes / 1048576.0,
                    (pat_now_ns() - p->adopt_ns) / 1e6, p->rejected + p->torn, p->torn);
    }
    if (p->given && !p->adopt) { /* the manager's copies are stale: this run's replace them */
        patd_notify_ping(&d->notify, "FDSTOREREMOVE=1\nFDNAME=" PATD_FDNAME_POOL);
        patd_notify_ping(&d->notify, "FDSTOREREMOVE=1\nFDNAME=" PATD_FDNAME_INDEX);
    }
    store(d, PATD_FDNAME_POOL, kern_pool_fd(d->be));
    store(d, PATD_FDNAME_INDEX, p->index_fd);
}

void patd_persist_event(patd_t *d, kv_event_type_t type, uint32_t block, uint64_t hash,
                        uint64_t scope, uint32_t parent)
{
    patd_persist_t *p = &d->persist;
    if (!p->on)
        return;
    if (type == KV_EVENT_STORED)
        kv_index_stored(p->index, block, hash, scope, parent);
    else
        kv_index_evicted(p->index, block);
}

void patd_persist_end(patd_t *d)
{
    patd_persist_t *p = &d->persist;
    if (p->index)
        munmap(p->index, p->index_bytes);
    if (p->index_fd >= 0)
        close(p->index_fd);
    if (p->lock_fd >= 0)
        close(p->lock_fd);
    if (p->upgrade_fd >= 0)
        close(p->upgrade_fd);
    if (p->successor_fd >= 0)
        close(p->successor_fd);
    memset(p, 0, sizeof(*p));
    p->index_fd = p->lock_fd = p->given_pool = p->upgrade_fd = p->successor_fd = -1;
}

/* A decimal into buf (async-signal-safe: the child of patd_persist_spawn's vfork calls it). */
static void decimal(char *buf, long v)
{
    char t[24];
    int n = 0;
    do
        t[n++] = (char)('0' + v % 10);
    while ((v /= 10) > 0);
    while (n)
        *buf++ = t[--n];
    *buf = 0;
}

/* Starts exe (argv, envp) with high[0..n) at descriptors 3.., LISTEN_PID written into e_pid
 * ("LISTEN_PID=" + the child's pid). vfork: no copy of a serving daemon's page tables (a fork
 * of one with a large pool, or with the sanitizers' shadow, stalled the loop thread for tens to
 * hundreds of ms); the child shares this memory until its exec, writes only e_pid, and calls
 * nothing but what posix_spawn's child does (the signal mask, dup2, execve, _exit). Returns the
 * pid, or -1 (errno). */
static pid_t spawn_child(const char *exe, char **argv, char **envp, const int *high, int n,
                         char *e_pid)
{
    pid_t pid = vfork();
    if (pid == 0) {
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        for (int i = 0; i < n; i++)
            if (dup2(high[i], 3 + i) != 3 + i)
                _exit(126);
        memcpy(e_pid, "LISTEN_PID=", 11);
        decimal(e_pid + 11, (long)getpid());
        execve(exe, argv, envp);
        _exit(127);
    }
    return pid;
}

int patd_persist_spawn(patd_t *d)
{
    patd_persist_t *p = &d->persist;
    if (p->successor > 0)
        return -EALREADY;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
        return -errno;
    /* what the successor gets at 3.., kept high until the child puts them there */
    int high[3], n = 0;
    const char *names = PATD_FDNAME_UPGRADE;
    if (p->on) {
        high[n++] = fcntl(kern_pool_fd(d->be), F_DUPFD_CLOEXEC, 64);
        high[n++] = fcntl(p->index_fd, F_DUPFD_CLOEXEC, 64);
        names = PATD_FDNAME_POOL ":" PATD_FDNAME_INDEX ":" PATD_FDNAME_UPGRADE;
    }
    high[n++] = fcntl(sv[1], F_DUPFD_CLOEXEC, 64);
    close(sv[1]);
    int rc = 0;
    for (int i = 0; i < n; i++)
        if (high[i] < 0)
            rc = -EMFILE;
    /* the environment, made before the vfork: LISTEN_PID is written in the child */
    extern char **environ;
    size_t n_env = 0;
    while (environ[n_env])
        n_env++;
    char **envp = calloc(n_env + 5, sizeof(*envp));
    static char e_pid[40], e_fds[32], e_names[160], e_notify[160];
    snprintf(e_fds, sizeof(e_fds), "LISTEN_FDS=%d", n);
    snprintf(e_names, sizeof(e_names), "LISTEN_FDNAMES=%s", names);
    snprintf(e_notify, sizeof(e_notify), "NOTIFY_SOCKET=%s", d->notify.env);
    pid_t pid = -1;
    if (rc == 0 && envp) {
        size_t k = 0;
        for (size_t i = 0; i < n_env; i++)
            if (strncmp(environ[i], "LISTEN_", 7) && strncmp(environ[i], "NOTIFY_SOCKET=", 14))
                envp[k++] = environ[i];
        envp[k++] = e_pid;
        envp[k++] = e_fds;
        envp[k++] = e_names;
        if (d->notify.env[0])
            envp[k++] = e_notify;
        pid = spawn_child(d->exe, d->argv, envp, high, n, e_pid);
        if (pid < 0)
            rc = -errno;
    } else if (rc == 0)
        rc = -ENOMEM;
    free(envp);
    for (int i = 0; i < n; i++)
        if (high[i] >= 0)
            close(high[i]);
    if (rc < 0) {
        close(sv[0]);
        return rc;
    }
    p->successor = pid;
    p->successor_fd = sv[0];
    return (int)pid;
}

void patd_persist_spawn_end(patd_t *d)
{
    patd_persist_t *p = &d->persist;
    if (p->successor_fd >= 0)
        close(p->successor_fd);
    p->successor_fd = -1;
    p->successor = 0;
}

/* Reads one byte from fd within deadline_ns (monotonic): the byte, 0 at end of file, -ETIMEDOUT
 * or -errno. */
static int read_byte(int fd, uint64_t deadline_ns)
{
    for (;;) {
        const uint64_t now = pat_now_ns();
        if (now >= deadline_ns)
            return -ETIMEDOUT;
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int k = poll(&pf, 1, (int)((deadline_ns - now) / 1000000ull) + 1);
        if (k < 0 && errno != EINTR)
            return -errno;
        if (k <= 0)
            continue;
        char b;
        ssize_t r = read(fd, &b, 1);
        if (r == 1)
            return (unsigned char)b;
        if (r == 0 || (errno != EINTR && errno != EAGAIN))
            return r == 0 ? 0 : -errno;
    }
}

int patd_persist_takeover(patd_t *d)
{
    patd_persist_t *p = &d->persist;
    if (p->upgrade_fd < 0)
        return 0;
    const uint64_t t0 = pat_now_ns();
    if (write(p->upgrade_fd, "R", 1) != 1) {
        patd_err("upgrade: telling the predecessor this one is ready: %s", strerror(errno));
        return -EPIPE;
    }
    /* its drain, at most drain_timeout_ms, then its sockets and GPU work, then 'G' (or its end,
     * if it died meanwhile: then its descriptors are closed, its fence released) */
    const uint64_t deadline = t0 + ((uint64_t)d->cfg.drain_timeout_ms + 30000ull) * 1000000ull;
    int b = read_byte(p->upgrade_fd, deadline);
    close(p->upgrade_fd);
    p->upgrade_fd = -1;
    if (b < 0) {
        patd_err("upgrade: the predecessor did not let go within drain_timeout_ms + 30 s (%s); "
                 "exiting",
                 strerror(-b));
        return b;
    }
    const uint64_t t1 = pat_now_ns();
    if (p->on) { /* its fence: released just before 'G'; held a moment longer if it died now */
        int rc;
        while ((rc = fence(d)) == -EWOULDBLOCK && pat_now_ns() - t1 < 2000000000ull)
            usleep(200);
        if (rc < 0) {
            patd_err("upgrade: %s/%s.lock is still held (%s): another daemon owns the pool; "
                     "exiting",
                     d->cfg.runtime_dir, d->cfg.name, strerror(-rc));
            return rc;
        }
    }
    patd_notice("upgrade: taking over (the predecessor %s after %.1f ms; fence %.1f ms)",
                b == 'G' ? "let go" : "ended", (t1 - t0) / 1e6, (pat_now_ns() - t1) / 1e6);
    return 0;
}

void patd_persist_release(patd_t *d)
{
    patd_persist_t *p = &d->persist;
    if (p->index)
        munmap(p->index, p->index_bytes);
    p->index = NULL;
    p->on = 0; /* no more events reach the index */
    if (p->lock_fd >= 0)
        close(p->lock_fd);
    p->lock_fd = -1;
    if (p->successor_fd >= 0 && write(p->successor_fd, "G", 1) != 1)
        patd_warn("upgrade: telling the successor to take over: %s (it does at this exit)",
                  strerror(errno));
    patd_persist_spawn_end(d);
}
