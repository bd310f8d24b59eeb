/*
 * pat_gpu.h — libpat's side of a GPU session (pat_gpu.c): the CUDA driver reached through
 * dlopen("libcuda.so.1"), so libpat loads and serves cpu sessions on machines without CUDA.
 * Internal to libpat (prefix pat__gpu).
 */
#ifndef PAT_GPU_H
#define PAT_GPU_H

#include <stddef.h>
#include <stdint.h>

typedef struct pat_gpu pat_gpu_t;

/* Opens the daemon's GPU (by UUID) in its primary context, maps the session's staging allocation
 * (staging_fd, a CUDA virtual-memory descriptor of map_bytes) and its signal slice (sig_fd, the
 * same for host memory of sig_bytes, mapped for the device and this process's CPU at one
 * address: pat__gpu_sig); the caller keeps and closes the fds. Returns 0 and *ret, or -ENOSYS
 * (no libcuda), -ENODEV (no device with that UUID), -ENOTSUP (no 64-bit stream memory
 * operations), -EIO (a CUDA call failed, a descriptor was no allocation or a smaller one; why
 * says which). */
int pat__gpu_open(const uint8_t uuid[16], int staging_fd, uint64_t map_bytes, int sig_fd,
                  uint64_t sig_bytes, pat_gpu_t **ret, char *why, size_t why_len);
void pat__gpu_close(pat_gpu_t *g); /* NULL ok */

/* Device address of the session's staging range. */
uint8_t *pat__gpu_staging(const pat_gpu_t *g);
/* The signal slice: the CPU and the device reach it at this address. */
void *pat__gpu_sig(const pat_gpu_t *g);

/* Enqueues on `stream` (CUstream; NULL = the legacy default stream): write *ready = v; wait
 * *done >= v; and when `last` (a step's last layer) write *done = 0 (ready/done are addresses in
 * the signal slice; the daemon resets the others, ipc_shm.h). 0 or -EIO. */
int pat__gpu_handoff(pat_gpu_t *g, void *stream, uint64_t *ready, uint64_t *done, uint64_t v,
                     int last);
/* 1 when the stream is being captured into a graph, 0 when not, -EIO. */
int pat__gpu_capturing(pat_gpu_t *g, void *stream);
/* Waits for the stream. 0 or -EIO. */
int pat__gpu_sync(pat_gpu_t *g, void *stream);
/* The driver's text for the last failed call. */
const char *pat__gpu_error(const pat_gpu_t *g);

#endif
