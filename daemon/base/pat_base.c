/*
 * pat_base.c — the host-OOM handler behind pat_oom() (pat_base.h): one settable function
 * pointer per copy of daemon/base, so that the daemon reports "patd: ...", libpat (a library
 * inside a frontend's process) "libpat: ...", and a test can check what would be reported
 * without running out of memory.
 *
 * Called only on the way to abort(): no allocation here (the heap just failed us), one
 * fprintf to an unbuffered stderr.
 */
#include "pat_base.h"

#include <errno.h> /* program_invocation_short_name (_GNU_SOURCE) */
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

static void oom_default(size_t bytes)
{
    fprintf(stderr, "<2>%s: host out of memory allocating %zu bytes\n",
            program_invocation_short_name, bytes);
}

static pat_oom_handler_t oom_handler = oom_default;

pat_oom_handler_t pat_set_oom_handler(pat_oom_handler_t h)
{
    return __atomic_exchange_n(&oom_handler, h ? h : oom_default, __ATOMIC_ACQ_REL);
}

void pat_oom(size_t n)
{
    pat_oom_handler_t h = __atomic_load_n(&oom_handler, __ATOMIC_ACQUIRE);
    h(n);
    abort(); /* a handler that returns has nothing better to offer */
}

int pat_memfd_new(const char *name, uint64_t bytes, int seals)
{
    int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return -errno;
    int r = 0;
    if (ftruncate(fd, (off_t)bytes) < 0)
        r = -errno;
    else if ((r = -posix_fallocate(fd, 0, (off_t)bytes)) < 0) /* every page now */
        ;
    else if (fcntl(fd, F_ADD_SEALS, seals) < 0)
        r = -errno;
    if (r < 0) {
        close(fd);
        return r;
    }
    return fd;
}
