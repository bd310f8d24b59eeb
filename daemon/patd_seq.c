/*
 * patd_seq.c — a session's sequence table: which kv sequences it holds (slot -> kv id, kv id ->
 * slot), the blocks each holds for the session's quota, and the SEQ_OPEN / FORK / TRUNCATE /
 * CLOSE requests.
 *
 * Thread context: the loop thread, except patd_seq_set_blocks and patd_seq_slot (any thread
 * under pool_mu; the executor of the session's step uses them while the loop leaves the step's
 * sequences alone: in_step).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "patd_int.h"
#include "patd_log.h"
#include "pat_base.h"

int patd_seq_slot(patd_conn_t *c, uint32_t kv)
{
    uint32_t s = pat_map_get(&c->seq_map, kv);
    return s == PAT_MAP_NONE ? -ENOENT : (int)s;
}

/* Brings the session's distinct-block count up to date with the slot's block table. Only what
 * changed since the last count is visited: the kv table's version moves only when an entry
 * before its last one changes (a twin's published copy shared at commit), so with the version
 * unchanged every entry but the last of the shorter table is as counted; else (rare) the whole
 * table is counted again. A step's append or a truncate costs the blocks it adds or drops. */
void patd_seq_set_blocks(patd_conn_t *c, uint32_t slot)
{
    patd_seq_t *s = &c->seqs[slot];
    kv_seq_info_t info = {0};
    if (s->kv == KV_NONE || kv_seq_info(c->d->pool, s->kv, &info) < 0)
        info.n_blocks = 0;
    uint32_t keep = 0;
    if (info.version == s->version) {
        keep = PAT_MIN(s->blocks, info.n_blocks);
        while (keep && s->counted[keep - 1] != info.blocks[keep - 1])
            keep--;
    }
    for (uint32_t i = keep; i < s->blocks; i++)
        if (--c->blk_refs[s->counted[i]] == 0)
            c->blocks_held--;
    if (info.n_blocks > s->counted_cap) {
        s->counted_cap = PAT_MAX(info.n_blocks, 2 * s->counted_cap);
        s->counted = pat_xrealloc(s->counted, (size_t)s->counted_cap * sizeof(uint32_t));
    }
    for (uint32_t i = keep; i < info.n_blocks; i++) {
        const uint32_t b = info.blocks[i];
        if (c->blk_refs[b]++ == 0)
            c->blocks_held++;
        s->counted[i] = b;
    }
    s->blocks = info.n_blocks;
    s->version = info.version;
}

int patd_seq_check(patd_conn_t *c)
{
    const uint32_t n_blocks = c->d->cfg.blocks;
    uint32_t *refs = pat_xcalloc(n_blocks, sizeof(uint32_t)), held = 0;
    int rc = 0;
    for (uint32_t i = 0; i < c->max_seqs && rc == 0; i++) {
        const patd_seq_t *s = &c->seqs[i];
        kv_seq_info_t info = {0};
        if (s->kv != KV_NONE && kv_seq_info(c->d->pool, s->kv, &info) < 0)
            rc = -EUCLEAN;
        else if (s->blocks != info.n_blocks ||
                 (info.n_blocks &&
                  memcmp(s->counted, info.blocks, info.n_blocks * sizeof(uint32_t))))
            rc = -EUCLEAN;
        for (uint32_t k = 0; k < info.n_blocks && rc == 0; k++)
            held += refs[info.blocks[k]]++ == 0;
        if (rc < 0)
            patd_err("session %016llx: slot %u's counted blocks differ from its table",
                     (unsigned long long)c->session, i);
    }
    if (rc == 0 && (held != c->blocks_held || memcmp(refs, c->blk_refs, n_blocks * 4))) {
        patd_err("session %016llx: %u blocks held by its count, %u by its tables",
                 (unsigned long long)c->session, c->blocks_held, held);
        rc = -EUCLEAN;
    }
    free(refs);
    return rc;
}

