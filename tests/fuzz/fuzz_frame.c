/*
 * fuzz_frame.c — libFuzzer target for the frame decoder: every byte string must be either
 * refused with one of the protocol's error codes or accepted with a header and body that
 * really fit in the bytes given, with no crash, no out-of-bounds read (ASan) and no undefined
 * behaviour (UBSan). `make fuzz` runs it for a fixed time in CI.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ipc_proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void expect(int ok)
{
    if (!ok)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* a frame arrives in a buffer of exactly its size (the wire reads header, then body): copy
     * to one, so that ASan sees a read past it */
    uint8_t *buf = malloc(size ? size : 1);
    if (size)
        memcpy(buf, data, size);
    for (int want_reply = 0; want_reply < 2; want_reply++) {
        ipc_hdr_t h;
        int rc = ipc_frame_check(buf, size, want_reply, &h);
        if (rc < 0) {
            expect(ipc_err_name(rc) != NULL);
            continue;
        }
        expect(sizeof(h) + h.body_len == size);
        if (want_reply)
            continue;
        rc = ipc_body_check(h.opcode, buf + sizeof(h), h.body_len);
        expect(rc == 0 || ipc_err_name(rc) != NULL);
        if (rc == 0 && h.opcode == IPC_OP_STEP_BEGIN) {
            ipc_step_begin_req_t r;
            memcpy(&r, buf + sizeof(h), sizeof(r));
            expect(sizeof(r) + 8ull * r.n_seqs + 4ull * r.n_tokens == h.body_len);
        }
    }
    free(buf);
    return 0;
}
