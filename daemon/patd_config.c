/*
 * patd_config.c — the option table, INI parsing (libinih) and command-line overrides.
 *
 * One row per option: section, key, type, bounds, default, reloadable, help, and an optional apply
 * hook that runs once a value is stored (at load and after a reload). Rules across options are
 * checked once every layer is read (validate).
 * The same key names are INI keys under their section and `--key=value` on the command line
 * (dashes or underscores). Values are checked against their bounds wherever they come from; a
 * bad value names the option, the source and the allowed range, and nothing is applied.
 *
 * Files (the config, an instance's drop-in) are read whole into memory and parsed from there
 * (ini_parse_string): only a regular file of at most PATD_CONFIG_MAX_BYTES, opened without
 * blocking, so that a path that names /dev/zero, a FIFO or a directory (a slip, or a hostile
 * edit) is refused with its cause instead of hanging the reader or reading as an empty file
 * (which would reset every option to its default). A reload reads off the loop thread
 * (patd_main.c); this file only keeps its reading free of shared state (getgrnam_r).
 */
#include "patd_config.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <ini.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ipc_proto.h" /* IPC_VERSION */
#include "kern.h"
#include "sched_plan.h" /* sched_policy_parse */
#include "pat.h"        /* PAT_VERSION_*: the release version, written once */
#include "patd_log.h"
#include "pat_base.h"

#define PATD_STR_(x) #x
#define PATD_STR(x)  PATD_STR_(x)
#define PATD_VERSION                                                                               \
    PATD_STR(PAT_VERSION_MAJOR) "." PATD_STR(PAT_VERSION_MINOR) "." PATD_STR(PAT_VERSION_PATCH)

/* T_U32A: a T_U32 that also takes "auto", stored as 0 (below the row's min) */
typedef enum opt_type {
    T_STR,
    T_U32,
    T_U32A,
    T_U64,
    T_OCT,
    T_F32,
    T_LEVEL,
    T_DTYPE,
    T_KVDTYPE /* a dtype, fp8 or auto (0) */
} opt_type_t;

/* What applying a value takes beyond storing it (run at load and after a reload stored it). */
typedef void opt_apply_fn(const patd_config_t *c);

typedef struct opt {
    const char *section, *key;
    opt_type_t type;
    size_t off, size; /* field in patd_config_t; size for strings */
    uint64_t min, max;
    const char *def;
    int reload; /* 1: SIGHUP applies a change; 0: restart-only */
    const char *help;
    opt_apply_fn *apply;
} opt_t;

static void apply_log_level(const patd_config_t *c)
{
    atomic_store(&patd_log_level, (int)c->log_level);
}

#define F(f)   offsetof(patd_config_t, f), sizeof(((patd_config_t *)0)->f)
#define U32MAX 4294967295ull