void patd_seq_free_all(patd_conn_t *c)
{
    if (c->seqs)
        for (uint32_t i = 0; i < c->max_seqs; i++)
            free(c->seqs[i].counted);
    free(c->seqs);
    free(c->blk_refs);
    c->seqs = NULL;
    c->blk_refs = NULL;
}

static int copy_blocks(patd_t *d, const kv_copy_t *cp)
{
    if (cp->src == KV_NONE)
        return 0;
    pthread_mutex_lock(&d->be_mu);
    int rc = kern_copy_blocks(d->be, &cp->src, &cp->dst, 1);
    pthread_mutex_unlock(&d->be_mu);
    return rc;
}

/* A free slot of the session. Its forest entry may still name a closed sequence: the step's
 * preparation notices (forest_kv != kv) and leaves it before anything joins (patd_step.c); only
 * the step's owner reads or writes forest_kv, so this does not touch it. */
static int free_slot(patd_conn_t *c)
{
    for (uint32_t i = 0; i < c->max_seqs; i++)
        if (c->seqs[i].kv == KV_NONE)
            return (int)i;
    return -EMFILE;
}

static void seq_attach(patd_conn_t *c, uint32_t slot, uint32_t kv)
{
    c->seqs[slot].kv = kv; /* in_step is 0 on a free slot; blocks too (set_blocks below) */
    pat_map_put(&c->seq_map, kv, slot);
    c->n_open++;
    patd_seq_set_blocks(c, slot);
}

static void seq_detach(patd_conn_t *c, uint32_t slot)
{
    pat_map_del(&c->seq_map, c->seqs[slot].kv);
    c->seqs[slot].kv = KV_NONE;
    patd_seq_set_blocks(c, slot);
    c->n_open--;
}

static void seq_open(patd_t *d, patd_conn_t *c, patd_req_t *rq, const uint8_t *body)
{
    ipc_seq_open_req_t r;
    ipc_seq_open_rep_t rep = {0};
    memcpy(&r, body, sizeof(r));
    if (d->draining) {
        patd_reply_error(d, rq, -ESHUTDOWN, "draining: no new sequences");
        return;
    }
    if (c->n_open >= c->max_seqs) {
        patd_reply_error(d, rq, -EDQUOT, "%u sequences open (session quota %u)", c->n_open,
                         c->max_seqs);
        return;
    }
    if (r.n_tokens > d->cfg.max_seq_len) {
        patd_reply_error(d, rq, -E2BIG, "prompt of %u tokens exceeds max_seq_len %u", r.n_tokens,
                         d->cfg.max_seq_len);
        return;
    }
    int slot = free_slot(c);
    if (slot < 0) {
        patd_reply_error(d, rq, -EDQUOT, "no free sequence slot");
        return;
    }
    /* copied out: the body sits at a 40-byte offset in its frame, unaligned for wider types */
    uint32_t *tok = pat_xmalloc((size_t)r.n_tokens * 4);
    memcpy(tok, body + sizeof(r), (size_t)r.n_tokens * 4);
    pthread_mutex_lock(&d->pool_mu);
    uint32_t seq, cached, pending;
    /* the prefix cache's scope: the kernel's word for the client's user (SO_PEERCRED), so that
     * one user's K and V for a prompt never reach another's sequences; 0 for every session
     * where pool.prefix_scope = all */
    const uint64_t scope = strcmp(d->cfg.prefix_scope, "all") ? PATD_SCOPE_UID(c->uid) : 0;
    int rc = kv_seq_open_pending(d->pool, scope, tok, r.n_tokens, &seq, &cached, &pending);
    if (rc == 0) {
        seq_attach(c, (uint32_t)slot, seq);
        rep.seq = seq;
        rep.len = cached;
        rep.pending = pending;
    }
    pthread_mutex_unlock(&d->pool_mu);
    free(tok);
    if (rc == -EMFILE)
        patd_reply_error(d, rq, -EMFILE, "pool.max_seqs sequences open daemon-wide");
    else if (rc < 0)
        patd_reply_error(d, rq, rc, "open: %s", strerror(-rc));
    else /* SEQ_OPEN's reply is the first 8 bytes (ipc_seq_rep_t) */
        patd_reply_ok(d, c, rq, &rep,
                      rq->hdr.opcode == IPC_OP_SEQ_OPEN_PENDING ? sizeof(rep)
                                                                : sizeof(ipc_seq_rep_t));
}

