/*
 * tl_wire.h — raw frames on patd's control and event sockets (Unix streams, ipc_proto.h), for the
 * tests that send what libpat never would.
 */
#ifndef TL_WIRE_H
#define TL_WIRE_H

#include <stddef.h>

/* A stream connected to the Unix socket at path, with 3-second send and receive timeouts: the
 * fd, or a negative errno. */
int tl_wire_open(const char *path);
/* Writes all len bytes: 0 or a negative errno. */
int tl_wire_send(int fd, const void *buf, size_t len);
/* Reads one frame (header and body) into *ret (malloc'd): its length, 0 when the peer closed
 * the connection before a whole frame, or a negative errno (-EAGAIN: the timeout passed). */
int tl_wire_recv(int fd, void **ret);

#endif