static const opt_t opts[] = {
    {"daemon", "name", T_STR, F(name), 1, 40, "patd", 0,
     "instance name: sockets are <runtime_dir>/<name>.sock and .events", NULL},
    {"daemon", "runtime_dir", T_STR, F(runtime_dir), 0, 255, "", 0,
     "directory of the sockets (default /run/patd as root, else $XDG_RUNTIME_DIR/patd or "
     "/tmp/patd-<uid>)",
     NULL},
    {"daemon", "socket_mode", T_OCT, F(socket_mode), 0600, 0777, "0660", 0,
     "file mode of the sockets and the staging buffers: who may connect", NULL},
    {"daemon", "socket_group", T_STR, F(socket_group), 0, 63, "", 0,
     "group owning the sockets and buffers (empty: the daemon's)", NULL},
    {"daemon", "admin_group", T_STR, F(admin_group), 0, 63, "", 0,
     "group whose members may also drain, reload and check through the admin socket "
     "(<runtime_dir>/<name>.admin; patd's user and root always may)",
     NULL},
    {"daemon", "backend", T_STR, F(backend), 1, 15, "auto", 0,
     "auto | cpu | cuda (auto: cuda when this build has the cuda backend and the device can be "
     "served; cpu with a notice where there is no NVIDIA driver or no cuda in the build; on a "
     "host with a driver, or with gpu.device set, a device that cannot be served stops patd)",
     NULL},
    {"daemon", "liveness", T_STR, F(liveness), 1, 15, "auto", 1,
     "auto: watch each client's pid with a pidfd, a lease when it cannot be watched; lease: "
     "always the lease (clients must send a request every lease_ms)",
     NULL},
    {"daemon", "pack_policy", T_STR, F(pack_policy), 1, 15, "auto", 1,
     "how queries are packed into CTAs for sessions that do not choose: auto (the least modelled "
     "time of the four, per step), bytes, paper (PAT's heuristic), query (one CTA per query: "
     "the baseline), tree (prefix-tree order); a reload applies to sessions opened after it",
     NULL},
    {"daemon", "invariant", T_U32, F(invariant), 0, 1, "0", 0,
     "1: batch-invariant attention: a query token's output is bitwise the same whatever else "
     "its step holds (its KV cut at multiples of invariant_chunk, each 64-token window one "
     "softmax step, the chunks merged in order; prefixes are still read once per window they "
     "share); sessions' pack policy unused",
     NULL},
    {"daemon", "invariant_chunk", T_U32, F(invariant_chunk), 64, 1u << 20, "1024", 0,
     "tokens, a multiple of 64: with invariant = 1, where each token's KV is cut into parts "
     "merged in order (smaller: more parallel work on a long shared prefix and more partials "
     "to merge)",
     NULL},
    {"daemon", "threads", T_U32, F(threads), 0, 1024, "0", 0,
     "cpu backend worker threads (0: one per online CPU)", NULL},
    {"daemon", "executors", T_U32, F(executors), 1, 64, "2", 0,
     "step executor threads (steps of different connections run concurrently)", NULL},
    {"daemon", "log_level", T_LEVEL, F(log_level), 3, 7, "info", 1,
     "err | warning | notice | info | debug", apply_log_level},
    {"daemon", "metrics_port", T_U32, F(metrics_port), 0, 65535, "9477", 0,
     "Prometheus metrics on http://127.0.0.1:<port>/metrics (0: off)", NULL},
    {"daemon", "drain_timeout_ms", T_U32, F(drain_timeout_ms), 0, 600000, "10000", 1,
     "on SIGTERM/drain: how long in-flight steps may take before sessions are cut", NULL},
    {"gpu", "device", T_U32, F(device), 0, 1023, "0", 0,
     "cuda backend: CUDA device ordinal (as CUDA_VISIBLE_DEVICES numbers them)", NULL},
    {"gpu", "memory_fraction", T_F32, F(memory_fraction), 0, 0, "0.5", 0,
     "cuda backend, pool.blocks = auto: the share (0.05..0.95) of the GPU's memory that the KV "
     "pool and the staging arena take together; the rest is left to the frontends' weights and "
     "activations under MPS. More than is free now stops patd",
     NULL},
    {"gpu", "enqueue_depth", T_U32, F(enqueue_depth), 1, 64, "16", 0,
     "cuda backend: layers of a step enqueued ahead of its lane's progress (bounds what a "
     "stalled client can leave queued)",
     NULL},
    {"gpu", "enqueue", T_STR, F(enqueue), 5, 8, "ahead", 0,
     "cuda backend: ahead (a step's layers are enqueued up to gpu.enqueue_depth ahead, each "
     "waiting on the GPU for its client's hand-over) or on_ready (the lane thread enqueues a "
     "layer once it has seen the hand-over in host memory: the CPU decides per layer, as "
     "packing several sessions' layers together needs; costs the lane thread's poll per layer)",
     NULL},
    {"gpu", "cross_pack", T_U32, F(cross_pack), 0, 1, "0", 0,
     "cuda backend, gpu.enqueue = ahead: 1 = steps of one uid's sessions that wait for lanes "
     "together run their layers as one forward over the union of their queries on one lane (a "
     "prompt they share is read once for all of them); a session that has not handed a layer "
     "over within gpu.cross_pack_window_us of the first leaves the pack and runs the rest of its "
     "step alone; 0 = every step alone",
     NULL},
    {"gpu", "cross_pack_window_us", T_U32, F(cross_pack_window_us), 0, 100000, "50", 0,
     "cuda backend, gpu.cross_pack = 1: how long a packed layer waits for the pack's other "
     "sessions once one has handed it over",
     NULL},
    {"gpu", "cross_pack_wait_us", T_U32, F(cross_pack_wait_us), 0, 100000, "200", 0,
     "cuda backend, gpu.cross_pack = 1: how long a step may wait for a lane, while other sessions "
     "of its uid stepped in the last second, for the steps of as many of them to pack with; its "
     "client hands its first layers over meanwhile, and they run once it begins",
     NULL},
    {"gpu", "lanes", T_U32A, F(lanes), 1, 64, "auto", 0,
     "cuda backend: GPU steps in flight at once, each on a stream of its own (a step holds a "
     "lane, not a thread); auto: the hardware queues CUDA_DEVICE_MAX_CONNECTIONS keeps apart "
     "(patd sets 32 where unset) less two, at most what 1/16 of the GPU's memory holds (a lane "
     "starts small; its partials grow for a large plan and shrink back when its step ends)",
     NULL},
    {"gpu", "dependent_launch", T_U32, F(dependent_launch), 0, 1, "1", 0,
     "cuda backend, sm_90: 1 = a layer's forward is launched as a programmatic dependent of its "
     "KV append (its blocks start while the append runs and wait for it on the GPU); 0 = after it",
     NULL},
    {"gpu", "merge", T_STR, F(merge), 1, 7, "launch", 0,
     "cuda backend: where a step's split tokens are merged: launch (a kernel of its own after the "
     "forward) or inside (by the last CTA of each token, in the forward's launch)",
     NULL},
    {"gpu", "forward", T_STR, F(forward), 1, 15, "auto", 0,
     "cuda backend's forward: auto (sm_90a, head_dim <= 128: a loading warpgroup, KV by "
     "cp.async, and two wgmma warpgroups, CTAs of up to 128 rows; elsewhere as layer), cpasync "
     "(auto's explicit name), tma (as auto, KV pages by the tensor memory accelerator), layer "
     "(4-warp kernels: wgmma for TREE's CTAs of 33-64 rows on "
     "sm_90a, mma.sync elsewhere) or mma (mma.sync only); wide is read as auto",
     NULL},
    {"model", "layers", T_U32, F(layers), 1, 1024, "4", 0, "transformer layers", NULL},
    {"model", "q_heads", T_U32, F(q_heads), 1, 1024, "8", 0, "query heads", NULL},
    {"model", "kv_heads", T_U32, F(kv_heads), 1, 1024, "2", 0,
     "KV heads (q_heads / kv_heads <= 16)", NULL},
    {"model", "head_dim", T_U32, F(head_dim), 64, 256, "64", 0, "64 | 128 | 256", NULL},
    {"model", "dtype", T_DTYPE, F(dtype), 1, 3, "f16", 0, "f16 | bf16 | f32", NULL},
    {"model", "kv_dtype", T_KVDTYPE, F(kv_dtype), 0, 5, "auto", 0,
     "auto | f16 | bf16 | f32 | fp8_e4m3 | fp8_e5m2: the KV pool's elements (auto: dtype; fp8 "
     "under an f16 or bf16 dtype, on the cpu backend so far)",
     NULL},
    {"model", "kv_scale", T_F32, F(kv_scale), 0, 0, "1", 0,
     "fp8 KV: an element is stored as its value / kv_scale (> 0)", NULL},
    {"model", "block_size", T_U32, F(block_size), 16, 16, "16", 0, "tokens per KV block", NULL},
    {"model", "model_id", T_U64, F(model_id), 0, UINT64_MAX, "0", 0,
     "clients must present the same id; mixed into prefix-cache keys", NULL},
    {"model", "scale", T_F32, F(scale), 0, 0, "0", 1, "softmax scale (0: 1/sqrt(head_dim))", NULL},
    {"model", "softcap", T_F32, F(softcap), 0, 0, "0", 1, "logit soft cap (0: off)", NULL},
    {"pool", "blocks", T_U32A, F(blocks), 16, 1u << 31, "4096", 0,
     "KV pool capacity in blocks, or auto: from gpu.memory_fraction (cuda) or pool.cpu_memory_mb "
     "(cpu)",
     NULL},
    {"pool", "cpu_memory_mb", T_U32, F(cpu_memory_mb), 16, 1u << 24, "2048", 0,
     "cpu backend, pool.blocks = auto: MiB of host memory for the KV pool (committed at start; "
     "more than MemAvailable stops patd)",
     NULL},
    {"pool", "prefix_scope", T_STR, F(prefix_scope), 1, 7, "uid", 0,
     "who shares KV blocks through the prefix cache: uid (sessions of the same user only; a "
     "client's KV for a prompt never reaches another user's sequences) or all (every session: "
     "only where every client that may connect is trusted to send true K and V)",
     NULL},
    {"pool", "persist", T_STR, F(persist), 2, 4, "auto", 0,
     "auto: the KV pool and the prefix cache's index outlive the daemon where the backend can "
     "keep its pool (cpu: a memfd; cuda: a VMM allocation with a POSIX descriptor) and a service "
     "manager keeps descriptors (systemd's "
     "FileDescriptorStoreMax=): a restart adopts every block published before it (sessions do "
     "not survive; their committed blocks do); off: every start is empty",
     NULL},
    {"pool", "max_seqs", T_U32, F(max_seqs), 1, 1u << 20, "4096", 0,
     "open sequences, all connections together", NULL},
    {"pool", "max_seq_len", T_U32, F(max_seq_len), 1, 1u << 22, "32768", 0, "tokens per sequence",
     NULL},
    {"limits", "max_conns", T_U32, F(max_conns), 1, 4096, "64", 1, "connections at once", NULL},
    {"limits", "conn_max_seqs", T_U32, F(conn_max_seqs), 1, 65536, "256", 1,
     "open sequences per connection", NULL},
    {"limits", "conn_max_blocks", T_U32, F(conn_max_blocks), 0, 1u << 31, "0", 1,
     "KV blocks one connection may hold, each counted once however many of its sequences name it "
     "(0: the whole pool)",
     NULL},
    {"limits", "conn_max_batch_tokens", T_U32, F(conn_max_batch_tokens), 1, 1u << 20, "4096", 0,
     "query tokens per step per connection (sizes staging buffers and the backend workspace)",
     NULL},
    {"limits", "conn_max_staging_mb", T_U32, F(conn_max_staging_mb), 1, 1u << 20, "256", 1,
     "staging buffer MiB per connection (a HELLO past it is refused, -EDQUOT)", NULL},
    {"limits", "staging_mb", T_U32, F(staging_mb), 1, 1u << 20, "1024", 0,
     "staging MiB of all sessions together, every backend (host memory on cpu, device memory on "
     "cuda); a HELLO past it is refused (-ENOBUFS: staging budget exhausted). Also read as "
     "[gpu] staging_mb",
     NULL},
    {"limits", "memory_headroom_mb", T_U32, F(memory_headroom_mb), 0, 1u << 20, "64", 1,
     "under a cgroup memory limit: MiB a HELLO must leave free below it, past what is in use "
     "and the session's staging (else -ENOMEM, never the OOM killer)",
     NULL},
    {"limits", "lease_ms", T_U32, F(lease_ms), 100, 3600000, "10000", 1,
     "a client whose pid cannot be watched must send a request this often", NULL},
    {"limits", "max_lease_ms", T_U32, F(max_lease_ms), 100, 3600000, "60000", 1,
     "longest lease a client may ask for in its HELLO (longer asks are cut to this)", NULL},
    {"limits", "step_timeout_ms", T_U32, F(step_timeout_ms), 10, 3600000, "30000", 1,
     "longest wait for a client's next layer before its step is aborted", NULL},
    {"limits", "stall_cut_ms", T_U32, F(stall_cut_ms), 0, 3600000, "250", 1,
     "a GPU step whose lane waits this long for its client's next layer while every lane is "
     "taken and other steps wait for one is cut (its client gets -ETIMEDOUT naming this option); "
     "a slow client with lanes to spare is never cut by it; 0: only step_timeout_ms cuts",
     NULL},
    {"limits", "first_step_grace_ms", T_U32, F(first_step_grace_ms), 0, 3600000, "10000", 1,
     "limits.stall_cut_ms for a session's first step (a frontend's first step is slow for "
     "ordinary reasons: kernel loading, allocator and library warm-up)",
     NULL},
    {"limits", "conns_per_uid", T_U32, F(conns_per_uid), 0, 4096, "0", 1,
     "sessions one user (the kernel's uid at HELLO, on the admin socket) may hold; a HELLO past "
     "it is refused (-EMFILE), so one user cannot fill limits.max_conns for the others on a "
     "daemon shared by users (0: no bound but limits.max_conns)",
     NULL},
};
_Static_assert(PAT_ARRAY_SIZE(opts) <= 128, "patd_config_t.set holds 128 bits");