void patd_seq_request(patd_t *d, patd_conn_t *c, patd_req_t *rq, const uint8_t *body)
{
    uint32_t op = rq->hdr.opcode;
    if (op == IPC_OP_SEQ_OPEN || op == IPC_OP_SEQ_OPEN_PENDING) {
        seq_open(d, c, rq, body);
        return;
    }
    ipc_seq_req_t r;
    ipc_seq_rep_t rep = {0};
    int rc = 0;
    memcpy(&r, body, sizeof(r));
    int slot = patd_seq_slot(c, r.seq);
    if (slot < 0) {
        patd_reply_error(d, rq, -ENOENT, "sequence %u is not open in this session", r.seq);
        return;
    }
    if (c->seqs[slot].in_step) {
        patd_reply_error(d, rq, -EBUSY, "sequence %u is in the step in flight", r.seq);
        return;
    }
    kv_copy_t cp = {KV_NONE, KV_NONE};
    pthread_mutex_lock(&d->pool_mu);
    kv_seq_info_t info;
    kv_seq_info(d->pool, r.seq, &info);
    rep.seq = r.seq;
    if (op == IPC_OP_SEQ_FORK) {
        uint32_t child;
        int cs = free_slot(c);
        if (d->draining)
            rc = -ESHUTDOWN;
        else if (c->n_open >= c->max_seqs || cs < 0)
            rc = -EDQUOT;
        else if (c->blocks_held + (info.len % d->model.block_size != 0) > c->max_blocks)
            rc = -EDQUOT; /* the child shares every full block; a partial last one is copied */
        else if ((rc = kv_seq_fork(d->pool, r.seq, &child, &cp)) == 0) {
            seq_attach(c, (uint32_t)cs, child);
            rep.seq = child;
            rep.len = info.len;
        }
    } else if (op == IPC_OP_SEQ_TRUNCATE) {
        if (r.arg > info.len)
            rc = -ERANGE;
        else if ((rc = kv_seq_truncate(d->pool, r.seq, r.arg, &cp)) == 0) {
            patd_seq_set_blocks(c, (uint32_t)slot);
            rep.len = r.arg;
        }
    } else { /* SEQ_CLOSE */
        rc = kv_seq_close(d->pool, r.seq);
        if (rc == 0)
            seq_detach(c, (uint32_t)slot);
    }
    pthread_mutex_unlock(&d->pool_mu);
    if (rc == 0)
        rc = copy_blocks(d, &cp);
    if (rc < 0)
        patd_reply_error(d, rq, rc, "%s of sequence %u (length %u): %s", ipc_op_name(op), r.seq,
                         info.len, rc == -ERANGE ? "beyond its length" : strerror(-rc));
    else
        patd_reply_ok(d, c, rq, &rep, sizeof(rep));
}

void patd_seq_close_all(patd_t *d, patd_conn_t *c, uint32_t *ret_closed)
{
    uint32_t closed = 0;
    pthread_mutex_lock(&d->pool_mu);
    for (uint32_t i = 0; i < c->max_seqs; i++)
        if (c->seqs[i].kv != KV_NONE) {
            kv_seq_close(d->pool, c->seqs[i].kv);
            closed++;
        }
    pthread_mutex_unlock(&d->pool_mu);
    *ret_closed = closed;
}
