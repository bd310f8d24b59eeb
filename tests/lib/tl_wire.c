/*
 * tl_wire.c — raw frames on patd's Unix stream sockets (tl_wire.h).
 */
#include "tl_wire.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "ipc_proto.h"

int tl_wire_open(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(sa.sun_path))
        return -ENAMETOOLONG;
    memcpy(sa.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    struct timeval t = {3, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &t, sizeof(t));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &t, sizeof(t));
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        int rc = -errno;
        close(fd);
        return rc;
    }
    return fd;
}

int tl_wire_send(int fd, const void *buf, size_t len)
{
    for (size_t sent = 0; sent < len;) {
        ssize_t k = send(fd, (const uint8_t *)buf + sent, len - sent, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return -errno;
        sent += (size_t)k;
    }
    return 0;
}

/* n bytes: 1, 0 at the peer's end, or a negative errno */
static int read_n(int fd, void *buf, size_t n)
{
    for (size_t got = 0; got < n;) {
        ssize_t k = recv(fd, (uint8_t *)buf + got, n - got, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return errno == EWOULDBLOCK ? -EAGAIN : -errno;
        if (k == 0)
            return 0;
        got += (size_t)k;
    }
    return 1;
}

int tl_wire_recv(int fd, void **ret)
{
    ipc_hdr_t h;
    int rc = read_n(fd, &h, sizeof(h));
    if (rc <= 0)
        return rc == -ECONNRESET ? 0 : rc;
    if (h.body_len > (1u << 26))
        return -EMSGSIZE;
    uint8_t *m = malloc(sizeof(h) + h.body_len);
    if (!m)
        return -ENOMEM;
    memcpy(m, &h, sizeof(h));
    rc = read_n(fd, m + sizeof(h), h.body_len);
    if (rc <= 0) {
        free(m);
        return rc == -ECONNRESET ? 0 : rc;
    }
    *ret = m;
    return (int)(sizeof(h) + h.body_len);
}