/* Options that moved to another section: the file's old [section] key still sets the row (the
 * key, and so --key=value, is the same). */
static const struct {
    const char *section, *key, *now; /* now: the section that holds it */
} moved[] = {
    {"gpu", "staging_mb", "limits"}, /* the staging budget bound the cuda backend only there */
};

static const char *level_names[] = {"", "", "", "err", "warning", "notice", "info", "debug"};

/* A refusal while loading c: one line "patd: <why>" on stderr (the log), and the first one kept in
 * c->error for whoever asked (a reload's reply). */
static void cfg_error(patd_config_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void cfg_error(patd_config_t *c, const char *fmt, ...)
{
    char why[sizeof(c->error)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    fprintf(stderr, "patd: %s\n", why);
    if (!c->error[0])
        memcpy(c->error, why, sizeof(why));
}

/* Whether a group of that name exists: getgrnam_r, as a reload checks the file off the loop
 * thread; its buffer grows while the entry does not fit (a group of many members). */
static int group_exists(const char *name)
{
    struct group g, *found = NULL;
    int rc = ERANGE;
    for (size_t cap = 4096; rc == ERANGE && cap <= (1u << 24); cap *= 4) {
        char *buf = pat_xmalloc(cap);
        rc = getgrnam_r(name, &g, buf, cap, &found);
        free(buf);
    }
    return rc == 0 && found;
}

static const opt_t *opt_find(const char *section, const char *key)
{
    char k[64];
    size_t n = strlen(key);
    if (n >= sizeof(k))
        return NULL;
    for (size_t i = 0; i <= n; i++)
        k[i] = key[i] == '-' ? '_' : key[i];
    for (size_t i = 0; section && i < PAT_ARRAY_SIZE(moved); i++)
        if (!strcmp(section, moved[i].section) && !strcmp(k, moved[i].key))
            section = moved[i].now;
    for (size_t i = 0; i < PAT_ARRAY_SIZE(opts); i++)
        if ((!section || !strcmp(section, opts[i].section)) && !strcmp(k, opts[i].key))
            return &opts[i];
    return NULL;
}

/* Parses and range-checks value into the field; prints why not to stderr. */
static int opt_set(patd_config_t *c, const opt_t *o, const char *val, const char *src)
{
    char *end;
    uint8_t *field = (uint8_t *)c + o->off;
    errno = 0;
    switch (o->type) {
    case T_STR:
        if (strlen(val) < o->min || strlen(val) > o->max)
            goto range;
        memcpy(field, val, strlen(val) + 1);
        break;
    case T_U32A:
        if (!strcmp(val, "auto")) {
            *(uint32_t *)field = 0;
            break;
        }
        /* fall through */
    case T_U32:
    case T_U64:
    case T_OCT: {
        if (!*val || *val == '-')
            goto bad;
        unsigned long long v = strtoull(val, &end, o->type == T_OCT ? 8 : 0);
        if (errno || *end)
            goto bad;
        if (v < o->min || v > o->max)
            goto range;
        if (o->type == T_U64)
            *(uint64_t *)field = v;
        else
            *(uint32_t *)field = (uint32_t)v;
        break;
    }
    case T_F32: {
        float v = strtof(val, &end);
        if (errno || *end || !(v >= 0.0f) || v > 1e6f)
            goto bad;
        *(float *)field = v;
        break;
    }
    case T_LEVEL:
        for (uint32_t l = 3; l <= 7; l++)
            if (!strcmp(val, level_names[l])) {
                *(uint32_t *)field = l;
                return 0;
            }
        goto bad;
    case T_DTYPE:
    case T_KVDTYPE: { /* by patd_dtype_name's names: f16 bf16 f32, and auto fp8_* for the pool */
        const uint32_t lo = o->type == T_KVDTYPE ? 0 : KERN_F16;
        const uint32_t hi = o->type == T_KVDTYPE ? KERN_FP8_E5M2 : KERN_F32;
        uint32_t d = lo;
        while (d <= hi && strcmp(val, patd_dtype_name(d)))
            d++;
        if (d > hi)
            goto bad;
        *(uint32_t *)field = d;
        break;
    }
    }
    size_t idx = (size_t)(o - opts);
    c->set[idx / 64] |= 1ull << (idx % 64);
    return 0;
bad:
    cfg_error(c, "%s: %s.%s: cannot parse '%s' (%s)", src, o->section, o->key, val, o->help);
    return -EINVAL;
range:
    if (o->type == T_STR)
        cfg_error(c, "%s: %s.%s: length must be %llu..%llu", src, o->section, o->key,
                  (unsigned long long)o->min, (unsigned long long)o->max);
    else if (o->type == T_OCT)
        cfg_error(c, "%s: %s.%s = %s out of range 0%llo..0%llo", src, o->section, o->key, val,
                  (unsigned long long)o->min, (unsigned long long)o->max);
    else
        cfg_error(c, "%s: %s.%s = %s out of range %llu..%llu", src, o->section, o->key, val,
                  (unsigned long long)o->min, (unsigned long long)o->max);
    return -EINVAL;
}

static void defaults(patd_config_t *c)
{
    memset(c, 0, sizeof(*c));
    for (size_t i = 0; i < PAT_ARRAY_SIZE(opts); i++)
        if (opt_set(c, &opts[i], opts[i].def, "built-in default") < 0)
            abort(); /* the table itself is wrong: a build error in spirit */
    memset(c->set, 0, sizeof(c->set));
}

typedef struct ini_ctx {
    patd_config_t *c;
    int errors;
    const char *path;
} ini_ctx_t;

static int ini_cb(void *ud, const char *section, const char *key, const char *val)
{
    ini_ctx_t *x = ud;
    const opt_t *o = opt_find(section, key);
    if (!o) {
        cfg_error(x->c, "%s: unknown option [%s] %s", x->path, section, key);
        x->errors++;
        return 1;
    }
    if (opt_set(x->c, o, val, x->path) < 0)
        x->errors++;
    return 1;
}

/* What fstat calls a file that is not a regular one, for the message that refuses it. */
static const struct {
    mode_t type;
    const char *name;
} file_kinds[] = {
    {S_IFDIR, "a directory"},    {S_IFIFO, "a FIFO"},    {S_IFCHR, "a character device"},
    {S_IFBLK, "a block device"}, {S_IFSOCK, "a socket"},
};

/* A config file's whole text, NUL-terminated (malloc'd, into *ret_text): a regular file (a
 * symlink to one is followed) of at most PATD_CONFIG_MAX_BYTES without NUL bytes. Opened
 * without blocking, so that a FIFO no one writes is refused by what fstat says like a device or
 * a directory, before a byte is read; the cap is checked on the bytes read too (the file may
 * grow after fstat). Returns 0; 1 when optional and there is no such file; or a negative errno
 * with the cause in c->error. May block on a hung mount: reload calls it off the loop thread. */
static int slurp(patd_config_t *c, const char *path, int optional, char **ret_text)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0 && optional && errno == ENOENT)
        return 1;
    if (fd < 0) {
        int rc = -errno;
        cfg_error(c, "cannot open config %s: %s", path, strerror(-rc));
        return rc;
    }
    char *text = NULL;
    struct stat st;
    int rc = fstat(fd, &st) < 0 ? -errno : 0;
    if (rc < 0) {
        cfg_error(c, "config %s: fstat: %s", path, strerror(-rc));
        goto out;
    }
    if (!S_ISREG(st.st_mode)) {
        const char *kind = "not a regular file";
        for (size_t i = 0; i < PAT_ARRAY_SIZE(file_kinds); i++)
            if ((st.st_mode & S_IFMT) == file_kinds[i].type)
                kind = file_kinds[i].name;
        cfg_error(c, "config %s is %s, not a regular file; not read", path, kind);
        rc = -EINVAL;
        goto out;
    }
    size_t len = 0;
    if ((uint64_t)st.st_size <= PATD_CONFIG_MAX_BYTES) {
        text = pat_xmalloc(PATD_CONFIG_MAX_BYTES + 2);
        while (len <= PATD_CONFIG_MAX_BYTES) { /* one byte past the cap tells it grew */
            ssize_t n = read(fd, text + len, PATD_CONFIG_MAX_BYTES + 1 - len);
            if (n == 0)
                break;
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0) {
                rc = -errno;
                cfg_error(c, "config %s: read: %s", path, strerror(-rc));
                goto out;
            }
            len += (size_t)n;
        }
    }
    if ((uint64_t)st.st_size > PATD_CONFIG_MAX_BYTES || len > PATD_CONFIG_MAX_BYTES) {
        cfg_error(c, "config %s is larger than %u bytes (the most a config may have); not read",
                  path, PATD_CONFIG_MAX_BYTES);
        rc = -EFBIG;
        goto out;
    }
    text[len] = 0;
    if (memchr(text, 0, len)) {
        cfg_error(c, "config %s holds a NUL byte: not a text file; not read", path);
        rc = -EINVAL;
        goto out;
    }
    *ret_text = text;
    text = NULL;
