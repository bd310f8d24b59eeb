package pat_test

// Tests of the binding against a real patd on the cpu backend, whose control socket is
// $PATD_SOCKET; tests/integ/test_go.sh starts it as
//   patd --backend=cpu --layers=2 --q-heads=4 --kv-heads=2 --conn-max-seqs=8 --staging-mb=4
// (head_dim 64, f16), and runs them with GODEBUG=cgocheck=2. TestStepLeftOpen stops the daemon
// (SIGSTOP) for a moment; TestForeignKV leaves KV in its prefix cache that the example, run
// after these tests, must not read.

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"patd.dev/pat"
	"patd.dev/pat/internal/attnref"
)

var (
	sock  string
	model = pat.Model{Layers: 2, QHeads: 4, KVHeads: 2, HeadDim: 64, Dtype: pat.F16}
)

func TestMain(m *testing.M) {
	sock = os.Getenv("PATD_SOCKET")
	if sock == "" {
		fmt.Fprintln(os.Stderr, "PATD_SOCKET is not set: these tests need a running patd "+
			"(tests/integ/test_go.sh starts one)")
		os.Exit(2)
	}
	os.Exit(m.Run())
}

func connect(t *testing.T, o pat.Options) *pat.Conn {
	t.Helper()
	o.Socket, o.Model = sock, model
	if o.MaxBatchTokens == 0 {
		o.MaxBatchTokens = 128
	}
	if o.Label == "" {
		o.Label = "go-test"
	}
	c, err := pat.Connect(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// wantErrno fails unless err is a *pat.Error of op carrying errno.
func wantErrno(t *testing.T, err error, op string, errno syscall.Errno) *pat.Error {
	t.Helper()
	var pe *pat.Error
	if !errors.As(err, &pe) {
		t.Fatalf("want a *pat.Error %v from %s, got %v", errno, op, err)
	}
	if !errors.Is(err, errno) || pe.Errno != errno || pe.Op != op {
		t.Fatalf("want %s: errno %d (%v), got %s: errno %d (%v)", op, int(errno), errno,
			pe.Op, int(pe.Errno), err)
	}
	return pe
}

func status(t *testing.T) *pat.Status {
	t.Helper()
	st, err := pat.GetStatus(sock, 0)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func poolCheck(t *testing.T) {
	t.Helper()
	text, err := pat.Admin(sock, pat.AdminCheck, 0)
	if err != nil || !strings.HasPrefix(text, "pool_check ok") {
		t.Fatalf("pool check: %q %v", text, err)
	}
}

// tseq is a sequence with the tokens the reference needs and its committed length.
type tseq struct {
	s    *pat.Seq
	toks []uint32
	n    int // committed positions
}

func open(t *testing.T, c *pat.Conn, prompt []uint32) *tseq {
	t.Helper()
	s, err := c.OpenSeq(prompt)
	if err != nil {
		t.Fatal(err)
	}
	return &tseq{s: s, toks: append([]uint32(nil), prompt...), n: int(s.Cached)}
}

// checkedStep runs one step feeding each sequence the tokens past its committed length
// (appending news[i] first), writes Q, K, V of every row and layer, and returns the worst
// |O - ref| / tolerance over all of them.
func checkedStep(c *pat.Conn, ref *attnref.Ref, seqs []*tseq, news [][]uint32,
	rng *rand.Rand) (pat.StepInfo, float64, error) {
	var feeds []pat.Feed
	type row struct {
		q   *tseq
		pos int
	}
	var rows []row
	for i, s := range seqs {
		if news != nil {
			s.toks = append(s.toks, news[i]...)
		}
		feeds = append(feeds, pat.Feed{Seq: s.s, Tokens: s.toks[s.n:]})
		for p := s.n; p < len(s.toks); p++ {
			rows = append(rows, row{s, p})
		}
	}
	step, err := c.Begin(feeds...)
	if err != nil {
		return pat.StepInfo{}, 0, err
	}
	defer step.Close()
	m := c.Model()
	q := make([][]float32, len(rows))
	o := make([]float32, c.RowLen(pat.O))
	nan := make([]float32, len(o))
	for i := range nan {
		nan[i] = float32(math.NaN())
	}
	worst := 0.0
	for layer := uint32(0); layer < m.Layers; layer++ {
		for r, w := range rows {
			q[r] = make([]float32, c.RowLen(pat.Q))
			ref.Rand(rng, q[r])
			k, v := ref.KV(layer, uint32(w.pos), w.q.toks[w.pos])
			for _, e := range []error{c.Put(pat.Q, r, q[r]), c.Put(pat.K, r, k),
				c.Put(pat.V, r, v), c.Put(pat.O, r, nan)} {
				if e != nil {
					return pat.StepInfo{}, 0, e
				}
			}
		}
		if err := step.Attend(layer); err != nil {
			return pat.StepInfo{}, 0, err
		}
		for r, w := range rows {
			if err := c.Get(pat.O, r, o); err != nil {
				return pat.StepInfo{}, 0, err
			}
			worst = math.Max(worst, ref.Worst(o, ref.Out(layer, w.q.toks, w.pos, q[r])))
		}
	}
	info, err := step.End()
	if err == nil {
		for _, s := range seqs {
			s.n = len(s.toks)
		}
	}
	return info, worst, err
}

// fresh is a base for prompt tokens no earlier test (of this process or of an earlier run
// against the same daemon, whose prefix cache still holds those) used.
func fresh() uint32 {
	return atomic.AddUint32(&tokBase, 1<<16)
}

var tokBase = uint32(time.Now().UnixNano()%(1<<12)) << 18

// seqRange is the n tokens from, from+1, ...
func seqRange(from, n uint32) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = from + uint32(i)
	}
	return t
}

func TestVersion(t *testing.T) {
	if got := pat.LibraryVersion(); got != pat.Version {
		t.Fatalf("libpat %s loaded, pat.h says %s", pat.VersionString(got),
			pat.VersionString(pat.Version))
	}
	want := fmt.Sprintf("%d.%d.%d", pat.VersionMajor, pat.VersionMinor, pat.VersionPatch)
	if s := pat.VersionString(pat.Version); s != want {
		t.Fatalf("VersionString %s, want %s", s, want)
	}
	if err := pat.CheckVersion(); err != nil {
		t.Fatal(err)
	}
	if st := status(t); st.Version>>16 != pat.VersionMajor {
		t.Fatalf("daemon %s, binding %s", pat.VersionString(st.Version), want)
	}
}

func TestF16BF16(t *testing.T) {
	cases := []struct {
		f    float32
		bits uint16
	}{
		{1, 0x3c00}, {-2, 0xc000}, {0.1, 0x2e66}, {65504, 0x7bff}, {65520, 0x7c00},
		{0x1p-24, 0x0001}, {0x1p-25, 0x0000}, {0x1.8p-25, 0x0001}, {0x1p-14, 0x0400},
		{1 + 0x1p-11, 0x3c00}, {1 + 3*0x1p-11, 0x3c02}, // ties to even
		{float32(math.Inf(-1)), 0xfc00},
	}
	for _, c := range cases {
		if got := pat.F16Bits(c.f); got != c.bits {
			t.Errorf("F16Bits(%g) = %#04x, want %#04x", c.f, got, c.bits)
		}
	}
	if h := pat.F16Bits(float32(math.NaN())); h&0x7c00 != 0x7c00 || h&0x3ff == 0 {
		t.Errorf("F16Bits(NaN) = %#04x", h)
	}
	for h := 0; h < 1<<16; h++ { // every binary16 but NaNs survives the round trip
		if h&0x7c00 == 0x7c00 && h&0x3ff != 0 {
			continue
		}
		if got := pat.F16Bits(pat.F16Float(uint16(h))); got != uint16(h) {
			t.Fatalf("%#04x -> %g -> %#04x", h, pat.F16Float(uint16(h)), got)
		}
	}
	bf := []struct {
		f    float32
		bits uint16
	}{{1, 0x3f80}, {-2, 0xc000}, {1 + 0x1p-8, 0x3f80}, {1 + 3*0x1p-8, 0x3f82}, {3.1416, 0x4049}}
	for _, c := range bf {
		if got := pat.BF16Bits(c.f); got != c.bits {
			t.Errorf("BF16Bits(%g) = %#04x, want %#04x", c.f, got, c.bits)
		}
		if pat.BF16Float(c.bits) != pat.RoundTo(pat.BF16, c.f) {
			t.Errorf("BF16Float(%#04x) != RoundTo(%g)", c.bits, c.f)
		}
	}
}

func TestNoDaemon(t *testing.T) {
	dir := t.TempDir()
	nope := filepath.Join(dir, "nope.sock")
	_, err := pat.Connect(pat.Options{Socket: nope, Model: model, MaxBatchTokens: 16})
	pe := wantErrno(t, err, "connect", syscall.ENOENT)
	if !strings.Contains(pe.Msg, "no daemon") {
		t.Errorf("Msg %q does not say no daemon", pe.Msg)
	}
	_, err = pat.GetStatus(nope, 0)
	wantErrno(t, err, "status", syscall.ENOENT)
	_, err = pat.Admin(nope, pat.AdminStatus, 0)
	pe = wantErrno(t, err, "admin", syscall.ENOENT)
	if !strings.Contains(pe.Msg, filepath.Join(dir, "nope.")) { // its admin socket
		t.Errorf("Msg %q does not name the socket", pe.Msg)
	}
	// a socket file nothing listens on, as a crashed patd leaves: ECONNREFUSED at once
	stale := filepath.Join(dir, "stale.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: stale, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()
	t0 := time.Now()
	_, err = pat.Connect(pat.Options{Socket: stale, Model: model, MaxBatchTokens: 16})
	wantErrno(t, err, "connect", syscall.ECONNREFUSED)
	if d := time.Since(t0); d > 2*time.Second {
		t.Errorf("ECONNREFUSED took %v", d)
	}
}

func TestRefusals(t *testing.T) {
	bad := model
	bad.HeadDim = 128
	_, err := pat.Connect(pat.Options{Socket: sock, Model: bad, MaxBatchTokens: 16})
	pe := wantErrno(t, err, "connect", syscall.EMEDIUMTYPE)
	if !strings.Contains(pe.Msg, "model signature mismatch") {
		t.Errorf("Msg %q", pe.Msg)
	}
	// 4096 rows of this model are 6 MiB of staging, past the daemon's 4 MiB budget
	_, err = pat.Connect(pat.Options{Socket: sock, Model: model, MaxBatchTokens: 4096})
	pe = wantErrno(t, err, "connect", syscall.ENOBUFS)
	if !strings.Contains(pe.Msg, "limits.staging_mb") {
		t.Errorf("Msg %q does not name limits.staging_mb", pe.Msg)
	}
	if err := connect(t, pat.Options{KVDtype: pat.F16}).Ping(); err != nil { // its pool: f16
		t.Fatal(err)
	}
	_, err = pat.Connect(pat.Options{Socket: sock, Model: model, MaxBatchTokens: 16,
		KVDtype: pat.FP8E4M3})
	wantErrno(t, err, "connect", syscall.EMEDIUMTYPE)
}

func TestPrefillDecodeChecked(t *testing.T) {
	c := connect(t, pat.Options{})
	info := c.Info()
	if info.OnGPU || info.MaxBatchTokens != 128 || info.KVDtype != pat.F16 || info.KVScale != 1 ||
		info.QRowBytes != 4*64*2 || info.KVRowBytes != 2*64*2 {
		t.Fatalf("info %+v", info)
	}
	if n := len(c.Raw(pat.Q)); n != 128*4*64*2 {
		t.Fatalf("Raw(Q) is %d bytes", n)
	}
	ref := attnref.New(model, 0, 0)
	rng := rand.New(rand.NewSource(5))
	// two prompts sharing their first 32 tokens (two blocks), one in a block of its own
	base := fresh()
	shared := seqRange(base, 32)
	a := open(t, c, append(append([]uint32(nil), shared...), seqRange(base+200, 8)...))
	b := open(t, c, append(append([]uint32(nil), shared...), 7, 8, 9))
	seqs := []*tseq{a, b}
	for step := 0; step < 4; step++ {
		var news [][]uint32
		if step > 0 {
			news = [][]uint32{{uint32(500 + step)}, {uint32(600 + step)}}
		}
		info, worst, err := checkedStep(c, ref, seqs, news, rng)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		if worst > 1 {
			t.Fatalf("step %d: |O - ref| is %.2f x the tolerance", step, worst)
		}
		if !info.Committed || info.LayersDone != model.Layers {
			t.Fatalf("step %d: %+v", step, info)
		}
	}
	st, err := c.Stats()
	if err != nil || st.Steps != 4 || st.Tokens != 40+35+2*3 {
		t.Fatalf("stats %+v %v", st, err)
	}
	// a follower over a's committed prompt: the prefix cache holds its first two blocks
	f := open(t, c, a.toks[:40])
	if f.s.Cached != 32 {
		t.Fatalf("cached %d, want 32", f.s.Cached)
	}
	if _, worst, err := checkedStep(c, ref, []*tseq{f}, nil, rng); err != nil || worst > 1 {
		t.Fatalf("follower: %v, worst %.2f", err, worst)
	}
	// fork shares the committed KV; truncate rolls back, not forward
	child, err := a.s.Fork()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Truncate(10); err != nil {
		t.Fatal(err)
	}
	wantErrno(t, child.Truncate(11), "seq_truncate", syscall.ERANGE)
	for _, s := range []*pat.Seq{a.s, b.s, f.s, child} {
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if n := status(t).Sequences; n != 0 {
		t.Fatalf("%d sequences left open", n)
	}
	poolCheck(t)
}

func TestUnknownSequence(t *testing.T) {
	c := connect(t, pat.Options{})
	pe := wantErrno(t, c.Seq(123456).Close(), "seq_close", syscall.ENOENT)
	if pe.Msg == "" || pe.Error() != "pat seq_close: "+pe.Msg {
		t.Errorf("Error() %q", pe.Error())
	}
	_, err := c.Seq(123456).Fork()
	wantErrno(t, err, "seq_fork", syscall.ENOENT)
	// a step over a sequence the daemon does not hold: the answer comes with Attend, and the
	// step is over (aborted) then
	step, err := c.Begin(pat.Feed{Seq: c.Seq(123456), Tokens: []uint32{1}})
	if err != nil {
		t.Fatal(err)
	}
	wantErrno(t, step.Attend(0), "attend", syscall.ENOENT)
	_, err = step.End()
	wantErrno(t, err, "step_end", syscall.ESRCH)
	if err := step.Close(); err != nil {
		t.Fatal(err)
	}
	s := open(t, c, []uint32{1, 2, 3}) // the session steps on
	if _, worst, err := checkedStep(c, attnref.New(model, 0, 0), []*tseq{s},
		nil, rand.New(rand.NewSource(1))); err != nil || worst > 1 {
		t.Fatalf("%v, worst %.2f", err, worst)
	}
}

func TestStepAbort(t *testing.T) {
	c := connect(t, pat.Options{})
	s := open(t, c, seqRange(fresh(), 20))
	ref, rng := attnref.New(model, 0, 0), rand.New(rand.NewSource(2))
	if _, _, err := checkedStep(c, ref, []*tseq{s}, nil, rng); err != nil {
		t.Fatal(err)
	}
	// Close without End drops the step: the sequence stays 20 long
	step, err := c.Begin(pat.Feed{Seq: s.s, Tokens: []uint32{21}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Begin(pat.Feed{Seq: s.s, Tokens: []uint32{21}})
	wantErrno(t, err, "step_begin", syscall.EBUSY)
	if err := step.Attend(0); err != nil {
		t.Fatal(err)
	}
	if err := step.Close(); err != nil {
		t.Fatal(err)
	}
	wantErrno(t, s.s.Truncate(21), "seq_truncate", syscall.ERANGE)
	// a layer out of order fails and aborts the step: the next Begin is not EBUSY
	step, err = c.Begin(pat.Feed{Seq: s.s, Tokens: []uint32{21}})
	if err != nil {
		t.Fatal(err)
	}
	wantErrno(t, step.Attend(1), "attend", syscall.EINVAL)
	wantErrno(t, step.Attend(0), "attend", syscall.ESRCH)
	// Abort reports the step uncommitted
	step, err = c.Begin(pat.Feed{Seq: s.s, Tokens: []uint32{21}})
	if err != nil {
		t.Fatal(err)
	}
	if err := step.Attend(0); err != nil {
		t.Fatal(err)
	}
	info, err := step.Abort()
	if err != nil || info.Committed {
		t.Fatalf("abort: %+v %v", info, err)
	}
	if err := step.Close(); err != nil { // ended: nothing to do
		t.Fatal(err)
	}
	// End before every layer ran drops the step too (ECANCELED)
	step, err = c.Begin(pat.Feed{Seq: s.s, Tokens: []uint32{21}})
	if err != nil {
		t.Fatal(err)
	}
	if err := step.Attend(0); err != nil {
		t.Fatal(err)
	}
	_, err = step.End()
	wantErrno(t, err, "step_end", syscall.ECANCELED)
	wantErrno(t, s.s.Truncate(21), "seq_truncate", syscall.ERANGE)
	// and a full step commits
	if _, worst, err := checkedStep(c, ref, []*tseq{s}, [][]uint32{{21}}, rng); err != nil || worst > 1 {
		t.Fatalf("%v, worst %.2f", err, worst)
	}
	if err := s.s.Truncate(21); err != nil {
		t.Fatal(err)
	}
	poolCheck(t)
}

func TestArguments(t *testing.T) {
	c := connect(t, pat.Options{MaxBatchTokens: 16})
	other := connect(t, pat.Options{MaxBatchTokens: 16})
	s := open(t, c, []uint32{1, 2, 3})
	_, err := c.Begin()
	wantErrno(t, err, "step_begin", syscall.EINVAL)
	_, err = c.Begin(pat.Feed{Seq: s.s})
	wantErrno(t, err, "step_begin", syscall.EINVAL)
	_, err = other.Begin(pat.Feed{Seq: s.s, Tokens: []uint32{1}})
	wantErrno(t, err, "step_begin", syscall.EINVAL)
	_, err = c.Begin(pat.Feed{Seq: s.s, Tokens: seqRange(1, 17)})
	wantErrno(t, err, "step_begin", syscall.E2BIG)
	_, err = c.OpenSeq(nil)
	wantErrno(t, err, "seq_open", syscall.EINVAL)

	x := []float32{1, 0.1, 70000, float32(math.NaN())}
	row := make([]float32, c.RowLen(pat.K))
	copy(row, x)
	wantErrno(t, c.Put(pat.K, 0, row[:5]), "put", syscall.EINVAL)
	wantErrno(t, c.Put(pat.K, 16, row), "put", syscall.EINVAL)
	wantErrno(t, c.Put(pat.Buffer(7), 0, row), "put", syscall.EINVAL)
	if err := c.Put(pat.K, 15, row); err != nil {
		t.Fatal(err)
	}
	got := make([]float32, len(row))
	if err := c.Get(pat.K, 15, got); err != nil {
		t.Fatal(err)
	}
	if got[0] != 1 || got[1] != pat.F16Float(0x2e66) || !math.IsInf(float64(got[2]), 1) ||
		!math.IsNaN(float64(got[3])) || got[4] != 0 {
		t.Fatalf("Put/Get: %v", got[:5])
	}
	// the row's bytes in Raw, in host order
	raw := c.Raw(pat.K)[15*c.RowLen(pat.K)*2:]
	if raw[0] != 0x00 || raw[1] != 0x3c {
		t.Fatalf("Raw: % x", raw[:2])
	}

	c.Close()
	for op, err := range map[string]error{"ping": c.Ping(), "put": c.Put(pat.K, 0, row),
		"seq_close": s.s.Close()} {
		wantErrno(t, err, op, syscall.EBADF)
	}
	if c.Raw(pat.Q) != nil || c.Close() != nil {
		t.Fatal("a closed Conn")
	}
}

func TestPrefixCacheAndPending(t *testing.T) {
	base := fresh()
	prompt := seqRange(base, 48) // three full blocks
	a := connect(t, pat.Options{})
	s := open(t, a, prompt)
	if s.s.Cached != 0 {
		t.Fatalf("cached %d", s.s.Cached)
	}
	if _, _, err := checkedStep(a, attnref.New(model, 0, 0), []*tseq{s}, nil,
		rand.New(rand.NewSource(3))); err != nil {
		t.Fatal(err)
	}
	b := connect(t, pat.Options{})
	s2, err := b.OpenSeq(prompt)
	if err != nil || s2.Cached != 32 { // at least one token is left to compute
		t.Fatalf("cached %v %v", s2, err)
	}
	s2.Close()

	twin := seqRange(base+100, 40) // two full blocks
	x, err := a.OpenSeqPending(twin)
	if err != nil || x.Cached != 0 || x.Pending != 0 {
		t.Fatalf("%+v %v", x, err)
	}
	y, err := b.OpenSeqPending(twin) // a twin in another session
	if err != nil || y.Cached != 0 || y.Pending != 32 {
		t.Fatalf("%+v %v", y, err)
	}
	y.Close()
	if _, _, err := checkedStep(a, attnref.New(model, 0, 0), []*tseq{{s: x, toks: twin}}, nil,
		rand.New(rand.NewSource(4))); err != nil {
		t.Fatal(err)
	}
	y, err = b.OpenSeqPending(twin) // written now: cached
	if err != nil || y.Cached != 32 || y.Pending != 0 {
		t.Fatalf("%+v %v", y, err)
	}
}

// The prefix cache serves a prompt's blocks with the KV of whoever wrote them first: a
// frontend whose KV for the same token ids differs gets O over the cached KV, not its own.
// The ids are those the Rust example's and the Go example's fixed prompts once were (1000,
// 1001, ...): the daemon keeps another frontend's KV for them after this test, which the
// example run after it by test_go.sh must not read (its token ids are its own).
func TestForeignKV(t *testing.T) {
	prompt := seqRange(1000, 112) // seven blocks
	first := attnref.New(model, 0, 0).Salted(1)
	c := connect(t, pat.Options{})
	a := open(t, c, prompt)
	if _, worst, err := checkedStep(c, first, []*tseq{a}, nil, rand.New(rand.NewSource(7))); err != nil || worst > 1 {
		t.Fatalf("the writer: %v, worst %.2f", err, worst)
	}
	a.s.Close()
	own := attnref.New(model, 0, 0)
	for _, w := range []struct {
		ref      *attnref.Ref
		mismatch bool
	}{{own, true}, {first, false}} {
		b := open(t, c, prompt)
		if b.s.Cached != 96 {
			t.Fatalf("cached %d, want 96", b.s.Cached)
		}
		_, worst, err := checkedStep(c, w.ref, []*tseq{b}, nil, rand.New(rand.NewSource(8)))
		if err != nil || (worst > 1) != w.mismatch {
			t.Fatalf("%v: worst %.2f of the tolerance against %s KV", err, worst,
				map[bool]string{true: "its own", false: "the writer's"}[w.mismatch])
		}
		b.s.Close()
	}
}

func TestStatusAdmin(t *testing.T) {
	c := connect(t, pat.Options{Label: "go-status"})
	s := open(t, c, []uint32{1, 2, 3}) // `seqs` lists sessions with open sequences
	st := status(t)
	if st.Backend != "cpu" || st.Model.HeadDim != 64 || st.Model.Layers != 2 ||
		st.KVDtype != pat.F16 || st.Draining || st.Connections < 1 ||
		math.Abs(float64(st.Scale)-0.125) > 1e-6 || st.Softcap != 0 {
		t.Fatalf("status %+v", st)
	}
	id, start := c.Instance()
	if id != st.Instance || time.Since(start) > time.Hour || time.Until(start) > time.Second {
		t.Fatalf("instance %x started %v; status %x", id, start, st.Instance)
	}
	stats, err := pat.Admin(sock, pat.AdminStats, 0)
	if err != nil || !strings.Contains(stats, "patd_steps_total") {
		t.Fatalf("stats: %v", err)
	}
	seqs, err := pat.Admin(sock, pat.AdminSeqs, 0)
	if err != nil || !strings.Contains(seqs, "go-status") {
		t.Fatalf("seqs: %q %v", seqs, err)
	}
	s.s.Close()
	if pat.DefaultSocket() != sock { // PATD_SOCKET names it
		t.Fatalf("DefaultSocket %q", pat.DefaultSocket())
	}
}

// One Conn shared by goroutines (its mutex serializes libpat's calls), and Conns of their
// own running checked steps side by side.
func TestGoroutines(t *testing.T) {
	shared := connect(t, pat.Options{})
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	ids := make(chan uint32, 8*20)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				s, err := shared.OpenSeq([]uint32{uint32(g), uint32(i), 1, 2})
				if err == nil {
					ids <- s.ID
					err = shared.Ping()
				}
				if err == nil {
					err = s.Close()
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}(g)
	}
	base := fresh()
	for g := 0; g < 3; g++ {
		c := connect(t, pat.Options{})
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			ref, rng := attnref.New(model, 0, 0), rand.New(rand.NewSource(int64(10+g)))
			prompt := seqRange(base+uint32(100*g), 30)
			s, err := c.OpenSeq(prompt)
			if err != nil {
				errs <- err
				return
			}
			q := &tseq{s: s, toks: prompt, n: int(s.Cached)}
			for step := 0; step < 5; step++ {
				var news [][]uint32
				if step > 0 {
					news = [][]uint32{{uint32(step)}}
				}
				if _, worst, err := checkedStep(c, ref, []*tseq{q}, news, rng); err != nil {
					errs <- err
					return
				} else if worst > 1 {
					errs <- fmt.Errorf("goroutine %d step %d: worst %.2f", g, step, worst)
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	close(ids)
	if n := len(ids); n != 8*20 {
		t.Fatalf("%d sequences opened", n)
	}
	poolCheck(t)
}

// writeRows fills Q, K and V of rows [0, n) with small values (the tests below only need the
// daemon to have work).
func writeRows(t *testing.T, c *pat.Conn, n int) {
	t.Helper()
	for _, b := range []pat.Buffer{pat.Q, pat.K, pat.V} {
		x := make([]float32, c.RowLen(b))
		for i := range x {
			x[i] = 0.25
		}
		for r := 0; r < n; r++ {
			if err := c.Put(b, r, x); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// waitStopped waits until every thread of process pid is stopped: SIGSTOP reaches a thread
// that is running a moment after kill returns.
func waitStopped(t *testing.T, pid int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; {
		stats, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
		stopped := err == nil && len(stats) > 0
		for _, p := range stats {
			b, err := os.ReadFile(p)
			i := bytes.LastIndexByte(b, ')') // the state follows the command name
			if err != nil || i < 0 || i+2 >= len(b) || b[i+2] != 'T' {
				stopped = false
				break
			}
		}
		if stopped {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("patd (pid %d) did not stop", pid)
		}
		time.Sleep(time.Millisecond)
	}
}

// A step whose abort gets no answer (the daemon stopped): libpat keeps it open, Close tries the
// abort again, and once the daemon answers the next Begin ends it first and steps on.
func TestStepLeftOpen(t *testing.T) {
	c := connect(t, pat.Options{TimeoutMs: 400})
	s := open(t, c, seqRange(fresh(), 20))
	step, err := c.Begin(pat.Feed{Seq: s.s, Tokens: s.toks})
	if err != nil {
		t.Fatal(err)
	}
	writeRows(t, c, 20)
	if err := step.Attend(0); err != nil { // collects the step's answer
		t.Fatal(err)
	}
	pid := int(status(t).Pid)
	cont := func() {
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
			t.Error(err)
		}
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer cont()
	waitStopped(t, pid)
	wantErrno(t, step.Attend(1), "attend", syscall.ETIMEDOUT) // and its abort: no answer
	wantErrno(t, step.Close(), "step_abort", syscall.ETIMEDOUT)
	wantErrno(t, step.Attend(1), "attend", syscall.ESRCH) // only ending it is left
	cont()
	// the next step ends the one left open first
	ref, rng := attnref.New(model, 0, 0), rand.New(rand.NewSource(6))
	if _, worst, err := checkedStep(c, ref, []*tseq{s}, nil, rng); err != nil || worst > 1 {
		t.Fatalf("%v, worst %.2f", err, worst)
	}
	if err := step.Close(); err != nil { // not its step any more
		t.Fatal(err)
	}
	wantErrno(t, s.s.Truncate(21), "seq_truncate", syscall.ERANGE) // the aborted step left no KV
	if err := s.s.Truncate(20); err != nil {
		t.Fatal(err)
	}
	poolCheck(t)
}

// Conn.AbortStep ends the session's open step whoever holds it; a Step dropped without End or
// Close is ended by the next Begin once the garbage collector has found it.
func TestStepAbandoned(t *testing.T) {
	c := connect(t, pat.Options{})
	s := open(t, c, []uint32{1, 2, 3})
	feed := pat.Feed{Seq: s.s, Tokens: s.toks}
	step, err := c.Begin(feed)
	if err != nil {
		t.Fatal(err)
	}
	if step.Rows() != 3 {
		t.Fatalf("%d rows", step.Rows())
	}
	_, err = c.Begin(feed) // a step held by its Step is not taken away
	wantErrno(t, err, "step_begin", syscall.EBUSY)
	if err := c.AbortStep(); err != nil {
		t.Fatal(err)
	}
	wantErrno(t, step.Attend(0), "attend", syscall.ESRCH)
	if err := c.AbortStep(); err != nil { // none open: nothing to do
		t.Fatal(err)
	}
	func() {
		if _, err := c.Begin(feed); err != nil { // dropped at once
			t.Fatal(err)
		}
	}()
	for i := 0; ; i++ {
		runtime.GC()
		step, err = c.Begin(feed)
		if err == nil {
			break
		}
		wantErrno(t, err, "step_begin", syscall.EBUSY)
		if i == 100 {
			t.Fatal("the dropped step is still open")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := step.Abort(); err != nil {
		t.Fatal(err)
	}
}
