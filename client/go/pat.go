// Package pat is the Go binding of libpat, the client library of patd (cgo over
// client/pat.h and libpat.so.1).
//
// A frontend connects once with its model signature and batch size, opens sequences with
// their prompts, and runs steps: Begin names the sequences and their new tokens, and for
// every layer the frontend writes Q, K and V of the new tokens into the staging buffers
// (Put) and calls Attend, which returns once O of that layer is in the O buffer (Get).
// End commits the step's KV; a step that failed, or was closed without End, is aborted (see
// Step for an abort that gets no answer). Close every Conn: it has no finalizer (Raw's slices
// point into the memory its Close unmaps).
//
//	c, err := pat.Connect(pat.Options{Model: model, MaxBatchTokens: 512})
//	seq, err := c.OpenSeq(prompt)
//	step, err := c.Begin(pat.Feed{Seq: seq, Tokens: prompt[seq.Cached:]})
//	defer step.Close()
//	for layer := uint32(0); layer < model.Layers; layer++ {
//		c.Put(pat.Q, row, q) // ... K, V: one call per token row
//		err = step.Attend(layer)
//		c.Get(pat.O, row, o)
//	}
//	info, err := step.End()
//
// Every failure is an *Error carrying the errno: errors.Is(err, syscall.ENOENT) tests it.
//
// Threads: libpat lets one thread at a time use a connection. A Conn holds a mutex around
// every call into libpat and around the staging buffers, so its methods may be called from
// several goroutines; a step, though, is the session's one at a time (Begin fails with
// EBUSY while another is open), and its rows belong to the goroutine that runs it.
// Different Conns are independent.
//
// Host sessions only: a daemon on the cuda backend hands out device memory as staging
// (Info().OnGPU), which Put and Get cannot reach (ENOTSUP).
package pat

/*
#cgo CFLAGS: -I${SRCDIR}/../../client -std=c11
#cgo LDFLAGS: -L${SRCDIR}/../../build/lib -Wl,-rpath,${SRCDIR}/../../build/lib -lpat
#include <stdlib.h>
#include <string.h>
#include "pat.h"

// a copy (malloc'd, NULL when out of memory) made on the calling thread: the texts below may
// live in a thread's own buffer, and a goroutine can move threads between cgo calls
static char *go_dup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p)
        memcpy(p, s, n);
    return p;
}

// pat_default_socket's buffer is per thread
static char *go_default_socket(void) { return go_dup(pat_default_socket()); }

// pat_strerror of a code it does not name is glibc's strerror, which writes the text of an
// unknown errno into a per-thread buffer
static char *go_strerror(int rc) { return go_dup(pat_strerror(rc)); }
*/
import "C"

import (
	"fmt"
	"syscall"
	"unsafe"
)

// The libpat release this binding was compiled against: client/pat.h's PAT_VERSION_*.
const (
	VersionMajor = C.PAT_VERSION_MAJOR
	VersionMinor = C.PAT_VERSION_MINOR
	VersionPatch = C.PAT_VERSION_PATCH
	Version      = C.PAT_VERSION // (major << 16) | (minor << 8) | patch
)

// Element types of Q, K, V and O (pat.h's PAT_F16 ...), and the KV pool's fp8 types.
const (
	F16     = C.PAT_F16
	BF16    = C.PAT_BF16
	F32     = C.PAT_F32
	FP8E4M3 = C.PAT_FP8_E4M3
	FP8E5M2 = C.PAT_FP8_E5M2
)

// Error is a failed libpat call (or an argument the binding refused before calling).
type Error struct {
	Op    string        // the call: "connect", "seq_open", "attend", ...
	Errno syscall.Errno // the positive errno libpat returned
	Msg   string        // libpat's meaning of the code, then the daemon's detail if any
}

func (e *Error) Error() string { return "pat " + e.Op + ": " + e.Msg }

// Unwrap gives the errno, so errors.Is(err, syscall.ENOENT) and errors.As work.
func (e *Error) Unwrap() error { return e.Errno }

// newError builds the Error of rc (a negative errno) with the daemon's detail.
func newError(op string, rc C.int, detail string) *Error {
	p := C.go_strerror(rc)
	defer C.free(unsafe.Pointer(p))
	msg := C.GoString(p) // "" when out of memory
	if detail != "" {
		msg += ": " + detail
	}
	return &Error{Op: op, Errno: syscall.Errno(-rc), Msg: msg}
}

// argError is an argument refused before reaching libpat.
func argError(op string, errno syscall.Errno, format string, args ...interface{}) *Error {
	return &Error{Op: op, Errno: errno, Msg: fmt.Sprintf(format, args...)}
}

// LibraryVersion is pat_version() of the libpat actually loaded, encoded as Version.
func LibraryVersion() uint32 { return uint32(C.pat_version()) }

// VersionString formats an encoded version as "major.minor.patch".
func VersionString(v uint32) string {
	return fmt.Sprintf("%d.%d.%d", v>>16, (v>>8)&0xff, v&0xff)
}

// CheckVersion says whether the loaded libpat can serve this binding: the same major
// version, a minor one at least the binding's. Connect calls it.
func CheckVersion() error {
	v := LibraryVersion()
	if v>>16 != VersionMajor || (v>>8)&0xff < VersionMinor {
		return argError("version", syscall.ELIBBAD,
			"libpat %s cannot serve this binding, compiled against pat.h %s",
			VersionString(v), VersionString(Version))
	}
	return nil
}

