package pat

/*
#include "pat.h"
*/
import "C"

import (
	"syscall"
	"unsafe"
)

// Feed is one sequence's new tokens in a step: its rows in the staging buffers follow the
// rows of the feeds before it.
type Feed struct {
	Seq    *Seq
	Tokens []uint32
}

// Step is a step in flight: Attend every layer in order, then End. A step that fails
// (any error from Attend) is aborted at once, and Close aborts one not yet ended, so
// `defer step.Close()` leaves the session ready for its next step on every path.
type Step struct {
	conn *Conn
	rows int
	open bool // guarded by conn.mu
}

// StepInfo is what the daemon reports when a step ends (pat_step_info_t).
type StepInfo struct {
	Step       uint64
	Tokens     uint32
	PackReused bool   // the previous pack was reused (forest shape unchanged)
	KVBytes    uint64 // K+V bytes the plan reads per layer
	QCBytes    uint64 // ... and what query-centric attention would read
	LayersDone uint32
	Committed  bool   // the tokens are now part of their sequences
	StepNs     uint64 // daemon: STEP_BEGIN received -> last layer done
	PackPolicy uint32 // the Pack* that built the step's pack
}

// Begin starts a step over feeds (one per sequence, each with at least one token). It
// returns once the request is sent; the daemon's answer comes with the first Attend.
// EBUSY while another step of the session is open, E2BIG past MaxBatchTokens or MaxSeqs.
func (c *Conn) Begin(feeds ...Feed) (*Step, error) {
	const op = "step_begin"
	if len(feeds) == 0 {
		return nil, argError(op, syscall.EINVAL, "no sequences")
	}
	seqs := make([]uint32, len(feeds))
	nNew := make([]uint32, len(feeds))
	rows := 0
	for i, f := range feeds {
		switch {
		case f.Seq == nil:
			return nil, argError(op, syscall.EINVAL, "feed %d has no sequence", i)
		case f.Seq.conn != c:
			return nil, argError(op, syscall.EINVAL, "sequence %d belongs to another Conn", f.Seq.ID)
		case len(f.Tokens) == 0:
			return nil, argError(op, syscall.EINVAL, "sequence %d has no new tokens", f.Seq.ID)
		}
		seqs[i], nNew[i] = f.Seq.ID, uint32(len(f.Tokens))
		rows += len(f.Tokens)
	}
	tokens := make([]uint32, 0, rows)
	for _, f := range feeds {
		tokens = append(tokens, f.Tokens...)
	}
	h, err := c.lock(op)
	if err != nil {
		return nil, err
	}
	defer c.mu.Unlock()
	rc := C.pat_step_begin(h, (*C.uint32_t)(unsafe.Pointer(&seqs[0])),
		(*C.uint32_t)(unsafe.Pointer(&nNew[0])), C.uint32_t(len(feeds)),
		(*C.uint32_t)(unsafe.Pointer(&tokens[0])))
	if rc < 0 {
		return nil, c.fail(op, rc)
	}
	return &Step{conn: c, rows: rows, open: true}, nil
}

// Rows is the number of staging rows the step uses: its new tokens.
func (s *Step) Rows() int { return s.rows }

// lock takes the Conn's lock for an open step: ESRCH once the step ended, EBADF once the
// Conn is closed. The caller unlocks.
func (s *Step) lock(op string) (*C.pat_conn_t, error) {
	h, err := s.conn.lock(op)
	if err != nil {
		return nil, err
	}
	if !s.open {
		s.conn.mu.Unlock()
		return nil, argError(op, syscall.ESRCH, "the step has ended")
	}
	return h, nil
}

// Attend hands layer over (Q, K and V of the step's rows written) and waits for its O.
// Layers go 0, 1, ... in order. On failure (the daemon's answer to the step: ENOSPC,
// EDQUOT, ENOENT ...; ETIMEDOUT; ECANCELED; ECONNRESET; EINVAL for a layer out of order)
// the step is aborted and over.
func (s *Step) Attend(layer uint32) error {
	h, err := s.lock("attend")
	if err != nil {
		return err
	}
	defer s.conn.mu.Unlock()
	if rc := C.pat_attend(h, C.uint32_t(layer)); rc < 0 {
		err := s.conn.fail("attend", rc)
		C.pat_step_end(h, 1, nil)
		s.open = false
		return err
	}
	return nil
}

// End commits the step's KV (every layer must have been attended; else the step is dropped
// and ECANCELED returned).
func (s *Step) End() (StepInfo, error) { return s.end("step_end", false) }

// Abort drops the step's KV.
func (s *Step) Abort() (StepInfo, error) { return s.end("step_abort", true) }

// Close aborts the step unless it has ended (or its Conn was closed); nil then.
func (s *Step) Close() error {
	s.conn.mu.Lock()
	defer s.conn.mu.Unlock()
	if !s.open || s.conn.h == nil {
		return nil
	}
	_, err := s.endLocked(s.conn.h, "step_abort", true)
	return err
}

func (s *Step) end(op string, abort bool) (StepInfo, error) {
	h, err := s.lock(op)
	if err != nil {
		return StepInfo{}, err
	}
	defer s.conn.mu.Unlock()
	return s.endLocked(h, op, abort)
}

// endLocked ends the open step (the caller holds the Conn's lock).
func (s *Step) endLocked(h *C.pat_conn_t, op string, abort bool) (StepInfo, error) {
	var in C.pat_step_info_t
	ab := C.int(0)
	if abort {
		ab = 1
	}
	rc := C.pat_step_end(h, ab, &in)
	s.open = false
	if rc < 0 {
		return StepInfo{}, s.conn.fail(op, rc)
	}
	return StepInfo{
		Step: uint64(in.step), Tokens: uint32(in.n_tokens), PackReused: in.pack_reused != 0,
		KVBytes: uint64(in.kv_bytes), QCBytes: uint64(in.qc_bytes),
		LayersDone: uint32(in.layers_done), Committed: in.committed != 0,
		StepNs: uint64(in.step_ns), PackPolicy: uint32(in.pack_policy),
	}, nil
}
