// Command patexample is an example frontend of the Go binding: it opens sequences over a
// shared prompt against a running patd, prefills them (the first alone, so the others find
// the prompt in the prefix cache), forks one for a second sample, and decodes a few steps
// over every layer, checking every O row against a float64 reference. It prints one result
// line and exits 1 on a mismatch, 2 on an error.
//
//	patexample [-socket PATH] [-layers 4 -q-heads 8 -kv-heads 2 -head-dim 64 -dtype f16]
//	           [-seqs 4 -prompt 100 -decode 3 -scale S]
//
// The model flags must match the daemon's (patd's defaults are the flags' defaults). K and
// V stand in for a model's: a function of (layer, position, token id), so sequences sharing
// prompt blocks share their KV as the prefix cache assumes; Q is random. A row passes when
// every element is within the dtype's rounding of O plus the daemon's float32 arithmetic
// (attnref.Tol); -scale other than the daemon's softmax scale makes the check fail.
package main

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand"
	"os"

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

func main() {
	socket := flag.String("socket", "", "patd's control socket (default: $PATD_SOCKET, else libpat's default)")
	layers := flag.Uint("layers", 4, "model: layers")
	qHeads := flag.Uint("q-heads", 8, "model: query heads")
	kvHeads := flag.Uint("kv-heads", 2, "model: KV heads")
	headDim := flag.Uint("head-dim", 64, "model: head dimension")
	dtype := flag.String("dtype", "f16", "model: f16 | bf16 | f32")
	nSeqs := flag.Int("seqs", 4, "sequences over the shared prompt")
	promptLen := flag.Int("prompt", 100, "shared prompt tokens")
	decode := flag.Int("decode", 3, "decode steps")
	scale := flag.Float64("scale", 0, "softmax scale of the reference (0: 1/sqrt(head-dim), patd's default)")
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
	dt := map[string]uint32{"f16": pat.F16, "bf16": pat.BF16, "f32": pat.F32}[*dtype]
	if dt == 0 || *nSeqs < 1 || *promptLen < 1 || *decode < 0 {
		flag.Usage()
		os.Exit(2)
	}
	model := pat.Model{Layers: uint32(*layers), QHeads: uint32(*qHeads),
		KVHeads: uint32(*kvHeads), HeadDim: uint32(*headDim), Dtype: dt}
	const suffix = 8 // each request's own tokens after the shared prompt
	c, err := pat.Connect(pat.Options{Socket: *socket, Label: "go-example", Model: model,
		MaxBatchTokens: uint32(*promptLen + suffix*(*nSeqs)), MaxSeqs: uint32(*nSeqs + 1)})
	if err != nil {
		fail(err)
	}
	defer c.Close()
	f := &frontend{c: c, ref: attnref.New(model, *scale), rng: rand.New(rand.NewSource(1))}
	if err := run(f, *nSeqs, *promptLen, suffix, *decode); err != nil {
		c.Close()
		fail(err)
	}
}

func run(f *frontend, nSeqs, promptLen, suffix, decode int) error {
	reqs := make([]*request, nSeqs)
	open := func(i int) error {
		toks := make([]uint32, 0, promptLen+suffix)
		for t := 0; t < promptLen; t++ {
			toks = append(toks, uint32(1000+t))
		}
		for t := 0; t < suffix; t++ {
			toks = append(toks, uint32(100000+1000*i+t))
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
		for i, r := range reqs {
			r.toks = append(r.toks, uint32(500000+1000*i+d))
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
	fmt.Printf("patexample: %d sequences over a %d-token prompt (%d of the followers' prompt "+
		"tokens cached), %d decode steps, %d layers: %d O rows x %d heads checked, worst "+
		"|O - ref| %.3f of the tolerance (%.3g |ref| + %g); decode read %d KV bytes "+
		"(query-centric %d): %s\n", len(reqs), promptLen, cached, decode, m.Layers, f.rows,
		m.QHeads, f.worst, pat.UnitRoundoff(m.Dtype), attnref.FP32Floor, kv, qc, verdict)
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
