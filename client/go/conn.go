package pat

/*
#include <stdlib.h>
#include "pat.h"
*/
import "C"

import (
	"sync"
	"syscall"
	"time"
	"unsafe"
)

// Model is the model signature the daemon must match (pat_model_t).
type Model struct {
	Layers, QHeads, KVHeads, HeadDim uint32
	Dtype                            uint32 // F16, BF16, F32; 0 = F16
	BlockSize                        uint32 // tokens per KV block; 0 = 16
	ModelID                          uint64 // must equal the daemon's model.model_id
}

func (m Model) toC() C.pat_model_t {
	if m.Dtype == 0 {
		m.Dtype = F16
	}
	if m.BlockSize == 0 {
		m.BlockSize = 16
	}
	return C.pat_model_t{
		n_layers: C.uint32_t(m.Layers), q_heads: C.uint32_t(m.QHeads),
		kv_heads: C.uint32_t(m.KVHeads), head_dim: C.uint32_t(m.HeadDim),
		dtype: C.uint32_t(m.Dtype), block_size: C.uint32_t(m.BlockSize),
		model_id: C.uint64_t(m.ModelID),
	}
}

func modelFromC(m *C.pat_model_t) Model {
	return Model{
		Layers: uint32(m.n_layers), QHeads: uint32(m.q_heads), KVHeads: uint32(m.kv_heads),
		HeadDim: uint32(m.head_dim), Dtype: uint32(m.dtype), BlockSize: uint32(m.block_size),
		ModelID: uint64(m.model_id),
	}
}

// Where the staging buffers live (Options.Buffer).
const (
	BufferAuto = C.PAT_BUFFER_AUTO // what the daemon's backend uses
	BufferHost = C.PAT_BUFFER_HOST // POSIX shared memory: a daemon on the cpu backend
	BufferGPU  = C.PAT_BUFFER_GPU  // device memory: a daemon on the cuda backend
)

// How the daemon packs the session's queries into CTAs (Options.PackPolicy, StepInfo).
const (
	PackDefault = C.PAT_PACK_DEFAULT // the daemon's daemon.pack_policy
	PackAuto    = C.PAT_PACK_AUTO
	PackBytes   = C.PAT_PACK_BYTES
	PackPaper   = C.PAT_PACK_PAPER
	PackQuery   = C.PAT_PACK_QUERY
	PackTree    = C.PAT_PACK_TREE
)

// Options of Connect (pat_connect_opts_t).
type Options struct {
	Socket         string // control socket; "" = DefaultSocket()
	Label          string // shown by `patctl seqs`
	Model          Model
	MaxBatchTokens uint32 // staging rows: the most new tokens in one step
	MaxSeqs        uint32 // open sequences wanted; 0 = the daemon's per-session quota
	TimeoutMs      uint32 // per request and per layer wait; 0 = 30000
	LeaseMs        uint32 // 0 = the daemon's default
	Buffer         uint32 // BufferAuto, BufferHost, BufferGPU
	PackPolicy     uint32 // PackDefault ... PackTree
	KVDtype        uint32 // the KV pool's element type needed (EMEDIUMTYPE if not); 0 = any
}

// Info is what the daemon granted the session (pat_buffers_t less the pointers).
type Info struct {
	MaxBatchTokens, MaxSeqs, MaxBlocks, LeaseMs uint32
	QRowBytes, KVRowBytes                       uint64 // one token's Q (and O), K (and V)
	OnGPU, MPS                                  bool   // staging in device memory; MPS clients
	KVDtype                                     uint32 // the daemon's KV pool (F16 ... FP8E5M2)
	KVScale                                     float32
}

// Conn is one session with patd. Its methods may be called from several goroutines (see
// the package comment); Close ends it.
type Conn struct {
	mu    sync.Mutex
	h     *C.pat_conn_t // nil once closed
	model Model
	info  Info
	st    staging

	// the session's step, moved by step.go only
	step     uint64 // the gen of the Step whose step libpat may hold open; 0: none
	stepLeft bool   // an end of it got no answer: Begin ends it first
	dropped  uint64 // atomic: the highest gen of a Step the garbage collector found
	gens     uint64 // Steps begun
}

