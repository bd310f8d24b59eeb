/*
 * patd_range.c — first-fit range allocator with a coalescing, offset-sorted free list
 * (patd_range.h).
 */
#include "patd_range.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "pat_base.h"

static uint64_t round_up(uint64_t x, uint64_t a)
{
    return (x + a - 1) & ~(a - 1);
}

void patd_ranges_init(patd_ranges_t *rs, uint64_t bytes, uint64_t align)
{
    assert(align && (align & (align - 1)) == 0);
    memset(rs, 0, sizeof(*rs));
    rs->bytes = bytes;
    rs->align = align;
    if (bytes) {
        pat_grow((void **)&rs->free, &rs->cap, 1, sizeof(*rs->free));
        rs->free[0] = (patd_range_t){0, bytes};
        rs->n = 1;
    }
}

void patd_ranges_done(patd_ranges_t *rs)
{
    free(rs->free);
    memset(rs, 0, sizeof(*rs));
}

int patd_ranges_alloc(patd_ranges_t *rs, uint64_t len, uint64_t *ret_off)
{
    len = round_up(len ? len : 1, rs->align);
    for (uint32_t i = 0; i < rs->n; i++) {
        patd_range_t *r = &rs->free[i];
        if (r->len < len)
            continue;
        *ret_off = r->off;
        r->off += len;
        r->len -= len;
        if (r->len == 0) {
            memmove(r, r + 1, (rs->n - i - 1) * sizeof(*r));
            rs->n--;
        }
        return 0;
    }
    return -ENOMEM;
}

void patd_ranges_free(patd_ranges_t *rs, uint64_t off, uint64_t len)
{
    len = round_up(len ? len : 1, rs->align);
    assert(off % rs->align == 0 && off + len <= rs->bytes);
    uint32_t i = 0;
    while (i < rs->n && rs->free[i].off < off)
        i++;
    /* not free already: no overlap with either neighbour */
    assert(i == 0 || rs->free[i - 1].off + rs->free[i - 1].len <= off);
    assert(i == rs->n || off + len <= rs->free[i].off);
    int merge_prev = i > 0 && rs->free[i - 1].off + rs->free[i - 1].len == off;
    int merge_next = i < rs->n && off + len == rs->free[i].off;
    if (merge_prev && merge_next) {
        rs->free[i - 1].len += len + rs->free[i].len;
        memmove(&rs->free[i], &rs->free[i + 1], (rs->n - i - 1) * sizeof(*rs->free));
        rs->n--;
    } else if (merge_prev) {
        rs->free[i - 1].len += len;
    } else if (merge_next) {
        rs->free[i].off = off;
        rs->free[i].len += len;
    } else {
        pat_grow((void **)&rs->free, &rs->cap, rs->n + 1, sizeof(*rs->free));
        memmove(&rs->free[i + 1], &rs->free[i], (rs->n - i) * sizeof(*rs->free));
        rs->free[i] = (patd_range_t){off, len};
        rs->n++;
    }
}

uint64_t patd_ranges_free_bytes(const patd_ranges_t *rs)
{
    uint64_t sum = 0;
    for (uint32_t i = 0; i < rs->n; i++)
        sum += rs->free[i].len;
    return sum;
}
