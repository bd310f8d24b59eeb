/*
 * patd_range.h — a first-fit allocator of byte ranges inside one region, with a coalescing free
 * list sorted by offset. patd_gpu.c carves every GPU session's staging rows out of the one
 * exported device allocation with it; it touches no memory of the region itself.
 *
 * Sized for tens of sessions (limits.max_conns): allocation and free are linear in the number of
 * free ranges. Not thread-safe (the loop thread owns it).
 */
#ifndef PATD_RANGE_H
#define PATD_RANGE_H

#include <stdint.h>

typedef struct patd_range {
    uint64_t off, len; /* bytes */
} patd_range_t;

typedef struct patd_ranges {
    patd_range_t *free; /* sorted by offset, never adjacent (merged), never empty */
    uint32_t n, cap;
    uint64_t bytes; /* the region */
    uint64_t align; /* every range starts on and is rounded up to this (a power of two) */
} patd_ranges_t;

/* The region [0, bytes) free. align: a power of two. */
void patd_ranges_init(patd_ranges_t *rs, uint64_t bytes, uint64_t align);
void patd_ranges_done(patd_ranges_t *rs);
/* First fit of len (rounded up to align): 0 and *ret_off, or -ENOMEM (nothing changed). */
int patd_ranges_alloc(patd_ranges_t *rs, uint64_t len, uint64_t *ret_off);
/* Gives back [off, off + len) as allocated (len as asked; rounded the same way), merging it with
 * free neighbours. */
void patd_ranges_free(patd_ranges_t *rs, uint64_t off, uint64_t len);
/* Free bytes in all. */
uint64_t patd_ranges_free_bytes(const patd_ranges_t *rs);

#endif