// Connect opens a session and maps its staging buffers. On failure the Error carries the
// errno (ENOENT or ECONNREFUSED: no daemon; EMEDIUMTYPE: model mismatch; ENOBUFS: the
// daemon's staging budget; ...) and the daemon's detail.
func Connect(o Options) (*Conn, error) {
	if err := CheckVersion(); err != nil {
		return nil, err
	}
	co := C.pat_connect_opts_t{
		max_batch_tokens: C.uint32_t(o.MaxBatchTokens), max_seqs: C.uint32_t(o.MaxSeqs),
		timeout_ms: C.uint32_t(o.TimeoutMs), lease_ms: C.uint32_t(o.LeaseMs),
		buffer: C.uint32_t(o.Buffer), model: o.Model.toC(),
		pack_policy: C.uint32_t(o.PackPolicy), kv_dtype: C.uint32_t(o.KVDtype),
	}
	co.size = C.uint32_t(unsafe.Sizeof(co))
	co.socket = cstr(o.Socket)
	defer C.free(unsafe.Pointer(co.socket))
	co.label = cstr(o.Label)
	defer C.free(unsafe.Pointer(co.label))
	var h *C.pat_conn_t
	var why [256]C.char
	if rc := C.pat_connect(&co, &h, &why[0], C.size_t(len(why))); rc < 0 {
		return nil, newError("connect", rc, cField(why[:]))
	}
	var b C.pat_buffers_t
	if rc := C.pat_buffers(h, &b); rc < 0 {
		err := newError("buffers", rc, C.GoString(C.pat_last_error(h)))
		C.pat_close(h)
		return nil, err
	}
	c := &Conn{h: h, model: modelFromC(&co.model)}
	c.info = Info{
		MaxBatchTokens: uint32(b.max_batch_tokens), MaxSeqs: uint32(b.max_seqs),
		MaxBlocks: uint32(b.max_blocks), LeaseMs: uint32(b.lease_ms),
		QRowBytes: uint64(b.q_row_bytes), KVRowBytes: uint64(b.kv_row_bytes),
		OnGPU: b.on_gpu != 0, MPS: b.mps != 0,
		KVDtype: uint32(b.kv_dtype), KVScale: float32(b.kv_scale),
	}
	if c.info.KVDtype == 0 { // an older daemon: its pool holds the model's dtype
		c.info.KVDtype = c.model.Dtype
	}
	if c.info.KVScale == 0 {
		c.info.KVScale = 1
	}
	if !c.info.OnGPU {
		c.st.init(c.model, &b)
	}
	return c, nil
}

// Close ends the session: the daemon reclaims its sequences and KV, and the staging
// buffers (Raw) are unmapped. A second Close does nothing.
func (c *Conn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.h != nil {
		C.pat_close(c.h)
		c.h = nil
		c.st = staging{}
	}
	return nil
}

// Model is the signature the session was opened with.
func (c *Conn) Model() Model { return c.model }

// Info is what the daemon granted the session.
func (c *Conn) Info() Info { return c.info }

// lock takes the Conn's mutex and returns its handle, or EBADF once closed; the caller
// unlocks.
func (c *Conn) lock(op string) (*C.pat_conn_t, error) {
	c.mu.Lock()
	if c.h == nil {
		c.mu.Unlock()
		return nil, argError(op, syscall.EBADF, "the Conn is closed")
	}
	return c.h, nil
}

// fail is the Error of rc with the session's detail (the caller holds the lock).
func (c *Conn) fail(op string, rc C.int) error {
	return newError(op, rc, C.GoString(C.pat_last_error(c.h)))
}

// Ping asks the daemon for an answer (and renews the session's lease).
func (c *Conn) Ping() error {
	h, err := c.lock("ping")
	if err != nil {
		return err
	}
	defer c.mu.Unlock()
	if rc := C.pat_ping(h); rc < 0 {
		return c.fail("ping", rc)
	}
	return nil
}

// Instance is the daemon instance this session is with (random per daemon start; see
// GetStatus) and when it started; 0 once the Conn is closed. A reconnecting client compares
// it with the old session's.
func (c *Conn) Instance() (uint64, time.Time) {
	h, err := c.lock("instance")
	if err != nil {
		return 0, time.Time{}
	}
	defer c.mu.Unlock()
	var start C.uint64_t
	id := C.pat_instance(h, &start)
	return uint64(id), time.Unix(int64(start), 0)
}

// Stats are the session's counters, summed over its committed steps.
type Stats struct {
	Steps, Tokens    uint64
	KVBytes, QCBytes uint64 // K+V bytes the plans read, and what query-centric attention would
	PromptTokens     uint64 // given to OpenSeq
	CachedTokens     uint64 // ... of which the prefix cache already held
}

