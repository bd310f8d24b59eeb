/*
 * fz_mutate.h — the transport-level fuzzer's inputs (fuzz_sockets.c): the corpus (seeds, and
 * every input whose outcome signature was new), the mutators that make the next input from it,
 * the dictionary they insert from, and the seeds themselves: built from ipc_proto.h at run time
 * (so a protocol bump never leaves them stale), and loaded from a directory of files.
 *
 * Inputs are fz_wire.h's: [mode] [param] [payload]. A seed file <target>-<name>.raw holds raw
 * wire bytes and runs with FZ_MODE_SEED; a file <target>-<name>.in is a whole input (crash files
 * are written so). Deterministic for a seed of the random generator and a sequence of signatures.
 */
#ifndef FZ_MUTATE_H
#define FZ_MUTATE_H

#include <stddef.h>
#include <stdint.h>

#include "fz_wire.h"
#include "ipc_proto.h"
#include "tl_rng.h"

#define FZ_SIG_BITS 20 /* signatures kept: a bitmap of 2^20 bits (128 KiB) */

typedef struct fz_entry {
    uint8_t *data;
    uint32_t len;
    uint32_t seed; /* 1: a seed, never replaced when the corpus is full */
} fz_entry_t;

typedef struct fz_corpus {
    fz_entry_t *e;
    uint32_t n, cap;
    uint32_t max;     /* entries at most; a new one past it replaces a random non-seed */
    uint32_t n_seeds; /* seeds loaded (the first n_seeds entries) */
    uint64_t *hash;   /* content hashes for de-duplication (open addressing, 0 = empty) */
    uint32_t hash_cap, hash_n;
    uint8_t *seen; /* signature bitmap */
} fz_corpus_t;

void fz_corpus_init(fz_corpus_t *c, uint32_t max);
void fz_corpus_done(fz_corpus_t *c);
/* Adds a copy unless the same bytes are there. Returns 1 added, 0 duplicate. */
int fz_corpus_add(fz_corpus_t *c, const uint8_t *data, size_t len, int seed);
/* Marks a signature seen. Returns 1 when it was new. */
int fz_corpus_sig_new(fz_corpus_t *c, uint32_t sig);

typedef struct fz_dict {
    uint8_t (*tok)[48];
    uint8_t *len;
    uint32_t n, cap;
} fz_dict_t;

/* The tokens the mutators insert: SP headers, ipc-transport message headers, patd frame headers
 * of every opcode, HTTP request pieces, event line words. */
void fz_dict_init(fz_dict_t *d);
void fz_dict_done(fz_dict_t *d);

/* Writes the next input into out (max bytes): up to 5 stacked mutations of src. Returns its
 * length (>= 0). */
size_t fz_mutate(tl_rng_t *r, const fz_corpus_t *c, const fz_dict_t *d, const uint8_t *src,
                 size_t len, uint8_t *out, size_t max);

/* The built-in seeds of a target: name, raw wire bytes, the mode and param they run with
 * (FZ_MODE_SEED, or descriptors attached for one seed of each Unix socket), and hostile = 1 for
 * those that are not valid requests (nanomsg message types other than 1, a message to a PUB,
 * lies about lengths). */
typedef void fz_seed_fn(void *ud, const char *name, const uint8_t *raw, size_t len, uint8_t mode,
                        uint8_t param, int hostile);
void fz_seeds_builtin(const fz_target_t *t, const ipc_model_sig_t *model, fz_seed_fn *fn, void *ud);

/* Adds the files of dir that belong to target t. Returns how many, or a negative errno. */
int fz_seeds_load(fz_corpus_t *c, const fz_target_t *t, const char *dir, size_t max_len);

/* Reads a whole file (max bytes at most). Returns its length or a negative errno; *ret is
 * malloc'd. */
int fz_file_read(const char *path, size_t max, uint8_t **ret);
int fz_file_write(const char *path, const uint8_t *data, size_t len);

#endif