// DefaultSocket is the control socket libpat uses when none is named: $PATD_SOCKET, else
// /run/patd/patd.sock as root, else $XDG_RUNTIME_DIR/patd/patd.sock, else
// /tmp/patd-<uid>/patd.sock.
func DefaultSocket() string {
	p := C.go_default_socket()
	defer C.free(unsafe.Pointer(p))
	return C.GoString(p)
}

// cstr is s as a C string (NULL for ""); free it with C.free (NULL is fine).
func cstr(s string) *C.char {
	if s == "" {
		return nil
	}
	return C.CString(s)
}

// cField is a fixed char array's text up to its first NUL.
func cField(b []C.char) string {
	n := 0
	for n < len(b) && b[n] != 0 {
		n++
	}
	return C.GoStringN(&b[0], C.int(n))
}

// AdminOp is an operator request (pat_admin_op_t).
type AdminOp uint32

const (
	AdminStatus  AdminOp = C.PAT_ADMIN_STATUS  // "key value" lines for people
	AdminStats   AdminOp = C.PAT_ADMIN_STATS   // Prometheus text format
	AdminSeqs    AdminOp = C.PAT_ADMIN_SEQS    // one line per open sequence
	AdminDrain   AdminOp = C.PAT_ADMIN_DRAIN   // refuse new work, finish steps, exit
	AdminReload  AdminOp = C.PAT_ADMIN_RELOAD  // re-read the config file
	AdminCheck   AdminOp = C.PAT_ADMIN_CHECK   // the KV pool's invariant check
	AdminUpgrade AdminOp = C.PAT_ADMIN_UPGRADE // start the successor binary
)

// Admin sends an operator request to the daemon at socket ("" = DefaultSocket) and returns
// its text. timeoutMs 0 means 10 s. On failure the Error's detail is the daemon's text or
// the socket no daemon answers at.
func Admin(socket string, op AdminOp, timeoutMs uint32) (string, error) {
	if timeoutMs == 0 {
		timeoutMs = 10000
	}
	s := cstr(socket)
	defer C.free(unsafe.Pointer(s))
	var text *C.char
	rc := C.pat_admin(s, C.pat_admin_op_t(op), C.uint32_t(timeoutMs), &text)
	out := ""
	if text != nil {
		out = C.GoString(text)
		C.pat_free(unsafe.Pointer(text))
	}
	if rc < 0 {
		return "", newError("admin", rc, out)
	}
	return out, nil
}

// Status is what a daemon reports about itself (pat_status_t).
type Status struct {
	Protocol  uint32 // the daemon's wire protocol version
	Version   uint32 // its release, encoded as the package's Version
	Pid       uint32
	Instance  uint64 // random per daemon start (a changed value: it restarted)
	UptimeMs  uint64
	Draining  bool // refusing new work, finishing steps in flight
	MaxSeqLen uint32
	Backend   string // "cpu" | "cuda"
	Model     Model

	// limits
	MaxConns, ConnMaxSeqs, ConnMaxBlocks, ConnMaxBatchTokens uint32
	ConnMaxStagingMB, LeaseMs, StepTimeoutMs                 uint32

	// the KV pool and the sessions now
	BlocksTotal, BlocksFree, BlocksUsed, BlocksCached uint32
	Sequences, Connections, StepsInFlight             uint32

	Scale   float32 // the softmax scale the daemon applies
	Softcap float32 // its logit soft cap (0: off)
	KVDtype uint32  // the KV pool's element type, F16 ... FP8E5M2
	KVScale float32 // fp8: an element is stored as value / KVScale
}

// GetStatus asks the daemon at socket ("" = DefaultSocket) for its figures; timeoutMs 0
// means 10 s.
func GetStatus(socket string, timeoutMs uint32) (*Status, error) {
	if timeoutMs == 0 {
		timeoutMs = 10000
	}
	s := cstr(socket)
	defer C.free(unsafe.Pointer(s))
	var st C.pat_status_t
	st.size = C.uint32_t(unsafe.Sizeof(st))
	if rc := C.pat_status(s, C.uint32_t(timeoutMs), &st); rc < 0 {
		return nil, newError("status", rc, socket)
	}
	out := &Status{
		Protocol: uint32(st.protocol), Version: uint32(st.version), Pid: uint32(st.pid),
		Instance: uint64(st.instance), UptimeMs: uint64(st.uptime_ms),
		Draining: st.draining != 0, MaxSeqLen: uint32(st.max_seq_len),
		Backend: cField(st.backend[:]), Model: modelFromC(&st.model),
		MaxConns: uint32(st.max_conns), ConnMaxSeqs: uint32(st.conn_max_seqs),
		ConnMaxBlocks: uint32(st.conn_max_blocks), ConnMaxBatchTokens: uint32(st.conn_max_batch_tokens),
		ConnMaxStagingMB: uint32(st.conn_max_staging_mb), LeaseMs: uint32(st.lease_ms),
		StepTimeoutMs: uint32(st.step_timeout_ms),
		BlocksTotal:   uint32(st.blocks_total), BlocksFree: uint32(st.blocks_free),
		BlocksUsed: uint32(st.blocks_used), BlocksCached: uint32(st.blocks_cached),
		Sequences: uint32(st.sequences), Connections: uint32(st.connections),
		StepsInFlight: uint32(st.steps_in_flight),
		Scale:         float32(st.scale), Softcap: float32(st.softcap),
		KVDtype: uint32(st.kv_dtype), KVScale: float32(st.kv_scale),
	}
	if out.KVDtype == 0 { // an older daemon: its pool holds the model's dtype
		out.KVDtype = out.Model.Dtype
	}
	return out, nil
}