// Stats reads the session's counters (kept by libpat; no request).
func (c *Conn) Stats() (Stats, error) {
	h, err := c.lock("stats")
	if err != nil {
		return Stats{}, err
	}
	defer c.mu.Unlock()
	var s C.pat_conn_stats_t
	if rc := C.pat_stats(h, &s); rc < 0 {
		return Stats{}, c.fail("stats", rc)
	}
	return Stats{
		Steps: uint64(s.steps), Tokens: uint64(s.tokens), KVBytes: uint64(s.kv_bytes),
		QCBytes: uint64(s.qc_bytes), PromptTokens: uint64(s.prompt_tokens),
		CachedTokens: uint64(s.cached_tokens),
	}, nil
}

// Seq is an open sequence of a session.
type Seq struct {
	conn    *Conn
	ID      uint32 // the daemon's id (as `patctl seqs` shows it)
	Cached  uint32 // prompt tokens the prefix cache held at open: prefill the rest (0: fork)
	Pending uint32 // OpenSeqPending: prompt tokens past Cached that twins are about to write
}

// Conn is the session the sequence belongs to.
func (s *Seq) Conn() *Conn { return s.conn }

// Seq is a handle to sequence id of this session, as another part of the frontend knows
// it; calls with an id the session does not hold fail with ENOENT.
func (c *Conn) Seq(id uint32) *Seq { return &Seq{conn: c, ID: id} }

// OpenSeq opens a sequence with its prompt's token ids. Seq.Cached says how much of the
// prompt the prefix cache already holds (whole blocks, at least one token left to compute).
func (c *Conn) OpenSeq(prompt []uint32) (*Seq, error) {
	return c.openSeq("seq_open", prompt, false)
}

// OpenSeqPending is OpenSeq that also reports in Seq.Pending the prompt tokens past Cached
// that other open sequences of this user (in any session) are about to write. patd never
// waits for them; a frontend that does (closes and reopens once they are written) prefills
// that many tokens less.
func (c *Conn) OpenSeqPending(prompt []uint32) (*Seq, error) {
	return c.openSeq("seq_open_pending", prompt, true)
}

func (c *Conn) openSeq(op string, prompt []uint32, pending bool) (*Seq, error) {
	if len(prompt) == 0 {
		return nil, argError(op, syscall.EINVAL, "an empty prompt")
	}
	h, err := c.lock(op)
	if err != nil {
		return nil, err
	}
	defer c.mu.Unlock()
	var id, cached, pend C.uint32_t
	toks := (*C.uint32_t)(unsafe.Pointer(&prompt[0]))
	var rc C.int
	if pending {
		rc = C.pat_seq_open_pending(h, toks, C.uint32_t(len(prompt)), &id, &cached, &pend)
	} else {
		rc = C.pat_seq_open(h, toks, C.uint32_t(len(prompt)), &id, &cached)
	}
	if rc < 0 {
		return nil, c.fail(op, rc)
	}
	return &Seq{conn: c, ID: uint32(id), Cached: uint32(cached), Pending: uint32(pend)}, nil
}

// Fork opens a child sharing the sequence's committed KV (copy on write).
func (s *Seq) Fork() (*Seq, error) {
	h, err := s.conn.lock("seq_fork")
	if err != nil {
		return nil, err
	}
	defer s.conn.mu.Unlock()
	var child C.uint32_t
	if rc := C.pat_seq_fork(h, C.uint32_t(s.ID), &child); rc < 0 {
		return nil, s.conn.fail("seq_fork", rc)
	}
	return &Seq{conn: s.conn, ID: uint32(child)}, nil
}

// Truncate rolls the sequence back to its first n tokens (ERANGE past its length).
func (s *Seq) Truncate(n uint32) error {
	h, err := s.conn.lock("seq_truncate")
	if err != nil {
		return err
	}
	defer s.conn.mu.Unlock()
	if rc := C.pat_seq_truncate(h, C.uint32_t(s.ID), C.uint32_t(n)); rc < 0 {
		return s.conn.fail("seq_truncate", rc)
	}
	return nil
}

// Close closes the sequence; its blocks stay in the prefix cache where others can use them.
func (s *Seq) Close() error {
	h, err := s.conn.lock("seq_close")
	if err != nil {
		return err
	}
	defer s.conn.mu.Unlock()
	if rc := C.pat_seq_close(h, C.uint32_t(s.ID)); rc < 0 {
		return s.conn.fail("seq_close", rc)
	}
	return nil
}