out:
    free(text);
    close(fd);
    return rc;
}

/* Reads path (slurp) and parses it into c: 0, 1 (optional and absent), or a negative errno with
 * the cause in c->error. */
static int read_file(patd_config_t *c, const char *path, int optional)
{
    char *text = NULL;
    int rc = slurp(c, path, optional, &text);
    if (rc != 0)
        return rc;
    ini_ctx_t x = {c, 0, path};
    int r = ini_parse_string(text, ini_cb, &x);
    free(text);
    if (r > 0) {
        cfg_error(c, "%s:%d: syntax error", path, r);
        return -EINVAL;
    }
    if (r < 0) { /* with a string, only its allocation can fail */
        cfg_error(c, "%s: the INI parser is out of memory", path);
        return -ENOMEM;
    }
    return x.errors ? -EINVAL : 0;
}

const char *patd_dtype_name(uint32_t d)
{
    switch (d) {
    case 0:
        return "auto";
    case KERN_F16:
        return "f16";
    case KERN_BF16:
        return "bf16";
    case KERN_F32:
        return "f32";
    case KERN_FP8_E4M3:
        return "fp8_e4m3";
    case KERN_FP8_E5M2:
        return "fp8_e5m2";
    }
    return "?";
}

kern_model_t patd_config_model(const patd_config_t *c)
{
    return (kern_model_t){.n_layers = c->layers,
                          .q_heads = c->q_heads,
                          .kv_heads = c->kv_heads,
                          .head_dim = c->head_dim,
                          .block_size = c->block_size,
                          .dtype = (kern_dtype_t)c->dtype,
                          .kv_dtype = (kern_dtype_t)c->kv_dtype,
                          .kv_scale = c->kv_scale};
}

