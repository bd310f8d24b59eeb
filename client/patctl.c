/*
 * patctl.c — the operator's command line for a running patd: status, stats (table or JSON),
 * seqs, drain, reload, check, upgrade. Talks to the control socket through libpat's pat_admin(),
 * which says at once when no daemon is there (no socket, or a stale one a crashed patd left).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ipc_proto.h" /* IPC_VERSION, for --version */
#include "pat.h"

enum { EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_STALE };

/* How a failure of pat_admin is told and what patctl exits with: the first row whose code
 * matches (text NULL: pat_strerror's), else the last. */
static const struct {
    int code;
    int exit_status;
    const char *text;
} failures[] = {
    {-ENOENT, EXIT_FAILED, "no daemon"}, /* pat_strerror's also covers sequence ids */
    {-ECONNREFUSED, EXIT_STALE, NULL},
    {0, EXIT_FAILED, NULL},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: patctl [--socket PATH] [--timeout MS] COMMAND\n"
               "       patctl --version | --help\n\n"
               "Commands:\n"
               "  status          daemon state, versions, model, pool occupancy\n"
               "  stats [--json]  counters and gauges (a table, or one JSON object)\n"
               "  seqs            open sequences: session, pid, label, id, length, blocks\n"
               "  drain           refuse new work, finish steps in flight, exit\n"
               "  reload          re-read the config file (as SIGHUP)\n"
               "  check           run the KV pool's invariant check (O(blocks), under the pool\n"
               "                  lock: not for polling)\n"
               "  upgrade         start the binary at patd's path as its successor (as SIGUSR2):\n"
               "                  it initialises its backend and maps the cache while this one\n"
               "                  serves, then this one drains and the successor takes over the\n"
               "                  cache and the sockets. Waits for the takeover (at most 120 s)\n"
               "                  and says the new pid; exit 1 if the successor failed (the old\n"
               "                  daemon serves on; its log says why)\n\n"
               "The socket defaults to $PATD_SOCKET, else the daemon's default path\n"
               "(/run/patd/patd.sock as root). drain, reload, check and upgrade go to the admin\n"
               "socket\n"
               "beside it (<name>.admin), for patd's user, root and daemon.admin_group only.\n"
               "Exit status: 0 ok; 1 the daemon refused or is unreachable (no socket at the\n"
               "path, timed out, not permitted); 2 usage; 3 no daemon, a stale socket left by a\n"
               "crashed patd (starting patd replaces it).\n");
}

/* Prometheus text -> aligned table or JSON object (comments dropped). */
static void print_stats(const char *text, int json)
{
    const char *p = text;
    int first = 1;
    if (json)
        printf("{");
    while (*p) {
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) : strlen(p);
        if (n && p[0] != '#') {
            const char *sp = memchr(p, ' ', n);
            if (sp) {
                int kl = (int)(sp - p), vl = (int)(n - (size_t)(sp - p) - 1);
                if (json) {
                    printf("%s\n  \"", first ? "" : ",");
                    for (int i = 0; i < kl; i++)
                        if (p[i] == '"' || p[i] == '\\')
                            printf("\\%c", p[i]);
                        else
                            putchar(p[i]);
                    printf("\": %.*s", vl, sp + 1);
                } else {
                    printf("%-58.*s %*.*s\n", kl, p, 16, vl, sp + 1);
                }
                first = 0;
            }
        }
        p += n + (nl != NULL);
    }
    if (json)
        printf("\n}\n");
}

/* The value of "key" in a status text, or NULL (points into text). */
static const char *status_value(const char *text, const char *key)
{
    const size_t n = strlen(key);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (!strncmp(p, key, n) && p[n] == ' ')
            return p + n + 1;
    return NULL;
}

