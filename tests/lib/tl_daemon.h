/*
 * tl_daemon.h — integration tests start real patd processes: a private runtime directory, the
 * built binary (PATD_BIN, default build/bin/patd), extra --key=value options, stderr to a log
 * file in that directory; start waits until the daemon answers STATUS.
 */
#ifndef TL_DAEMON_H
#define TL_DAEMON_H

#include <stdint.h>
#include <sys/types.h>

#include "pat_fdstore.h"

typedef struct tl_daemon {
    pid_t pid;
    char dir[128];
    char sock[192];
    char log[192];
    /* tl_daemon_start_managed: the test plays systemd's side for the daemon (its notify socket,
     * its descriptor store, given back at each restart as LISTEN_FDS) */
    int managed;
    int notify_fd;
    char notify_path[200];
    pat_fdstore_t store;
} tl_daemon_t;

/* A fresh directory for a daemon, and its socket's and log's paths in it (no daemon yet: the
 * caller starts one its own way). 0 or -1. */
int tl_daemon_dir(tl_daemon_t *d);
/* Starts patd with the NULL-terminated extra arguments. 0 or -1 (and prints why). */
int tl_daemon_start(tl_daemon_t *d, const char *const *args);
/* tl_daemon_start, with patd placed in the cgroup whose cgroup.procs file is procs (before exec,
 * so everything it allocates is charged there). */
int tl_daemon_start_in(tl_daemon_t *d, const char *const *args, const char *procs);
/* tl_daemon_start, with the test as the service manager as systemd does it: $NOTIFY_SOCKET names
 * a datagram socket of the test, descriptors sent with FDSTORE=1 (FDNAME=) are kept by name
 * (FDSTOREREMOVE=1 drops them; one already kept by inode is not kept twice), and every restart
 * passes them back from descriptor 3 on with LISTEN_PID, LISTEN_FDS and LISTEN_FDNAMES. */
int tl_daemon_start_managed(tl_daemon_t *d, const char *const *args);
/* Reads every message the daemon sent to the notify socket since the last call (managed), and
 * follows MAINPID= (an upgrade's successor becomes d->pid; a test that upgrades makes itself
 * the subreaper, so that the successor is its child once the old daemon exits); returns how
 * many. */
int tl_daemon_collect(tl_daemon_t *d);
/* Starts again in the same directory (a restart). */
int tl_daemon_restart(tl_daemon_t *d, const char *const *args);
/* Sends sig and waits up to timeout_ms; returns the exit status, or -1 if it did not exit. */
int tl_daemon_signal_wait(tl_daemon_t *d, int sig, uint32_t timeout_ms);
/* Kills it if still running and removes the directory. */
void tl_daemon_stop(tl_daemon_t *d);
/* The integer value of a STATUS line ("key value"), or -1. */
int64_t tl_daemon_status(tl_daemon_t *d, const char *key);
/* The value of a metric line of STATS (exact name incl. labels), or -1. */
int64_t tl_daemon_metric(tl_daemon_t *d, const char *name);

#endif