/* Cross-option rules the table cannot express. */
static int validate(patd_config_t *c)
{
    const kern_model_t m = patd_config_model(c);
    if (!kern_kv_dtype_ok(&m)) {
        cfg_error(c,
                  "model.kv_dtype %s does not go with model.dtype %s: the pool holds the "
                  "clients' dtype (auto) or fp8 under an f16 or bf16 one",
                  patd_dtype_name(c->kv_dtype), patd_dtype_name(c->dtype));
        return -EINVAL;
    }
    if (!(c->kv_scale > 0.0f)) {
        cfg_error(c, "model.kv_scale must be > 0 (got %g)", (double)c->kv_scale);
        return -EINVAL;
    }
    if (kern_supported(&m) < 0) {
        cfg_error(c,
                  "model not supported: q_heads %u / kv_heads %u (group <= 16, divisible), "
                  "head_dim %u (one of" KERN_HEAD_DIMS(KERN_HEAD_DIM_TEXT) "), block_size %u (16)",
                  c->q_heads, c->kv_heads, c->head_dim, c->block_size);
        return -EINVAL;
    }
    if (strcmp(c->backend, "auto") && strcmp(c->backend, "cpu") && strcmp(c->backend, "cuda")) {
        cfg_error(c, "daemon.backend must be auto, cpu or cuda (got '%s')", c->backend);
        return -EINVAL;
    }
    if (strcmp(c->enqueue, "ahead") && strcmp(c->enqueue, "on_ready")) {
        cfg_error(c, "gpu.enqueue must be ahead or on_ready (got '%s')", c->enqueue);
        return -EINVAL;
    }
    if (strcmp(c->merge, "launch") && strcmp(c->merge, "inside")) {
        cfg_error(c, "gpu.merge must be launch or inside (got '%s')", c->merge);
        return -EINVAL;
    }
    /* wide: another name of auto (patd_main reads it as auto) */
    if (strcmp(c->forward, "auto") && strcmp(c->forward, "mma") && strcmp(c->forward, "layer") &&
        strcmp(c->forward, "cpasync") && strcmp(c->forward, "tma") && strcmp(c->forward, "wide")) {
        cfg_error(c, "gpu.forward must be auto, cpasync, tma, layer or mma (got '%s')", c->forward);
        return -EINVAL;
    }
    if (strcmp(c->persist, "auto") && strcmp(c->persist, "off")) {
        cfg_error(c, "pool.persist must be auto or off (got '%s')", c->persist);
        return -EINVAL;
    }
    if (strcmp(c->prefix_scope, "uid") && strcmp(c->prefix_scope, "all")) {
        cfg_error(c, "pool.prefix_scope must be uid or all (got '%s')", c->prefix_scope);
        return -EINVAL;
    }
    if (sched_policy_parse(c->pack_policy) < 0) {
        cfg_error(c, "daemon.pack_policy must be auto, bytes, paper, query or tree (got '%s')",
                  c->pack_policy);
        return -EINVAL;
    }
    if (c->invariant_chunk % SCHED_INVARIANT_WINDOW) {
        cfg_error(c, "daemon.invariant_chunk must be a multiple of %u tokens (got %u)",
                  SCHED_INVARIANT_WINDOW, c->invariant_chunk);
        return -EINVAL;
    }
    if (strcmp(c->liveness, "auto") && strcmp(c->liveness, "lease")) {
        cfg_error(c, "daemon.liveness must be auto or lease (got '%s')", c->liveness);
        return -EINVAL;
    }
    size_t name_ok = c->name[0] == '.' ? 0
                                       : strspn(c->name, "abcdefghijklmnopqrstuvwxyz"
                                                         "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                         "0123456789-_.@");
    if (name_ok != strlen(c->name)) {
        cfg_error(c,
                  "daemon.name '%s' may hold letters, digits, '-', '_', '@' and '.' (not "
                  "first) only",
                  c->name);
        return -EINVAL;
    }
    if (c->socket_group[0] && !group_exists(c->socket_group)) {
        cfg_error(c, "daemon.socket_group '%s' does not exist", c->socket_group);
        return -EINVAL;
    }
    if (c->admin_group[0] && !group_exists(c->admin_group)) {
        cfg_error(c, "daemon.admin_group '%s' does not exist", c->admin_group);
        return -EINVAL;
    }
    if (c->lease_ms > c->max_lease_ms) {
        cfg_error(c, "limits.lease_ms %u exceeds limits.max_lease_ms %u", c->lease_ms,
                  c->max_lease_ms);
        return -EINVAL;
    }
    if (!(c->memory_fraction >= 0.05f && c->memory_fraction <= 0.95f)) {
        cfg_error(c, "gpu.memory_fraction must be 0.05..0.95 (got %g)", (double)c->memory_fraction);
        return -EINVAL;
    }
    /* pool.blocks = auto: checked again once start has sized the pool (patd_main) */
    if (c->blocks && c->conn_max_blocks > c->blocks) {
        cfg_error(c, "limits.conn_max_blocks %u exceeds pool.blocks %u", c->conn_max_blocks,
                  c->blocks);
        return -EINVAL;
    }
    if (c->conn_max_seqs > c->max_seqs) {
        cfg_error(c, "limits.conn_max_seqs %u exceeds pool.max_seqs %u", c->conn_max_seqs,
                  c->max_seqs);
        return -EINVAL;
    }
    return 0;
}

static void default_runtime_dir(patd_config_t *c)
{
    if (c->runtime_dir[0])
        return;
    const char *x = getenv("XDG_RUNTIME_DIR");
    if (geteuid() == 0)
        snprintf(c->runtime_dir, sizeof(c->runtime_dir), "/run/patd");
    else if (x && *x && strlen(x) < sizeof(c->runtime_dir) - 6)
        snprintf(c->runtime_dir, sizeof(c->runtime_dir), "%s/patd", x);
    else
        snprintf(c->runtime_dir, sizeof(c->runtime_dir), "/tmp/patd-%u", (unsigned)geteuid());
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: patd [--config FILE] [--KEY=VALUE ...] [--check-config] [--print-config]\n"
            "            [--help] [--version]\n\n"
            "patd serves prefix-aware attention over a paged KV cache to frontends in other\n"
            "processes (libpat). Control socket: ipc://<runtime_dir>/<name>.sock; events:\n"
            "ipc://<runtime_dir>/<name>.events. With no config on a machine without a GPU it\n"
            "runs the cpu backend with a small pool.\n\n"
            "  --config FILE     INI file ([section] key = value; a regular file of at most\n"
            "                    %u KiB, as the drop-in); options below\n"
            "  --instance N      one of several daemons on a host (patd@N.service, GPU N):\n"
            "                    name <name>@N, metrics_port + N, and the drop-in\n"
            "                    <config dir>/<config stem>@N.conf read after the file\n"
            "                    when it exists (e.g. /etc/patd/patd@1.conf)\n"
            "  --check-config    validate the configuration and exit (0 valid, 1 not)\n"
            "  --print-config    print the effective configuration as INI and exit\n"
            "  --version         print the version and the backends this build carries\n\n"
            "Options (INI key under [section], or --key=value; * = reloaded by SIGHUP):\n",
            PATD_CONFIG_MAX_BYTES >> 10);
    const char *sec = "";
    for (size_t i = 0; i < PAT_ARRAY_SIZE(opts); i++) {
        const opt_t *o = &opts[i];
        if (strcmp(sec, o->section))
            fprintf(f, "  [%s]\n", sec = o->section);
        char range[64] = "";
        if (o->type == T_U32 || o->type == T_U32A || o->type == T_U64)
            snprintf(range, sizeof(range), " %s%llu..%llu", o->type == T_U32A ? "auto | " : "",
                     (unsigned long long)o->min, (unsigned long long)o->max);
        fprintf(f, "    %-22s%s %s (default %s%s)%s\n", o->key, o->reload ? "*" : " ", o->help,
                o->def[0] ? o->def : "\"\"", range, "");
    }
    fprintf(f, "\nSignals: SIGTERM/SIGINT drain in-flight steps and exit; SIGHUP reloads the *\n"
               "options from the config file; SIGUSR2 (as `patctl upgrade`) starts the binary at\n"
               "patd's path as a successor beside this daemon, which serves on until the\n"
               "successor is ready, then drains and hands it the KV cache (pool.persist) and the\n"
               "sockets (a successor that fails costs nothing). Under systemd (Type=notify) it\n"
               "reports READY=1 once the pool is allocated and the sockets are bound, STATUS=\n"
               "lines, WATCHDOG=1 while its executors still move, hands the pool and the cache\n"
               "index to the descriptor store (FDSTORE=1) at start, and names an upgrade's\n"
               "successor with MAINPID=.\n");
}

