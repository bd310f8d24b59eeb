/*
 * test_ipc.c — the wire codec and the shared staging buffers, without a daemon: every header
 * and body rule of ipc_codec.c against hand-made frames; the error table; sealed memfd buffers
 * (create, map by fd), the sweep of stale named ones; futex signal words between two processes.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "ipc_proto.h"
#include "ipc_shm.h"
#include "pat_base.h"

static size_t build(uint8_t *out, uint32_t op, const void *body, size_t len)
{
    ipc_buf_t b;
    ipc_buf_init(&b);
    ipc_frame_start(&b, op, 0, 9, 1);
    ipc_frame_put(&b, body, len);
    ipc_frame_finish(&b);
    memcpy(out, b.data, b.len);
    size_t n = b.len;
    ipc_buf_done(&b);
    return n;
}

static void test_header_rules(void **state)
{
    uint8_t f[256];
    ipc_hdr_t h;
    size_t n = build(f, IPC_OP_PING, NULL, 0);
    assert_int_equal(n, 40);
    assert_int_equal(ipc_frame_check(f, n, 0, &h), 0);
    assert_int_equal(h.corr, 9);
    assert_int_equal(h.session, 1);
    assert_int_equal(ipc_frame_check(f, n, 1, &h), -EBADMSG); /* not a reply */
    assert_int_equal(ipc_frame_check(f, 39, 0, &h), -EBADMSG);
    assert_int_equal(ipc_frame_check(f, n + 1, 0, &h), -EMSGSIZE);
    ((ipc_hdr_t *)f)->version = 9;
    assert_int_equal(ipc_frame_check(f, n, 0, &h), -EPROTONOSUPPORT);
    n = build(f, 0, NULL, 0);
    assert_int_equal(ipc_frame_check(f, n, 0, &h), -EOPNOTSUPP);
    n = build(f, IPC_OP_MAX, NULL, 0);
    assert_int_equal(ipc_frame_check(f, n, 0, &h), -EOPNOTSUPP);
    /* an error reply may echo any opcode */
    ipc_buf_t b;
    ipc_buf_init(&b);
    ipc_hdr_t req = {.opcode = 99, .corr = 5};
    ipc_frame_error(&b, &req, -EOPNOTSUPP, "opcode %d", 99);
    assert_int_equal(ipc_frame_check(b.data, b.len, 1, &h), 0);
    assert_int_equal(h.corr, 5);
    assert_int_equal(h.body_len, sizeof(ipc_err_body_t));
    ipc_err_body_t e;
    memcpy(&e, b.data + sizeof(h), sizeof(e));
    assert_int_equal(e.code, -EOPNOTSUPP);
    assert_string_equal(e.msg, "opcode 99");
    ipc_buf_done(&b);
}

static void test_body_rules(void **state)
{
    uint32_t open_ok[2 + 3] = {3, 0, 1, 2, 3};
    assert_int_equal(ipc_body_check(IPC_OP_SEQ_OPEN, open_ok, sizeof(open_ok)), 0);
    assert_int_equal(ipc_body_check(IPC_OP_SEQ_OPEN, open_ok, sizeof(open_ok) - 4), -EMSGSIZE);
    assert_int_equal(ipc_body_check(IPC_OP_SEQ_OPEN, open_ok, 4), -EMSGSIZE);
    open_ok[1] = 1;
    assert_int_equal(ipc_body_check(IPC_OP_SEQ_OPEN, open_ok, sizeof(open_ok)), -EBADMSG);
    /* a count whose byte size overflows 32 bits is refused, not wrapped */
    uint32_t huge[2] = {0x40000001u, 0};
    assert_int_equal(ipc_body_check(IPC_OP_SEQ_OPEN, huge, sizeof(huge)), -E2BIG);
    uint8_t step[16 + 16 + 12];
    ipc_step_begin_req_t r = {.n_seqs = 2, .n_tokens = 3};
    ipc_step_seq_t s[2] = {{1, 2}, {2, 1}};
    memcpy(step, &r, 16);
    memcpy(step + 16, s, 16);
    memset(step + 32, 0, 12);
    assert_int_equal(ipc_body_check(IPC_OP_STEP_BEGIN, step, sizeof(step)), 0);
    s[1].n_new = 2; /* sum 4 != 3 */
    memcpy(step + 16, s, 16);
    assert_int_equal(ipc_body_check(IPC_OP_STEP_BEGIN, step, sizeof(step)), -EINVAL);
    r.n_seqs = 0xffffffffu;
    memcpy(step, &r, 16);
    assert_int_equal(ipc_body_check(IPC_OP_STEP_BEGIN, step, sizeof(step)), -E2BIG);
    ipc_hello_req_t h = {.max_batch_tokens = 16};
    h.label[0] = 'a';
    assert_int_equal(ipc_body_check(IPC_OP_HELLO, &h, sizeof(h)), 0);
    h.max_batch_tokens = 0;
    assert_int_equal(ipc_body_check(IPC_OP_HELLO, &h, sizeof(h)), -E2BIG);
    assert_int_equal(ipc_body_check(IPC_OP_PING, &h, 1), -EMSGSIZE);
    assert_int_equal(ipc_body_check(77, NULL, 0), -EOPNOTSUPP);
}

