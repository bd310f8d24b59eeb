package pat

/*
#include "pat.h"
*/
import "C"

import (
	"runtime"
	"sync/atomic"
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
// `defer step.Close()` leaves the session ready for its next step on every path. Where an
// abort (or End) gets no answer (ETIMEDOUT: a stopped or overloaded daemon), libpat keeps the
// step open so that it can be tried again: Close tries again, and so do Conn.AbortStep and the
// next Begin, which ends such a step first. A Step dropped without End or Close is ended by the
// next Begin once the garbage collector has found it (Conn.AbortStep at once).
type Step struct {
	conn *Conn
	gen  uint64 // which of the Conn's steps: the session's while conn.step == gen
	rows int
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
	var left error // why a step nobody will end could not be ended
	if c.step != 0 && (c.stepLeft || atomic.LoadUint64(&c.dropped) == c.step) {
		if rc := c.endStep(h, true, nil); rc < 0 && rc != -esrch {
			left = newError(op, rc, "ending the step left open: "+C.GoString(C.pat_last_error(h)))
		}
	}
	rc := C.pat_step_begin(h, (*C.uint32_t)(unsafe.Pointer(&seqs[0])),
		(*C.uint32_t)(unsafe.Pointer(&nNew[0])), C.uint32_t(len(feeds)),
		(*C.uint32_t)(unsafe.Pointer(&tokens[0])))
	if rc == -C.int(syscall.EBUSY) && left != nil {
		return nil, left
	}
	if rc < 0 {
		return nil, c.fail(op, rc)
	}
	c.gens++
	c.step, c.stepLeft = c.gens, false
	s := &Step{conn: c, gen: c.gens, rows: rows}
	runtime.SetFinalizer(s, (*Step).dropped)
	return s, nil
}

// Rows is the number of staging rows the step uses: its new tokens.
func (s *Step) Rows() int { return s.rows }

// esrch is libpat's answer to ending a step where none is open.
const esrch = -C.int(syscall.ESRCH)

// endStep ends the session's step (the caller holds the lock) and returns pat_step_end's rc.
// The step is over at 0 or -ESRCH (libpat holds none). On any other failure it is marked
// left: an answer from the daemon closed it in libpat, but no answer (a timeout, a send that
// failed) leaves it open there, and only a later try tells which (-ESRCH: closed).
func (c *Conn) endStep(h *C.pat_conn_t, abort bool, in *C.pat_step_info_t) C.int {
	ab := C.int(0)
	if abort {
		ab = 1
	}
	rc := C.pat_step_end(h, ab, in)
	if rc == 0 || rc == esrch {
		c.step, c.stepLeft = 0, false
	} else {
		c.stepLeft = true
	}
	return rc
}

// AbortStep aborts the session's open step, whichever Step holds it (its calls then fail with
// ESRCH), or tries again to end one whose end got no answer; nil when none is open.
func (c *Conn) AbortStep() error {
	h, err := c.lock("step_abort")
	if err != nil {
		return err
	}
	defer c.mu.Unlock()
	if rc := c.endStep(h, true, nil); rc < 0 && rc != esrch {
		return c.fail("step_abort", rc)
	}
	return nil
}

// dropped is the Step's finalizer: a Step collected while its step is the session's leaves
// it to the next Begin. Steps are collected in any order and only the newest can be the
// session's: the Conn keeps the highest gen (atomic: a finalizer must not wait for the lock).
func (s *Step) dropped() {
	for {
		d := atomic.LoadUint64(&s.conn.dropped)
		if d >= s.gen || atomic.CompareAndSwapUint64(&s.conn.dropped, d, s.gen) {
			return
		}
	}
}

// lock takes the Conn's lock while the step is the session's (ending: also once an end of it
// got no answer, which only ending it again may follow): ESRCH once it has ended, EBADF once
// the Conn is closed. The caller unlocks.
func (s *Step) lock(op string, ending bool) (*C.pat_conn_t, error) {
	h, err := s.conn.lock(op)
	if err != nil {
		return nil, err
	}
	switch {
	case s.conn.step != s.gen:
		s.conn.mu.Unlock()
		return nil, argError(op, syscall.ESRCH, "the step has ended")
	case s.conn.stepLeft && !ending:
		s.conn.mu.Unlock()
		return nil, argError(op, syscall.ESRCH, "the step is being ended (its end got no "+
			"answer: Close, Conn.AbortStep or the next Begin tries again)")
	}
	return h, nil
}

// Attend hands layer over (Q, K and V of the step's rows written) and waits for its O.
// Layers go 0, 1, ... in order. On failure (the daemon's answer to the step: ENOSPC,
// EDQUOT, ENOENT ...; ETIMEDOUT; ECANCELED; ECONNRESET; EINVAL for a layer out of order)
// the step is aborted and over, unless the abort got no answer either (see Step).
func (s *Step) Attend(layer uint32) error {
	h, err := s.lock("attend", false)
	if err != nil {
		return err
	}
	defer s.conn.mu.Unlock()
	if rc := C.pat_attend(h, C.uint32_t(layer)); rc < 0 {
		err := s.conn.fail("attend", rc)
		s.conn.endStep(h, true, nil)
		return err
	}
	return nil
}

// End commits the step's KV (every layer must have been attended; else the step is dropped
// and ECANCELED returned). After ETIMEDOUT (no answer) End may be called again.
func (s *Step) End() (StepInfo, error) { return s.end("step_end", false) }

// Abort drops the step's KV.
func (s *Step) Abort() (StepInfo, error) { return s.end("step_abort", true) }

// Close aborts the step unless it has ended (or its Conn was closed); nil then. It fails
// where the abort got no answer (the step stays open: Close may be called again).
func (s *Step) Close() error {
	h, err := s.lock("step_abort", true)
	if err != nil {
		return nil
	}
	defer s.conn.mu.Unlock()
	if rc := s.conn.endStep(h, true, nil); rc < 0 && rc != esrch {
		return s.conn.fail("step_abort", rc)
	}
	return nil
}

func (s *Step) end(op string, abort bool) (StepInfo, error) {
	h, err := s.lock(op, true)
	if err != nil {
		return StepInfo{}, err
	}
	defer s.conn.mu.Unlock()
	var in C.pat_step_info_t
	if rc := s.conn.endStep(h, abort, &in); rc < 0 {
		return StepInfo{}, s.conn.fail(op, rc)
	}
	return StepInfo{
		Step: uint64(in.step), Tokens: uint32(in.n_tokens), PackReused: in.pack_reused != 0,
		KVBytes: uint64(in.kv_bytes), QCBytes: uint64(in.qc_bytes),
		LayersDone: uint32(in.layers_done), Committed: in.committed != 0,
		StepNs: uint64(in.step_ns), PackPolicy: uint32(in.pack_policy),
	}, nil
}