/* Applies --key=value overrides (argv) to c. Sets *ret_path from --config. */
static int parse_args(patd_config_t *c, int argc, char **argv, int *ret_action, int pass)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            *ret_action = 'h';
            continue;
        }
        if (!strcmp(a, "--version")) {
            *ret_action = 'v';
            continue;
        }
        if (!strcmp(a, "--check-config")) {
            *ret_action = 'c';
            continue;
        }
        if (!strcmp(a, "--print-config")) {
            *ret_action = 'p';
            continue;
        }
        if (!strcmp(a, "--config") || !strncmp(a, "--config=", 9)) {
            const char *v = a[8] == '=' ? a + 9 : (i + 1 < argc ? argv[++i] : NULL);
            if (!v) {
                cfg_error(c, "--config needs a file");
                return -EINVAL;
            }
            if (pass == 0)
                snprintf(c->path, sizeof(c->path), "%s", v);
            continue;
        }
        if (!strcmp(a, "--instance") || !strncmp(a, "--instance=", 11)) {
            const char *v = a[10] == '=' ? a + 11 : (i + 1 < argc ? argv[++i] : NULL);
            if (!v || !*v || strspn(v, "0123456789") != strlen(v) || strlen(v) > 4 ||
                atoi(v) > 1023) {
                cfg_error(c, "--instance takes a GPU number 0..1023 (got '%s')", v ? v : "");
                return -EINVAL;
            }
            if (pass == 0)
                snprintf(c->instance, sizeof(c->instance), "%d", atoi(v));
            continue;
        }
        if (strncmp(a, "--", 2)) {
            cfg_error(c, "unexpected argument '%s' (try --help)", a);
            return -EINVAL;
        }
        char key[64];
        const char *eq = strchr(a, '=');
        const char *val = NULL;
        size_t kl = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
        if (kl >= sizeof(key)) {
            cfg_error(c, "unknown option '%s' (try --help)", a);
            return -EINVAL;
        }
        memcpy(key, a + 2, kl);
        key[kl] = 0;
        if (eq)
            val = eq + 1;
        else if (i + 1 < argc)
            val = argv[++i];
        const opt_t *o = opt_find(NULL, key);
        if (!o) {
            cfg_error(c, "unknown option '--%s' (try --help)", key);
            return -EINVAL;
        }
        if (!val) {
            cfg_error(c, "--%s needs a value", key);
            return -EINVAL;
        }
        if (pass == 1 && opt_set(c, o, val, "command line") < 0)
            return -EINVAL;
    }
    return 0;
}