/* After `upgrade`: polls status until the successor (pid) answers, or it is gone. */
static int wait_upgrade(const char *sock, int pid)
{
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        char *text = NULL;
        if (pat_admin(sock, PAT_ADMIN_STATUS, 2000, &text) == 0) {
            const char *v = status_value(text, "pid");
            if (v && atoi(v) == pid) {
                const char *a = status_value(text, "persist_adopted");
                printf("upgraded: pid %d serves, %d cached blocks adopted\n", pid, a ? atoi(a) : 0);
                pat_free(text);
                return EXIT_OK;
            }
            /* the old one serves on and no upgrade is under way: the successor failed */
            const int failed = !status_value(text, "upgrade") && v, serving = v ? atoi(v) : 0;
            pat_free(text);
            if (failed) {
                fprintf(stderr, "patctl: the upgrade failed: pid %d serves on (its log says why)\n",
                        serving);
                return EXIT_FAILED;
            }
        } else
            pat_free(text);
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - t0.tv_sec > 125) {
            fprintf(stderr, "patctl: no takeover by pid %d within 125 s\n", pid);
            return EXIT_FAILED;
        }
        usleep(20000);
    }
}

int main(int argc, char **argv)
{
    const char *sock = NULL;
    unsigned timeout = 10000;
    int json = 0;
    const char *cmd = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return EXIT_OK;
        } else if (!strcmp(argv[i], "--version")) {
            printf("patctl %d.%d.%d (wire protocol %u)\n", PAT_VERSION_MAJOR, PAT_VERSION_MINOR,
                   PAT_VERSION_PATCH, (unsigned)IPC_VERSION);
            return EXIT_OK;
        } else if (!strcmp(argv[i], "--socket") && i + 1 < argc) {
            sock = argv[++i];
        } else if (!strcmp(argv[i], "--timeout") && i + 1 < argc) {
            timeout = (unsigned)strtoul(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (!cmd && argv[i][0] != '-') {
            cmd = argv[i];
        } else {
            fprintf(stderr, "patctl: unexpected argument '%s'\n", argv[i]);
            usage(stderr);
            return EXIT_USAGE;
        }
    }
    static const struct {
        const char *name;
        pat_admin_op_t op;
    } cmds[] = {{"status", PAT_ADMIN_STATUS},  {"stats", PAT_ADMIN_STATS},
                {"seqs", PAT_ADMIN_SEQS},      {"drain", PAT_ADMIN_DRAIN},
                {"reload", PAT_ADMIN_RELOAD},  {"check", PAT_ADMIN_CHECK},
                {"upgrade", PAT_ADMIN_UPGRADE}};
    int op = -1;
    for (size_t i = 0; cmd && i < sizeof(cmds) / sizeof(cmds[0]); i++)
        if (!strcmp(cmd, cmds[i].name))
            op = (int)cmds[i].op;
    if (op < 0) {
        if (cmd)
            fprintf(stderr, "patctl: unknown command '%s'\n", cmd);
        usage(stderr);
        return EXIT_USAGE;
    }
    if (json && op != PAT_ADMIN_STATS) {
        fprintf(stderr, "patctl: --json applies to stats only\n");
        return EXIT_USAGE;
    }
    char *text = NULL;
    int rc = pat_admin(sock, (pat_admin_op_t)op, timeout, &text);
    if (rc < 0) {
        size_t f = 0;
        while (failures[f].code && failures[f].code != rc)
            f++;
        fprintf(stderr, "patctl: %s: %s%s%s\n", sock ? sock : pat_default_socket(),
                failures[f].text ? failures[f].text : pat_strerror(rc), text && *text ? ": " : "",
                text ? text : "");
        pat_free(text);
        return failures[f].exit_status;
    }
    if (op == PAT_ADMIN_STATS)
        print_stats(text, json);
    else
        fputs(text, stdout);
    int status = EXIT_OK;
    if (op == PAT_ADMIN_UPGRADE) {
        int pid = 0;
        if (sscanf(text, "upgrading: pid %d", &pid) == 1 && pid > 0)
            status = wait_upgrade(sock, pid);
    }
    pat_free(text);
    return status;
}
