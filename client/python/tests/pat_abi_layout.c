/*
 * pat_abi_layout.c — prints, as one JSON object on stdout, the layout of every struct that
 * crosses libpat's C ABI (client/pat.h) and the version pat.h states, as the C compiler sees
 * them: {"version": [major, minor, patch], "structs": {"pat_model_t": {"size": N, "fields":
 * {"n_layers": [offset, size], ...}}, ...}} (bytes).
 *
 * test_abi.py compares it with the ctypes mirror in python/patd/__init__.py. A field added to
 * pat.h but not to the table below leaves a gap between the listed fields, which the test
 * reports too, so this table cannot silently fall behind pat.h. Built by the Makefile as
 * build/tests/pat_abi_layout; test_python.sh passes its path in PATD_ABI_LAYOUT.
 */
#include <stddef.h>
#include <stdio.h>

#include "pat.h"

typedef struct abi_row {
    const char *type, *field; /* field NULL: the struct's own size */
    size_t offset, size;
} abi_row_t;

#define SIZE(T)     {#T, NULL, 0, sizeof(T)},
#define FIELD(T, f) {#T, #f, offsetof(T, f), sizeof(((T *)0)->f)},

/* One struct after another: its SIZE row, then its fields in declaration order. */
static const abi_row_t rows[] = {
    /* clang-format off */
    SIZE(pat_model_t)
    FIELD(pat_model_t, n_layers) FIELD(pat_model_t, q_heads) FIELD(pat_model_t, kv_heads)
    FIELD(pat_model_t, head_dim) FIELD(pat_model_t, dtype) FIELD(pat_model_t, block_size)
    FIELD(pat_model_t, model_id)

    SIZE(pat_connect_opts_t)
    FIELD(pat_connect_opts_t, size) FIELD(pat_connect_opts_t, max_batch_tokens)
    FIELD(pat_connect_opts_t, max_seqs) FIELD(pat_connect_opts_t, timeout_ms)
    FIELD(pat_connect_opts_t, lease_ms) FIELD(pat_connect_opts_t, buffer)
    FIELD(pat_connect_opts_t, socket) FIELD(pat_connect_opts_t, label)
    FIELD(pat_connect_opts_t, model) FIELD(pat_connect_opts_t, pack_policy)
    FIELD(pat_connect_opts_t, kv_dtype) FIELD(pat_connect_opts_t, reserved)

    SIZE(pat_buffers_t)
    FIELD(pat_buffers_t, q) FIELD(pat_buffers_t, k) FIELD(pat_buffers_t, v)
    FIELD(pat_buffers_t, o) FIELD(pat_buffers_t, q_row_bytes) FIELD(pat_buffers_t, kv_row_bytes)
    FIELD(pat_buffers_t, max_batch_tokens) FIELD(pat_buffers_t, max_seqs)
    FIELD(pat_buffers_t, max_blocks) FIELD(pat_buffers_t, lease_ms) FIELD(pat_buffers_t, on_gpu)
    FIELD(pat_buffers_t, mps) FIELD(pat_buffers_t, kv_dtype) FIELD(pat_buffers_t, kv_scale)
    FIELD(pat_buffers_t, reserved)

    SIZE(pat_step_info_t)
    FIELD(pat_step_info_t, step) FIELD(pat_step_info_t, n_tokens)
    FIELD(pat_step_info_t, pack_reused) FIELD(pat_step_info_t, kv_bytes)
    FIELD(pat_step_info_t, qc_bytes) FIELD(pat_step_info_t, layers_done)
    FIELD(pat_step_info_t, committed) FIELD(pat_step_info_t, step_ns)
    FIELD(pat_step_info_t, pack_policy) FIELD(pat_step_info_t, reserved0)
    FIELD(pat_step_info_t, reserved)

    SIZE(pat_conn_stats_t)
    FIELD(pat_conn_stats_t, steps) FIELD(pat_conn_stats_t, tokens)
    FIELD(pat_conn_stats_t, kv_bytes) FIELD(pat_conn_stats_t, qc_bytes)
    FIELD(pat_conn_stats_t, prompt_tokens) FIELD(pat_conn_stats_t, cached_tokens)
    FIELD(pat_conn_stats_t, reserved)

    SIZE(pat_status_t)
    FIELD(pat_status_t, size) FIELD(pat_status_t, protocol) FIELD(pat_status_t, version)
    FIELD(pat_status_t, pid) FIELD(pat_status_t, instance) FIELD(pat_status_t, uptime_ms)
    FIELD(pat_status_t, draining) FIELD(pat_status_t, max_seq_len) FIELD(pat_status_t, backend)
    FIELD(pat_status_t, model) FIELD(pat_status_t, max_conns) FIELD(pat_status_t, conn_max_seqs)
    FIELD(pat_status_t, conn_max_blocks) FIELD(pat_status_t, conn_max_batch_tokens)
    FIELD(pat_status_t, conn_max_staging_mb) FIELD(pat_status_t, lease_ms)
    FIELD(pat_status_t, step_timeout_ms) FIELD(pat_status_t, blocks_total)
    FIELD(pat_status_t, blocks_free) FIELD(pat_status_t, blocks_used)
    FIELD(pat_status_t, blocks_cached) FIELD(pat_status_t, sequences) FIELD(pat_status_t, scale)
    FIELD(pat_status_t, softcap)
    FIELD(pat_status_t, kv_dtype)
    FIELD(pat_status_t, kv_scale)
    FIELD(pat_status_t, connections) FIELD(pat_status_t, steps_in_flight)
    FIELD(pat_status_t, reserved)
    /* clang-format on */
};

int main(void)
{
    printf("{\"version\": [%d, %d, %d], \"structs\": {", PAT_VERSION_MAJOR, PAT_VERSION_MINOR,
           PAT_VERSION_PATCH);
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        const abi_row_t *r = &rows[i];
        if (!r->field)
            printf("%s\n  \"%s\": {\"size\": %zu, \"fields\": {", i ? "}}," : "", r->type, r->size);
        else
            printf("%s\"%s\": [%zu, %zu]", rows[i - 1].field ? ", " : "", r->field, r->offset,
                   r->size);
    }
    printf("}}\n}}\n");
    return 0;
}