/* What --instance N derives from the file's values, before its drop-in and the command line:
 * the name <name>@N (sockets <name>@N.sock, staging names) and metrics_port + N, so instances
 * sharing one file never collide. */
static int derive_instance(patd_config_t *c)
{
    if (!c->instance[0])
        return 0;
    unsigned n = (unsigned)atoi(c->instance);
    char name[sizeof(c->name)];
    int len = snprintf(name, sizeof(name), "%s@%u", c->name, n);
    if (len < 0 || len > 40) {
        cfg_error(c, "daemon.name '%s' is too long for instance %u (40 at most)", c->name, n);
        return -EINVAL;
    }
    memcpy(c->name, name, (size_t)len + 1);
    if (c->metrics_port && c->metrics_port + n > 65535) {
        cfg_error(c, "daemon.metrics_port %u + instance %u is past 65535", c->metrics_port, n);
        return -EINVAL;
    }
    if (c->metrics_port)
        c->metrics_port += n;
    if (!c->path[0])
        return 0;
    /* /etc/patd/patd.conf -> /etc/patd/patd@N.conf */
    const char *slash = strrchr(c->path, '/');
    size_t dir = slash ? (size_t)(slash - c->path) + 1 : 0, stem = strlen(c->path) - dir;
    if (stem > 5 && !strcmp(c->path + strlen(c->path) - 5, ".conf"))
        stem -= 5;
    snprintf(c->dropin, sizeof(c->dropin), "%.*s%.*s@%u.conf", (int)dir, c->path, (int)stem,
             c->path + dir, n);
    int rc = read_file(c, c->dropin, 1);
    c->dropin_read = rc != 1; /* it exists: read, or refused with the cause */
    return PAT_MIN(rc, 0);
}

