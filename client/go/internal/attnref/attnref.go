// Package attnref is what the binding's tests and example check patd's O against: float64
// attention over a sequence's logical KV, and a stand-in model for that KV. K and V of a
// token are a function of (layer, position, token id), as a real model's are of the prefix,
// so sequences that share prompt blocks through the prefix cache attend over the same KV
// whichever of them wrote it.
package attnref

import (
	"math"
	"math/rand"

	"patd.dev/pat"
)

// FP32Floor bounds the daemon's float32 arithmetic in |O - ref|: its sums over n positions
// of p*v with sum(p) = 1 and |v| <= 1 err by at most n * 2^-24, under 1e-4 up to 1600
// positions (the tests' contexts stay under 200).
const FP32Floor = 1e-4

type kvKey struct{ layer, pos, tok uint32 }

// Ref is the reference for one model signature.
type Ref struct {
	m       pat.Model
	scale   float64
	softcap float64
	salt    uint64
	kv      map[kvKey][2][]float32
}

// New is the reference of model m with softmax scale (0: 1/sqrt(head_dim), patd's default)
// and logit soft cap (0: off), as patd's model.scale and model.softcap (GetStatus reports
// both).
func New(m pat.Model, scale, softcap float64) *Ref {
	if m.Dtype == 0 {
		m.Dtype = pat.F16
	}
	if scale == 0 {
		scale = 1 / math.Sqrt(float64(m.HeadDim))
	}
	return &Ref{m: m, scale: scale, softcap: softcap, kv: map[kvKey][2][]float32{}}
}

// Salted is r with another stand-in model: its KV for the same tokens differs, as another
// frontend's would.
func (r *Ref) Salted(salt uint64) *Ref {
	return &Ref{m: r.m, scale: r.scale, softcap: r.softcap, salt: salt,
		kv: map[kvKey][2][]float32{}}
}

// mix is splitmix64's finalizer: a well-spread 64-bit hash of x.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// KV is the K and V row (KVHeads x HeadDim values, uniform in [-1, 1), held exactly by the
// model's dtype) of token tok at position pos in layer.
func (r *Ref) KV(layer, pos, tok uint32) (k, v []float32) {
	key := kvKey{layer, pos, tok}
	if e, ok := r.kv[key]; ok {
		return e[0], e[1]
	}
	n := int(r.m.KVHeads * r.m.HeadDim)
	s := mix(mix(mix(r.salt^uint64(layer))^uint64(pos)) ^ uint64(tok))
	k, v = make([]float32, n), make([]float32, n)
	for _, row := range [2][]float32{k, v} {
		for i := range row {
			s = mix(s)
			row[i] = pat.RoundTo(r.m.Dtype, float32(float64(s>>11)/(1<<53)*2-1))
		}
	}
	r.kv[key] = [2][]float32{k, v}
	return k, v
}

// Rand fills x with uniform values in [-1, 1) held exactly by the model's dtype.
func (r *Ref) Rand(rng *rand.Rand, x []float32) {
	for i := range x {
		x[i] = pat.RoundTo(r.m.Dtype, rng.Float32()*2-1)
	}
}

// Out is O of query row q (QHeads x HeadDim) of the token at position pos of a sequence
// whose tokens are toks: per head, softmax(cap(scale * q . K[0..pos])) V[0..pos] in float64,
// each query head over KV head h / (QHeads / KVHeads); cap(s) is softcap * tanh(s / softcap),
// or s when softcap is 0.
func (r *Ref) Out(layer uint32, toks []uint32, pos int, q []float32) []float64 {
	d, group := int(r.m.HeadDim), int(r.m.QHeads/r.m.KVHeads)
	out := make([]float64, len(q))
	s := make([]float64, pos+1)
	for h := 0; h < int(r.m.QHeads); h++ {
		qh, kvo := q[h*d:(h+1)*d], h/group*d
		mx := math.Inf(-1)
		for j := 0; j <= pos; j++ {
			k, _ := r.KV(layer, uint32(j), toks[j])
			dot := 0.0
			for x, qx := range qh {
				dot += float64(qx) * float64(k[kvo+x])
			}
			s[j] = dot * r.scale
			if r.softcap > 0 {
				s[j] = r.softcap * math.Tanh(s[j]/r.softcap)
			}
			mx = math.Max(mx, s[j])
		}
		sum := 0.0
		for j := range s {
			s[j] = math.Exp(s[j] - mx)
			sum += s[j]
		}
		oh := out[h*d : (h+1)*d]
		for j, p := range s {
			_, v := r.KV(layer, uint32(j), toks[j])
			for x := range oh {
				oh[x] += p / sum * float64(v[kvo+x])
			}
		}
	}
	return out
}

// Tol is the largest |O - ref| accepted where the reference is ref: O's rounding to the
// model's dtype (its unit roundoff times |ref|) plus FP32Floor.
func (r *Ref) Tol(ref float64) float64 {
	return pat.UnitRoundoff(r.m.Dtype)*math.Abs(ref) + FP32Floor
}

// Worst is the largest |got - ref| / Tol(ref) over a row: at most 1 passes; NaN counts as
// infinitely wrong.
func (r *Ref) Worst(got []float32, ref []float64) float64 {
	w := 0.0
	for i, g := range got {
		e := math.Abs(float64(g)-ref[i]) / r.Tol(ref[i])
		if e != e {
			return math.Inf(1)
		}
		w = math.Max(w, e)
	}
	return w
}
