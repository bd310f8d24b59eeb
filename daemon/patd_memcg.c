/*
 * patd_memcg.c — how much memory the cgroup patd runs in still lets it take, for HELLO's check
 * (patd_conn.c): a session's staging is committed at once (a cpu session's memfd is fallocated
 * whole, so that a client can never SIGBUS the daemon), and a commit past the cgroup's limit
 * does not fail: the kernel's OOM killer ends patd, every session with it. So a HELLO whose
 * staging would not fit under the limit, less what is in use and limits.memory_headroom_mb, is
 * refused instead, with these numbers.
 *
 * The limit is the tightest of patd's cgroup and every ancestor up to the hierarchy's root (a
 * service's slice may hold the limit). "In use" is what the kernel charges there less the
 * inactive file cache, which it reclaims before it kills anyone (the working set, as kubelet
 * counts it). One table row per hierarchy layout; the first whose limit file exists for patd's
 * cgroup serves. Files are read at every call (HELLOs are not a hot path; systemd may move the
 * process).
 *
 * Thread context: any (no state).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "patd_int.h"

/* v1 writes "no limit" as the largest page-aligned counter (9223372036854771712 with 4 KiB
 * pages); anything this large is none */
#define MEMCG_UNLIMITED (1ull << 62)

static const struct memcg_kind {
    const char *mount;    /* where the hierarchy is mounted */
    int v1;               /* /proc/self/cgroup line: 0 "0::<path>", 1 "N:...memory...:<path>" */
    const char *limit;    /* files in a cgroup's directory: its limit, ... */
    const char *usage;    /* ... what is charged to it and below, ... */
    const char *inactive; /* ... and memory.stat's key of the inactive file cache */
} kinds[] = {
    {"/sys/fs/cgroup", 0, "memory.max", "memory.current", "inactive_file"},
    {"/sys/fs/cgroup/unified", 0, "memory.max", "memory.current", "inactive_file"},
    {"/sys/fs/cgroup/memory", 1, "memory.limit_in_bytes", "memory.usage_in_bytes",
     "total_inactive_file"},
};

/* patd's cgroup in the kind's hierarchy, from /proc/self/cgroup: 0 or -ENOENT. */
static int own_path(const struct memcg_kind *k, char *out, size_t len)
{
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f)
        return -ENOENT;
    char line[512];
    int rc = -ENOENT;
    while (rc < 0 && fgets(line, sizeof(line), f)) {
        char *ctl = strchr(line, ':'), *path = ctl ? strchr(ctl + 1, ':') : NULL;
        if (!path)
            continue;
        *path++ = 0;
        path[strcspn(path, "\n")] = 0;
        ctl++;
        int match = 0;
        if (!k->v1)
            match = !strcmp(line, "0") && !*ctl;
        else
            for (char *save = NULL, *c = strtok_r(ctl, ",", &save); c && !match;
                 c = strtok_r(NULL, ",", &save))
                match = !strcmp(c, "memory");
        if (match && (size_t)snprintf(out, len, "%s", path) < len)
            rc = 0;
    }
    fclose(f);
    return rc;
}

/* The number in dir/file (or, with key, on memory.stat-style line "key N"): 0 and *ret, 1 when
 * it says "max", -ENOENT. */
static int read_value(const char *dir, const char *file, const char *key, uint64_t *ret)
{
    char p[512], line[256];
    if ((size_t)snprintf(p, sizeof(p), "%s/%s", dir, file) >= sizeof(p))
        return -ENOENT;
    FILE *f = fopen(p, "r");
    if (!f)
        return -ENOENT;
    int rc = -ENOENT;
    const size_t kl = key ? strlen(key) : 0;
    while (rc == -ENOENT && fgets(line, sizeof(line), f)) {
        const char *v = line;
        if (key) {
            if (strncmp(line, key, kl) || line[kl] != ' ')
                continue;
            v = line + kl + 1;
        }
        if (!strncmp(v, "max", 3)) {
            rc = 1;
            break;
        }
        char *end;
        errno = 0;
        unsigned long long x = strtoull(v, &end, 10);
        if (!errno && end != v) {
            *ret = x;
            rc = 0;
        }
    }
    fclose(f);
    return rc;
}

int patd_memcg_room(patd_memcg_t *ret)
{
    for (size_t i = 0; i < PAT_ARRAY_SIZE(kinds); i++) {
        const struct memcg_kind *k = &kinds[i];
        char rel[256], dir[512];
        uint64_t limit;
        if (own_path(k, rel, sizeof(rel)) < 0)
            continue;
        snprintf(dir, sizeof(dir), "%s%s", k->mount, rel);
        if (read_value(dir, k->limit, NULL, &limit) == -ENOENT)
            continue; /* not this layout, or no memory controller here */
        int found = 0;
        patd_memcg_t best = {0};
        /* patd's cgroup, then each parent up to the mount (the root has no limit of its own) */
        for (size_t n = strlen(dir); n > strlen(k->mount); n = strrchr(dir, '/') - dir) {
            dir[n] = 0;
            uint64_t usage, inactive = 0;
            if (read_value(dir, k->limit, NULL, &limit) != 0 || limit >= MEMCG_UNLIMITED ||
                read_value(dir, k->usage, NULL, &usage) != 0)
                continue;
            read_value(dir, "memory.stat", k->inactive, &inactive);
            const uint64_t used = usage - PAT_MIN(inactive, usage);
            const uint64_t room = limit > used ? limit - used : 0;
            if (!found || room < best.room) {
                best.limit = limit;
                best.used = used;
                best.room = room;
                snprintf(best.path, sizeof(best.path), "%.120s/%s", dir, k->limit);
                found = 1;
            }
        }
        if (!found)
            return -ENOENT;
        *ret = best;
        return 0;
    }
    return -ENOENT;
}