static void test_tables(void **state)
{
    assert_string_equal(ipc_op_name(IPC_OP_STEP_BEGIN), "STEP_BEGIN");
    assert_string_equal(ipc_op_name(1000), "?");
    assert_int_equal(ipc_op_is_admin(IPC_OP_STATS), 1);
    assert_int_equal(ipc_op_is_admin(IPC_OP_SEQ_OPEN), 0);
    assert_int_equal(ipc_op_is_admin(15), -1);
    assert_string_equal(ipc_err_name(-EMEDIUMTYPE), "MODEL");
    assert_null(ipc_err_name(-EXFULL));
    assert_non_null(ipc_err_text(-ENOSPC));
}

static void test_shm_and_signals(void **state)
{
    ipc_layout_t l;
    assert_int_equal(ipc_layout_compute(100, 8, 2, 64, 2, &l), 0);
    assert_int_equal(l.q_off % IPC_ALIGN, 0);
    assert_true(l.k_off >= l.q_off + 100 * l.q_row);
    assert_true(l.bytes >= l.o_off + 100 * l.q_row);
    assert_int_equal(ipc_layout_compute(0, 8, 2, 64, 2, &l), -E2BIG);
    ipc_shm_t a, b;
    assert_int_equal(ipc_shm_create_memfd(&a, l.bytes, 4), 0);
    const int fd = ipc_shm_fd(&a);
    assert_true(fd >= 0);
    assert_int_equal(ipc_shm_map_fd(&b, fd, l.bytes + 4096), -EBADMSG); /* wrong size */
    assert_int_equal(ftruncate(fd, (off_t)l.bytes / 2), -1);            /* sealed */
    assert_int_equal(errno, EPERM);
    assert_int_equal(ipc_shm_map_fd(&b, fd, l.bytes), 0);
    assert_int_equal(ipc_shm_sig(&b)->n_layers, 4);
    ipc_sig_t *g = ipc_shm_sig(&a);
    /* a child waits for ready == 3 and answers done = 3 */
    pid_t pid = fork();
    if (pid == 0) {
        ipc_sig_t *cg = ipc_shm_sig(&b);
        for (int i = 0; i < 200; i++) {
            uint32_t v = atomic_load(&cg->ready);
            if (v == 3) {
                ipc_sig_post(&cg->done, 3);
                _exit(0);
            }
            ipc_sig_wait(&cg->ready, v, 50000000ull);
        }
        _exit(1);
    }
    ipc_sig_post(&g->ready, 1);
    ipc_sig_post(&g->ready, 3);
    uint64_t t0 = pat_now_ns();
    while (atomic_load(&g->done) != 3 && pat_now_ns() - t0 < 5000000000ull)
        ipc_sig_wait(&g->done, atomic_load(&g->done), 50000000ull);
    assert_int_equal(atomic_load(&g->done), 3);
    int st;
    waitpid(pid, &st, 0);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_int_equal(ipc_sig_wait(&g->done, 3, 1000000ull), -ETIMEDOUT);
    ipc_shm_close(&b);
    ipc_shm_close(&a);
    /* the sweep removes the named buffers a crashed daemon of an older version left */
    char name[64];
    snprintf(name, sizeof(name), "/patd.unittest.%d", (int)getpid());
    int nfd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    assert_true(nfd >= 0);
    close(nfd);
    assert_int_equal(ipc_shm_sweep(name), 1);
    assert_int_equal(shm_open(name, O_RDWR, 0), -1);
    assert_int_equal(errno, ENOENT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_header_rules),
        cmocka_unit_test(test_body_rules),
        cmocka_unit_test(test_tables),
        cmocka_unit_test(test_shm_and_signals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
