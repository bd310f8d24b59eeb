/*
 * bench_handoff — the cross-process per-layer hand-off, measured on the GPU (target: <= 10 us
 * median per layer round trip under MPS; README.md, "Numbers").
 *
 *   floor   two processes, no patd: A writes ready = i and waits done >= i on its stream; B waits
 *           ready >= i and writes done = i on its own. Twice: words in host memory mapped into
 *           the device (what patd uses), and words in device memory shared by CUDA IPC. The
 *           interval between events around A's write and wait is the bare GPU-side round trip.
 *   patd    a real patd (cuda backend, 64 layers, one tiny KV head set) and a libpat client:
 *           events around each pat_attend_async. Two flavours: "handshake" (a step the daemon
 *           refused: every layer's handshake runs without compute, the pure hand-off cost) and
 *           "attend" (one decode token: append + attention + merge of the smallest plan). Each
 *           flavour twice: paced by the client's CPU (each pat_attend_async enqueued while the GPU
 *           runs the one before, so its CPU cost can show), and enqueued ahead (the stream held
 *           behind a gate word until all 64 layers are enqueued, as a frontend running ahead of
 *           its GPU or replaying a graph does): the GPU-side round trip alone.
 *
 * Prints median and p99 per round trip for each, with --label (e.g. MPS / no-MPS) and
 * --json FILE (one line per measurement, appended).
 *
 *   bench_handoff --patd build/bin/patd [--iters N] [--label L] [--json F] [--patd-opt OPT]
 * (--patd-opt: one more option for the daemon, e.g. --dependent-launch=0)
 *   bench_handoff --child SHM_NAME N DEV (internal: side B of the floor; DEV 1: device words)
 */
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include "kern_cuda_tool.h"
#include "pat.h"

#define NEED(cond, what)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: %s (%s)\n", __FILE__, __LINE__, what, strerror(errno));        \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

typedef CUresult (*WaitFn)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);
typedef CUresult (*WriteFn)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);
static WaitFn wait64;
static WriteFn write64;

static void load_memops(void)
{
    void *w = nullptr, *x = nullptr;
    cudaDriverEntryPointQueryResult q;
    CK(cudaGetDriverEntryPointByVersion("cuStreamWaitValue64", &w, 12000, cudaEnableDefault, &q));
    CK(cudaGetDriverEntryPointByVersion("cuStreamWriteValue64", &x, 12000, cudaEnableDefault, &q));
    wait64 = (WaitFn)w;
    write64 = (WriteFn)x;
}

