/*
 * pat_fdstore.c — systemd's side of the descriptor store (pat_fdstore.h).
 */
#include "pat_fdstore.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

static void drop(pat_fdstore_t *s, const char *name)
{
    for (int i = 0; i < s->n;)
        if (!strcmp(s->name[i], name)) {
            close(s->fd[i]);
            s->n--;
            s->fd[i] = s->fd[s->n];
            memcpy(s->name[i], s->name[s->n], sizeof(s->name[i]));
        } else
            i++;
}

static void keep(pat_fdstore_t *s, const char *name, int fd)
{
    struct stat a, b;
    for (int i = 0; i < s->n; i++)
        if (fstat(fd, &a) == 0 && fstat(s->fd[i], &b) == 0 && a.st_dev == b.st_dev &&
            a.st_ino == b.st_ino) {
            close(fd); /* one descriptor of a file is kept once */
            return;
        }
    if (s->n == PAT_FDSTORE_MAX) {
        close(fd);
        return;
    }
    s->fd[s->n] = fd;
    snprintf(s->name[s->n], sizeof(s->name[0]), "%s", name);
    s->n++;
}

int pat_fdstore_recv(pat_fdstore_t *s, int sock)
{
    char buf[1024];
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(PAT_FDSTORE_MAX * sizeof(int))];
    } ctl;
    struct iovec iov = {.iov_base = buf, .iov_len = sizeof(buf) - 1};
    struct msghdr m = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof(ctl.b)};
    ssize_t k = recvmsg(sock, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (k < 0)
        return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -errno;
    buf[k] = 0;
    int fds[PAT_FDSTORE_MAX], nfd = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
            nfd = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            if (nfd > PAT_FDSTORE_MAX)
                nfd = PAT_FDSTORE_MAX;
            memcpy(fds, CMSG_DATA(c), (size_t)nfd * sizeof(int));
        }
    char name[64] = "unknown";
    const char *fn = strstr(buf, "FDNAME=");
    if (fn)
        snprintf(name, sizeof(name), "%.*s", (int)strcspn(fn + 7, "\n"), fn + 7);
    if (strstr(buf, "READY=1"))
        s->ready = 1;
    const char *mp = strstr(buf, "MAINPID=");
    if (mp && (mp == buf || mp[-1] == '\n'))
        s->mainpid = atoi(mp + 8);
    if (strstr(buf, "FDSTOREREMOVE=1"))
        drop(s, name);
    const int store = strstr(buf, "FDSTORE=1") != NULL;
    for (int i = 0; i < nfd; i++) {
        if (store)
            keep(s, name, fds[i]);
        else
            close(fds[i]);
    }
    return 1;
}

int pat_fdstore_give(const pat_fdstore_t *s)
{
    if (s->n == 0)
        return 0;
    int high[PAT_FDSTORE_MAX];
    char names[PAT_FDSTORE_MAX * 65] = "";
    for (int i = 0; i < s->n; i++) /* out of the way of 3.. first */
        if ((high[i] = fcntl(s->fd[i], F_DUPFD, 100)) < 0)
            return -1;
    for (int i = 0; i < s->n; i++) {
        if (dup2(high[i], 3 + i) != 3 + i)
            return -1;
        close(high[i]);
        if (i)
            strcat(names, ":");
        strcat(names, s->name[i]);
    }
    char pid[24], n[8];
    snprintf(pid, sizeof(pid), "%d", (int)getpid());
    snprintf(n, sizeof(n), "%d", s->n);
    setenv("LISTEN_PID", pid, 1);
    setenv("LISTEN_FDS", n, 1);
    setenv("LISTEN_FDNAMES", names, 1);
    return 0;
}

void pat_fdstore_clear(pat_fdstore_t *s)
{
    for (int i = 0; i < s->n; i++)
        close(s->fd[i]);
    s->n = 0;
}