/* The file, the instance and its drop-in, the command line, the cross-option rules. */
static int load_layers(patd_config_t *c, int argc, char **argv, int *action)
{
    if (c->path[0] && read_file(c, c->path, 0) < 0)
        return -EINVAL;
    if (derive_instance(c) < 0 || parse_args(c, argc, argv, action, 1) < 0 || validate(c) < 0)
        return -EINVAL;
    c->blocks_auto = c->blocks == 0;
    default_runtime_dir(c);
    return 0;
}

int patd_config_load(patd_config_t *c, int argc, char **argv)
{
    int action = 0;
    defaults(c);
    if (parse_args(c, argc, argv, &action, 0) < 0)
        return -EINVAL;
    if (action == 'h') {
        usage(stdout);
        return 1;
    }
    if (action == 'v') {
        printf("patd %s (wire protocol %u; backends: %s)\n", PATD_VERSION, (unsigned)IPC_VERSION,
               kern_backend_list());
        return 1;
    }
    if (load_layers(c, argc, argv, &action) < 0)
        return -EINVAL;
    if (action == 'c') {
        printf("patd: configuration %s%s%s is valid\n", c->path[0] ? c->path : "(built-in)",
               c->dropin_read ? " + " : "", c->dropin_read ? c->dropin : "");
        return 1;
    }
    if (action == 'p') {
        patd_config_print(c, stdout);
        return 1;
    }
    for (size_t i = 0; i < PAT_ARRAY_SIZE(opts); i++)
        if (opts[i].apply)
            opts[i].apply(c);
    return 0;
}

int patd_config_reread(const patd_config_t *running, int argc, char **argv, patd_config_t *ret_next)
{
    patd_config_t *n = ret_next;
    int action = 0;
    defaults(n);
    snprintf(n->path, sizeof(n->path), "%s", running->path);
    snprintf(n->instance, sizeof(n->instance), "%s", running->instance);
    if (load_layers(n, argc, argv, &action) < 0)
        return -EINVAL;
    return 0;
}

int patd_config_apply(patd_config_t *c, patd_config_t *next)
{
    if (next->blocks_auto && c->blocks_auto)
        next->blocks = c->blocks; /* what start sized from auto, still auto in the file */
    int kept = 0;
    for (size_t i = 0; i < PAT_ARRAY_SIZE(opts); i++) {
        const opt_t *o = &opts[i];
        uint8_t *a = (uint8_t *)c + o->off, *b = (uint8_t *)next + o->off;
        if (!memcmp(a, b, o->size))
            continue;
        if (!o->reload) {
            patd_warn("reload: %s.%s changed in the file but needs a restart; kept", o->section,
                      o->key);
            kept++;
        } else {
            memcpy(a, b, o->size);
            if (o->apply)
                o->apply(c);
            patd_info("reload: %s.%s changed", o->section, o->key);
        }
    }
    return kept;
}

void patd_config_print(const patd_config_t *c, FILE *f)
{
    const char *sec = "";
    fprintf(f, "# patd effective configuration (%s%s%s)\n", c->path[0] ? c->path : "built-in",
            c->dropin_read ? " + " : "", c->dropin_read ? c->dropin : "");
    for (size_t i = 0; i < PAT_ARRAY_SIZE(opts); i++) {
        const opt_t *o = &opts[i];
        const uint8_t *p = (const uint8_t *)c + o->off;
        if (strcmp(sec, o->section))
            fprintf(f, "%s[%s]\n", i ? "\n" : "", sec = o->section);
        fprintf(f, "%s = ", o->key);
        switch (o->type) {
        case T_STR:
            fprintf(f, "%s\n", (const char *)p);
            break;
        case T_U32:
            fprintf(f, "%u\n", *(const uint32_t *)p);
            break;
        case T_U32A:
            if (*(const uint32_t *)p)
                fprintf(f, "%u\n", *(const uint32_t *)p);
            else
                fprintf(f, "auto\n");
            break;
        case T_U64:
            fprintf(f, "%llu\n", (unsigned long long)*(const uint64_t *)p);
            break;
        case T_OCT:
            fprintf(f, "0%o\n", *(const uint32_t *)p);
            break;
        case T_F32:
            fprintf(f, "%g\n", (double)*(const float *)p);
            break;
        case T_LEVEL:
            fprintf(f, "%s\n", level_names[*(const uint32_t *)p]);
            break;
        case T_DTYPE:
        case T_KVDTYPE:
            fprintf(f, "%s\n", patd_dtype_name(*(const uint32_t *)p));
            break;
        }
    }
}

int patd_config_was_set(const patd_config_t *c, const char *key)
{
    const opt_t *o = opt_find(NULL, key);
    if (!o)
        return 0;
    size_t idx = (size_t)(o - opts);
    return !!(c->set[idx / 64] & (1ull << (idx % 64)));
}
