// Command patexample is an example frontend of the Go binding: it opens sequences over a
// shared prompt against a running patd, prefills them (the first alone, so the others find
// the prompt in the prefix cache), forks one for a second sample, and decodes a few steps
// over every layer, checking every O row against a float64 reference. It prints one result
// line and exits 1 on a mismatch, 2 on an error.
//
//	patexample [-socket PATH] [-seqs 4 -prompt 100 -decode 3] [-token-base N]
//	           [-scale S] [-softcap C]
//
// The model signature, softmax scale and logit soft cap are the daemon's (GetStatus). K and V
// stand in for a model's: a function of (layer, position, token id), so sequences sharing
// prompt blocks share their KV as the prefix cache assumes; Q is random. A row passes when
// every element is within the dtype's rounding of O plus the daemon's float32 arithmetic
// (attnref.Tol); -scale or -softcap other than the daemon's makes the check fail.
//
// The check assumes that the cached prompt blocks hold this stand-in KV. patd's prefix cache
// serves a prompt's blocks to every session of the same model and prefix scope (the same user,
// unless pool.prefix_scope = all) that sends the same token ids, with the KV of whoever wrote
// them first: another frontend on the daemon that used these ids (the Rust example, a test, a
// real model) would make the check fail. So every token id of a run is its token base plus an
// offset under 2^30, the base drawn per run from the pid and the time in [2e9, 3e9), a range
// of this example's own (the Rust example's lies below it), and printed; -token-base pins it
// (a run with the base of an earlier one finds its own KV cached, which checks the same).
package main

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand"
	"os"
	"time"

	"patd.dev/pat"
	"patd.dev/pat/internal/attnref"
)

// request is one sequence: its tokens (prompt, then decoded) and how many are committed.
type request struct {
	seq  *pat.Seq
	toks []uint32
	done int
}

type frontend struct {
	c     *pat.Conn
	ref   *attnref.Ref
	rng   *rand.Rand
	rows  int     // O rows checked
	worst float64 // the largest |O - ref| / tolerance seen
	next  uint32  // the next fresh token id (past the prompt)
}

// token is a token id no other of the run's sequences has.
func (f *frontend) token() uint32 {
	f.next++
	return f.next - 1
}

// step feeds every request its uncommitted tokens: per layer it writes each row's Q, K and
// V, attends, and checks the row's O against the reference.
func (f *frontend) step(reqs []*request) (pat.StepInfo, error) {
	type row struct {
		r   *request
		pos int
	}
	var feeds []pat.Feed
	var rows []row
	for _, r := range reqs {
		feeds = append(feeds, pat.Feed{Seq: r.seq, Tokens: r.toks[r.done:]})
		for p := r.done; p < len(r.toks); p++ {
			rows = append(rows, row{r, p})
		}
	}
	step, err := f.c.Begin(feeds...)
	if err != nil {
		return pat.StepInfo{}, err
	}
	defer step.Close() // aborts the step on an early return
	q := make([][]float32, len(rows))
	for i := range q {
		q[i] = make([]float32, f.c.RowLen(pat.Q))
	}
	o := make([]float32, f.c.RowLen(pat.O))
	for layer := uint32(0); layer < f.c.Model().Layers; layer++ {
		for i, w := range rows {
			f.ref.Rand(f.rng, q[i])
			k, v := f.ref.KV(layer, uint32(w.pos), w.r.toks[w.pos])
			for _, err := range []error{f.c.Put(pat.Q, i, q[i]), f.c.Put(pat.K, i, k),
				f.c.Put(pat.V, i, v)} {
				if err != nil {
					return pat.StepInfo{}, err
				}
			}
		}
		if err := step.Attend(layer); err != nil {
			return pat.StepInfo{}, err
		}
		for i, w := range rows {
			if err := f.c.Get(pat.O, i, o); err != nil {
				return pat.StepInfo{}, err
			}
			f.worst = math.Max(f.worst, f.ref.Worst(o, f.ref.Out(layer, w.r.toks, w.pos, q[i])))
			f.rows++
		}
	}
	info, err := step.End()
	if err != nil {
		return info, err
	}
	for _, r := range reqs {
		r.done = len(r.toks)
	}
	return info, nil
}

// Where a drawn token base lies, and the most token ids past it a run uses.
const (
	tokenBaseLo   = 2_000_000_000
	tokenBaseSpan = 1_000_000_000
	tokenWindow   = 1 << 30
)

// drawTokenBase is a token base of this run's own, from the pid and the time.
func drawTokenBase() uint32 {
	x := uint64(time.Now().UnixNano()) ^ uint64(os.Getpid())<<40
	x = (x ^ x>>31) * 0x9e3779b97f4a7c15 // spread the low bits that differ between runs
	return tokenBaseLo + uint32((x>>32)%tokenBaseSpan)
}