#define CU(call)                                                                                   \
    do {                                                                                           \
        CUresult r_ = (call);                                                                      \
        if (r_ != CUDA_SUCCESS) {                                                                  \
            fprintf(stderr, "%s:%d: %s -> CUresult %d\n", __FILE__, __LINE__, #call, (int)r_);     \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

struct Words {
    uint64_t *host;
    CUdeviceptr ready, done;
};

static Words map_words(const char *name, int create)
{
    int fd = shm_open(name, O_RDWR | (create ? O_CREAT | O_EXCL : 0), 0600);
    NEED(fd >= 0, "shm_open");
    NEED(!create || ftruncate(fd, 8192) == 0, "ftruncate");
    void *p = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    NEED(p != MAP_FAILED, "mmap");
    close(fd);
    CK(cudaHostRegister(p, 8192, cudaHostRegisterMapped | cudaHostRegisterPortable));
    void *d = nullptr;
    CK(cudaHostGetDevicePointer(&d, p, 0));
    Words w = {(uint64_t *)p, (CUdeviceptr)d, (CUdeviceptr)d + 4096};
    return w;
}

/* Device-memory words: the first process allocates them and leaves the IPC handle in the shm
 * page (past the host words), the second opens it. */
enum { HANDLE_OFF = 6144 };

static Words device_words(Words host, int create)
{
    void *d = nullptr;
    cudaIpcMemHandle_t h;
    if (create) {
        CK(cudaMalloc(&d, 8192));
        CK(cudaMemset(d, 0, 8192));
        CK(cudaDeviceSynchronize());
        CK(cudaIpcGetMemHandle(&h, d));
        memcpy((char *)host.host + HANDLE_OFF, &h, sizeof(h));
    } else {
        memcpy(&h, (char *)host.host + HANDLE_OFF, sizeof(h));
        CK(cudaIpcOpenMemHandle(&d, h, cudaIpcMemLazyEnablePeerAccess));
    }
    Words w = {host.host, (CUdeviceptr)d, (CUdeviceptr)d + 4096};
    return w;
}

static int child_main(const char *name, int n, int dev)
{
    CK(cudaFree(0));
    load_memops();
    Words w = map_words(name, 0);
    if (dev)
        w = device_words(w, 0);
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (int i = 1; i <= n; i++) {
        CU(wait64((CUstream)s, w.ready, i, CU_STREAM_WAIT_VALUE_GEQ));
        CU(write64((CUstream)s, w.done, i, CU_STREAM_WRITE_VALUE_DEFAULT));
        if (i % 32 == 0)
            CK(cudaStreamSynchronize(s)); /* bounded enqueue depth */
    }
    CK(cudaStreamSynchronize(s));
    return 0;
}

struct Stat {
    double med, p99;
};

static Stat stats(std::vector<float> &v)
{
    std::sort(v.begin(), v.end());
    Stat s = {v[v.size() / 2] * 1e3, v[(size_t)(v.size() * 0.99)] * 1e3};
    return s;
}

static void report(FILE *js, const char *label, const char *what, std::vector<float> &v)
{
    Stat s = stats(v);
    printf("%-10s %-34s median %7.2f us   p99 %7.2f us   (%zu round trips)\n", label, what, s.med,
           s.p99, v.size());
    if (js)
        fprintf(js,
                "{\"label\":\"%s\",\"what\":\"%s\",\"median_us\":%.3f,\"p99_us\":%.3f,"
                "\"n\":%zu}\n",
                label, what, s.med, s.p99, v.size());
}

static std::vector<float> floor_run(const char *self, int n, int dev)
{
    char name[64];
    snprintf(name, sizeof(name), "/patd-bench-handoff-%d-%d", (int)getpid(), dev);
    shm_unlink(name);
    Words w = map_words(name, 1);
    memset(w.host, 0, 8192);
    if (dev)
        w = device_words(w, 1);
    char nbuf[16];
    snprintf(nbuf, sizeof(nbuf), "%d", n);
    pid_t pid = fork();
    NEED(pid >= 0, "fork");
    if (pid == 0) {
        execl(self, self, "--child", name, nbuf, dev ? "1" : "0", (char *)NULL);
        _exit(127);
    }
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    std::vector<cudaEvent_t> ev(2 * 32);
    for (auto &e : ev)
        CK(cudaEventCreate(&e));
    std::vector<float> t;
    for (int i = 1; i <= n;) {
        int k = 0;
        for (; k < 32 && i <= n; k++, i++) {
            CK(cudaEventRecord(ev[2 * k], s));
            CU(write64((CUstream)s, w.ready, i, CU_STREAM_WRITE_VALUE_DEFAULT));
            CU(wait64((CUstream)s, w.done, i, CU_STREAM_WAIT_VALUE_GEQ));
            CK(cudaEventRecord(ev[2 * k + 1], s));
        }
        CK(cudaStreamSynchronize(s));
        for (int j = 0; j < k; j++) {
            float ms;
            CK(cudaEventElapsedTime(&ms, ev[2 * j], ev[2 * j + 1]));
            t.push_back(ms);
        }
    }
    int st = 0;
    waitpid(pid, &st, 0);
    NEED(WIFEXITED(st) && WEXITSTATUS(st) == 0, "floor child failed");
    if (dev)
        CK(cudaFree((void *)w.ready));
    CK(cudaHostUnregister(w.host));
    munmap(w.host, 8192);
    shm_unlink(name);
    t.erase(t.begin(), t.begin() + std::min<size_t>(t.size() / 10, 64)); /* warm-up */
    return t;
}

static const char *g_patd_opt = NULL; /* --patd-opt: one more daemon option */

static pid_t start_patd(const char *bin, const char *dir, char *sock, size_t sock_len)
{
    snprintf(sock, sock_len, "%s/h.sock", dir);
    pid_t pid = fork();
    NEED(pid >= 0, "fork");
    if (pid == 0) {
        char rd[300];
        snprintf(rd, sizeof(rd), "--runtime-dir=%s", dir);
        const char *args[] = {bin,
                              "--backend=cuda",
                              rd,
                              "--name=h",
                              "--metrics-port=0",
                              "--layers=64",
                              "--q-heads=8",
                              "--kv-heads=8",
                              "--head-dim=64",
                              "--dtype=f16",
                              "--blocks=1024",
                              "--staging-mb=64",
                              "--conn-max-batch-tokens=256",
                              "--log-level=notice",
                              g_patd_opt, /* NULL ends the list where not given */
                              NULL};
        execv(bin, (char *const *)args);
        _exit(127);
    }
    for (int i = 0; i < 600; i++) {
        char *txt = NULL;
        if (access(sock, F_OK) == 0 && pat_admin(sock, PAT_ADMIN_STATUS, 1000, &txt) == 0) {
            pat_free(txt);
            return pid;
        }
        pat_free(txt);
        int st;
        NEED(waitpid(pid, &st, WNOHANG) == 0, "patd exited during start-up");
        usleep(100000);
    }
    NEED(0, "patd did not come up");
    return -1;
}

static void patd_run(const char *bin, int steps, FILE *js, const char *label)
{
    char dir[] = "/tmp/patd-handoff-XXXXXX", sock[400];
    NEED(mkdtemp(dir), "mkdtemp");
    pid_t pid = start_patd(bin, dir, sock, sizeof(sock));
    pat_connect_opts_t o = {};
    o.size = sizeof(o);
    o.max_batch_tokens = 256;
    o.socket = sock;
    o.model = (pat_model_t){64, 8, 8, 64, PAT_F16, 16, 0};
    pat_conn_t *c = NULL;
    char why[300];
    int rc = pat_connect(&o, &c, why, sizeof(why));
    if (rc < 0) {
        fprintf(stderr, "pat_connect: %s\n", why);
        exit(1);
    }
    pat_buffers_t b;
    pat_buffers(c, &b);
    NEED(b.on_gpu, "the daemon must serve GPU sessions");
    CK(cudaMemset(b.q, 0, b.q_row_bytes));
    CK(cudaMemset(b.k, 0, b.kv_row_bytes));
    CK(cudaMemset(b.v, 0, b.kv_row_bytes));
    CK(cudaDeviceSynchronize()); /* before any stream of the client or the daemon reads them */
    uint32_t prompt[16], seq, cached;
    for (int i = 0; i < 16; i++)
        prompt[i] = 100 + i;
    NEED(pat_seq_open(c, prompt, 16, &seq, &cached) == 0, "seq_open");
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    std::vector<cudaEvent_t> ev(2 * 64);
    for (auto &e : ev)
        CK(cudaEventCreate(&e));
    uint64_t *gate = nullptr, gate_v = 0;
    void *gate_dev = nullptr;
    CK(cudaHostAlloc(&gate, 64, cudaHostAllocMapped));
    CK(cudaHostGetDevicePointer(&gate_dev, gate, 0));
    *gate = 0;
    for (int flavour = 0; flavour < 4; flavour++) {
        const int refused = flavour % 2 == 0, ahead = flavour >= 2;
        std::vector<float> t;
        for (int step = 0; step < steps; step++) {
            uint32_t n1 = 1, tok = 7, bad = 999999; /* an unknown sequence: a refused step */
            NEED(pat_step_begin(c, refused ? &bad : &seq, &n1, 1, &tok) == 0, "step_begin");
            std::thread opener;
            if (ahead) {
                /* the gate opens when every layer is enqueued, or after 20 ms in case enqueueing
                 * blocked behind the closed gate (the launch queue is finite) */
                CU(wait64((CUstream)s, (CUdeviceptr)gate_dev, ++gate_v, CU_STREAM_WAIT_VALUE_GEQ));
                opener = std::thread([gate, gate_v] {
                    for (int i = 0; i < 2000 && __atomic_load_n(gate, __ATOMIC_ACQUIRE) < gate_v;
                         i++)
                        usleep(10);
                    __atomic_store_n(gate, gate_v, __ATOMIC_RELEASE);
                });
            }
            for (uint32_t l = 0; l < 64; l++) {
                CK(cudaEventRecord(ev[2 * l], s));
                NEED(pat_attend_async(c, l, s) == 0, "attend_async");
                CK(cudaEventRecord(ev[2 * l + 1], s));
            }
            if (ahead) {
                __atomic_store_n(gate, gate_v, __ATOMIC_RELEASE);
                opener.join();
            }
            pat_step_info_t info;
            rc = pat_step_end(c, 1, &info); /* abort: the sequence stays 16 tokens */
            NEED(refused ? rc == -ENOENT : rc == 0, "step_end");
            CK(cudaStreamSynchronize(s));
            if (step < 3)
                continue; /* warm-up */
            for (int l = 0; l < 64; l++) {
                float ms;
                CK(cudaEventElapsedTime(&ms, ev[2 * l], ev[2 * l + 1]));
                t.push_back(ms);
            }
        }
        static const char *what[4] = {
            "patd handshake (refused step)", "patd 1-token attend per layer",
            "patd handshake, enqueued ahead", "patd 1-token attend, enqueued ahead"};
        report(js, label, what[flavour], t);
    }
    CK(cudaFreeHost(gate));
    pat_close(c);
    kill(pid, SIGTERM);
    int st;
    waitpid(pid, &st, 0);
    rmdir(dir);
}

int main(int argc, char **argv)
{
    if (argc == 5 && !strcmp(argv[1], "--child"))
        return child_main(argv[2], atoi(argv[3]), atoi(argv[4]));
    const char *bin = NULL, *label = "", *json = NULL;
    int iters = 2000;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--patd") && i + 1 < argc)
            bin = argv[++i];
        else if (!strcmp(argv[i], "--label") && i + 1 < argc)
            label = argv[++i];
        else if (!strcmp(argv[i], "--json") && i + 1 < argc)
            json = argv[++i];
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc)
            iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--patd-opt") && i + 1 < argc)
            g_patd_opt = argv[++i];
        else {
            fprintf(stderr,
                    "usage: %s --patd PATH [--iters N] [--label L] [--json FILE] "
                    "[--patd-opt OPT]\n",
                    argv[0]);
            return 2;
        }
    }
    NEED(bin && iters >= 100, "--patd and --iters >= 100 needed");
    CK(cudaFree(0));
    load_memops();
    int mps = 0, dev = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&mps, cudaDevAttrMpsEnabled, dev));
    printf("device MPS client: %s\n", mps ? "yes" : "no");
    FILE *js = json ? fopen(json, "a") : NULL;
    std::vector<float> f = floor_run("/proc/self/exe", iters, 0);
    report(js, label, "floor: bare GPU ping-pong", f);
    f = floor_run("/proc/self/exe", iters, 1);
    report(js, label, "floor: ping-pong, device words", f);
    patd_run(bin, mps ? iters / 64 + 3 : 8, js, label);
    if (js)
        fclose(js);
    return 0;
}
