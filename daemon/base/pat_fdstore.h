/*
 * pat_fdstore.h — the service manager's side of the descriptor store, as systemd keeps it for a
 * Type=notify service with FileDescriptorStoreMax=: what a process sends to $NOTIFY_SOCKET with
 * FDSTORE=1 (FDNAME=name, the descriptors by SCM_RIGHTS) is kept by name (one descriptor of a
 * file is kept once), FDSTOREREMOVE=1 drops a name, and the next start of the service gets them
 * back from descriptor 3 on with LISTEN_PID, LISTEN_FDS and LISTEN_FDNAMES. MAINPID=N is
 * noted (patd's upgrade hands the service to its successor so). Used by patd-keep
 * (patd's keeper where no systemd runs) and by the tests that play systemd's side; linked into
 * those alone (not libpatbase.a: neither patd nor libpat needs it).
 */
#ifndef PAT_FDSTORE_H
#define PAT_FDSTORE_H

#define PAT_FDSTORE_MAX 8

typedef struct pat_fdstore {
    int fd[PAT_FDSTORE_MAX];
    char name[PAT_FDSTORE_MAX][64];
    int n;
    int ready;   /* READY=1 seen since the last pat_fdstore_reset_ready */
    int mainpid; /* the last MAINPID= (an upgrade names its successor so); 0: none */
} pat_fdstore_t;

/* Receives one message from the notify socket sock (never blocks) and applies it. Returns 1 when
 * a message was read, 0 when none was waiting, -errno. */
int pat_fdstore_recv(pat_fdstore_t *s, int sock);
/* In the child, before exec: the kept descriptors at 3.., and the LISTEN_* variables naming them
 * for this process (none set when nothing is kept). 0 or -1. */
int pat_fdstore_give(const pat_fdstore_t *s);
/* Closes every kept descriptor. */
void pat_fdstore_clear(pat_fdstore_t *s);

#endif