func main() {
	socket := flag.String("socket", "", "patd's control socket (default: $PATD_SOCKET, else libpat's default)")
	nSeqs := flag.Int("seqs", 4, "sequences over the shared prompt")
	promptLen := flag.Int("prompt", 100, "shared prompt tokens")
	decode := flag.Int("decode", 3, "decode steps")
	tokenBase := flag.Uint64("token-base", 0, "first prompt token id (0: drawn per run in [2e9, 3e9))")
	scale := flag.Float64("scale", 0, "softmax scale of the reference (0: the daemon's)")
	softcap := flag.Float64("softcap", -1, "logit soft cap of the reference (0: off; -1: the daemon's)")
	version := flag.Bool("version", false, "print the binding's and the loaded libpat's versions, and exit")
	flag.Parse()
	if *version {
		fmt.Printf("pat binding %s (pat.h), libpat %s (loaded)\n",
			pat.VersionString(pat.Version), pat.VersionString(pat.LibraryVersion()))
		if err := pat.CheckVersion(); err != nil {
			fail(err)
		}
		return
	}
	const suffix = 8 // each request's own tokens after the shared prompt
	// ids past the base: the prompt, the suffixes, the decode steps' tokens
	window := uint64(*promptLen) + uint64(*nSeqs)*suffix + uint64(*decode)*uint64(*nSeqs+1)
	if *nSeqs < 1 || *nSeqs > 1<<16 || *promptLen < 1 || *promptLen > 1<<24 || *decode < 0 ||
		*decode > 1<<16 || window > tokenWindow || *tokenBase+window > math.MaxUint32 ||
		*scale < 0 || (*softcap < 0 && *softcap != -1) {
		flag.Usage()
		os.Exit(2)
	}
	base := uint32(*tokenBase)
	if base == 0 {
		base = drawTokenBase()
	}
	st, err := pat.GetStatus(*socket, 0)
	if err != nil {
		fail(err)
	}
	if *scale == 0 {
		*scale = float64(st.Scale) // 0 from a daemon that does not say: 1/sqrt(head_dim)
	}
	if *softcap == -1 {
		*softcap = float64(st.Softcap)
	}
	// rows: the first request's prefill, the followers' (their whole prompt where little is
	// cached), a decode step's one per request and the fork
	rows := uint64(*promptLen + suffix)
	if r := uint64(*nSeqs-1) * uint64(*promptLen+suffix); r > rows {
		rows = r
	}
	if uint64(*nSeqs+1) > rows {
		rows = uint64(*nSeqs + 1)
	}
	if rows > math.MaxUint32 {
		fail(fmt.Errorf("%d sequences over a %d-token prompt need %d staging rows", *nSeqs,
			*promptLen, rows))
	}
	// KVDtype: the reference holds K and V as the model's dtype, not an fp8 pool's
	c, err := pat.Connect(pat.Options{Socket: *socket, Label: "go-example", Model: st.Model,
		MaxBatchTokens: uint32(rows), MaxSeqs: uint32(*nSeqs + 1), KVDtype: st.Model.Dtype})
	if err != nil {
		fail(err)
	}
	defer c.Close()
	f := &frontend{c: c, ref: attnref.New(c.Model(), *scale, *softcap),
		rng: rand.New(rand.NewSource(1)), next: base + uint32(*promptLen)}
	if err := run(f, *nSeqs, *promptLen, suffix, *decode, base); err != nil {
		c.Close()
		fail(err)
	}
}

func run(f *frontend, nSeqs, promptLen, suffix, decode int, base uint32) error {
	reqs := make([]*request, nSeqs)
	open := func(i int) error {
		toks := make([]uint32, 0, promptLen+suffix)
		for t := 0; t < promptLen; t++ {
			toks = append(toks, base+uint32(t))
		}
		for t := 0; t < suffix; t++ {
			toks = append(toks, f.token())
		}
		s, err := f.c.OpenSeq(toks)
		if err != nil {
			return err
		}
		reqs[i] = &request{seq: s, toks: toks, done: int(s.Cached)}
		return nil
	}
	// the first request prefills the prompt alone; the others then find it in the cache
	if err := open(0); err != nil {
		return err
	}
	if _, err := f.step(reqs[:1]); err != nil {
		return err
	}
	cached := 0
	for i := 1; i < nSeqs; i++ {
		if err := open(i); err != nil {
			return err
		}
		cached += int(reqs[i].seq.Cached)
	}
	if nSeqs > 1 {
		if _, err := f.step(reqs[1:]); err != nil {
			return err
		}
	}
	// a second sample of the first request shares its KV
	child, err := reqs[0].seq.Fork()
	if err != nil {
		return err
	}
	reqs = append(reqs, &request{seq: child, toks: append([]uint32(nil), reqs[0].toks...),
		done: reqs[0].done})
	var kv, qc uint64
	for d := 0; d < decode; d++ {
		for _, r := range reqs {
			r.toks = append(r.toks, f.token())
		}
		info, err := f.step(reqs)
		if err != nil {
			return err
		}
		kv, qc = kv+info.KVBytes, qc+info.QCBytes
	}
	for _, r := range reqs {
		if err := r.seq.Close(); err != nil {
			return err
		}
	}
	m := f.c.Model()
	verdict := "ok"
	if f.worst > 1 {
		verdict = "MISMATCH"
	}
	fmt.Printf("patexample: %d sequences over a %d-token prompt from token %d (%d of the "+
		"followers' prompt tokens cached), %d decode steps, %d layers: %d O rows x %d heads "+
		"checked, worst |O - ref| %.3f of the tolerance (%.3g |ref| + %g); decode read %d KV "+
		"bytes (query-centric %d): %s\n", len(reqs), promptLen, base, cached, decode,
		m.Layers, f.rows, m.QHeads, f.worst, pat.UnitRoundoff(m.Dtype), attnref.FP32Floor, kv,
		qc, verdict)
	if f.worst > 1 {
		f.c.Close()
		os.Exit(1)
	}
	return nil
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "patexample:", err)
	var pe *pat.Error
	if errors.As(err, &pe) {
		fmt.Fprintf(os.Stderr, "patexample: errno %d (%v)\n", int(pe.Errno), pe.Errno)
	}
	os.Exit(2)
}
