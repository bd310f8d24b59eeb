/*
 * patd_config.h — patd's options: one table (patd_config.c) gives each its INI section and key,
 * type, bounds, default, whether SIGHUP can change it live, and its help line. The INI file is
 * read first, then command-line overrides (--key=value, same names); --help prints the table.
 */
#ifndef PATD_CONFIG_H
#define PATD_CONFIG_H

#include <stdint.h>
#include <stdio.h>

#include "kern.h" /* kern_model_t */

typedef struct patd_config {
    /* [daemon] */
    char name[64];
    char runtime_dir[256];
    uint32_t socket_mode; /* octal file mode of the sockets and staging buffers */
    char socket_group[64];
    char admin_group[64];     /* besides patd's user and root, who may drain, reload, check */
    char backend[16];         /* auto | cpu | cuda */
    char liveness[16];        /* auto | lease */
    char pack_policy[16];     /* auto | bytes | paper | query | tree: sessions' default */
    char prefix_scope[8];     /* uid | all: who shares prefix-cache blocks with whom */
    char persist[8];          /* auto | off: the pool and its index outlive the daemon */
    uint32_t invariant;       /* 1: batch-invariant plans (sched_config_t.invariant_chunk) */
    uint32_t invariant_chunk; /* tokens: their chunk, a multiple of SCHED_INVARIANT_WINDOW */
    uint32_t threads, executors;
    uint32_t log_level; /* syslog priority: 3 err .. 7 debug */
    uint32_t metrics_port;
    uint32_t drain_timeout_ms;
    /* [gpu] (cuda backend) */
    uint32_t device;        /* CUDA device ordinal */
    uint32_t enqueue_depth; /* layers the lane thread enqueues ahead of a lane's progress */
    uint32_t lanes;         /* steps in flight on the GPU at once; 0: auto (patd_lanes_auto) */
    uint32_t cross_pack;    /* 1: one uid's steps that wait together share a lane's forwards */
    uint32_t cross_pack_window_us, cross_pack_wait_us;
    char enqueue[12]; /* ahead | on_ready: when the lane thread enqueues a layer */
    char forward[16]; /* auto | cpasync | tma | layer | mma (wide: auto): kern_config_t.fwd */
    uint32_t dependent_launch; /* 1: kern_config_t.serial_launch = 0 */
    float memory_fraction;     /* pool.blocks = auto: share of the device's memory for the pool
                                  and the staging arena together */
    char merge[8];             /* launch | inside: kern_config_t.merge */
    /* [model] */
    uint32_t layers, q_heads, kv_heads, head_dim, dtype, block_size;
    uint32_t kv_dtype; /* 0: auto (dtype); a kern_dtype_t */
    float kv_scale;    /* fp8 KV's factor (kern_model_t.kv_scale) */
    uint64_t model_id;
    float scale, softcap;
    /* [pool] */
    uint32_t blocks;        /* 0: auto (sized at start from the backend's memory, then set here) */
    uint32_t cpu_memory_mb; /* pool.blocks = auto on the cpu backend: the pool's MiB */
    uint32_t max_seqs, max_seq_len;
    /* [limits] */
    uint32_t max_conns, conn_max_seqs, conn_max_blocks, conn_max_batch_tokens;
    uint32_t conn_max_staging_mb, lease_ms, max_lease_ms, step_timeout_ms, stall_cut_ms;
    uint32_t first_step_grace_ms; /* stall_cut_ms for a session's first step */
    uint32_t conns_per_uid;       /* 0: no bound but max_conns (patd_conn_hello) */
    uint32_t staging_mb;          /* MiB: every session's staging together, every backend */
    uint32_t memory_headroom_mb;  /* MiB left below a cgroup memory limit after a HELLO */

    /* bookkeeping */
    char path[512];   /* config file read ("" when none) */
    char instance[8]; /* --instance N ("" when none): patd@N.service's GPU */
    char dropin[528]; /* <dir>/<stem>@N.conf beside path, read after it when it exists */
    int dropin_read;  /* 1: the drop-in existed and was read */
    int blocks_auto;  /* 1: pool.blocks = auto was configured (blocks holds what start chose) */
    uint64_t set[2];  /* bit i: option i was given (file or command line) */
    char error[256];  /* the first refusal loading it ("" when none): a reload's answer */
} patd_config_t;

/* The most a config file (or drop-in) may hold, in bytes: patd's whole option table written out
 * with comments is a few KiB; what is larger is not a config and is refused unread. */
#define PATD_CONFIG_MAX_BYTES (1u << 20)

/* Layers, later ones winning: built-in defaults, the file (--config), what --instance N derives
 * (name <name>@N, metrics_port + N), the instance's drop-in <dir>/<stem>@N.conf when it exists,
 * then the command line. */

/* Outcome of patd_config_load: 0 run, 1 exit 0 (help/version/check/print done), <0 error. */
int patd_config_load(patd_config_t *c, int argc, char **argv);
/* A reload, in two steps. Files are read as at start: regular files of at most
 * PATD_CONFIG_MAX_BYTES, opened without blocking (a FIFO, a device, a directory are refused
 * unread).
 *
 * patd_config_reread: a fresh configuration from running's file, instance and drop-in and the
 * command line (which keeps winning), checked as at start, into *ret_next. Reads only running's
 * path and instance, fixed since start; may block on the file (a hung mount), so any thread but
 * the loop's calls it. 0, or -EINVAL with the cause in ret_next->error (also on stderr).
 *
 * patd_config_apply (the loop thread): applies next's reloadable options to c, runs their apply
 * hooks, and logs every change it keeps back (restart-only) with why. Returns the number of
 * changes kept back (0: all applied). */
int patd_config_reread(const patd_config_t *running, int argc, char **argv,
                       patd_config_t *ret_next);
int patd_config_apply(patd_config_t *c, patd_config_t *next);
void patd_config_print(const patd_config_t *c, FILE *f);
int patd_config_was_set(const patd_config_t *c, const char *key);
/* The model the config describes (kv_dtype 0: the dtype's) */
kern_model_t patd_config_model(const patd_config_t *c);
/* A dtype code's config name ("auto" for 0, "?" for none) */
const char *patd_dtype_name(uint32_t d);

#endif
