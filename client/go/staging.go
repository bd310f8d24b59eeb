package pat

/*
#include "pat.h"
*/
import "C"

import (
	"math"
	"syscall"
	"unsafe"
)

// Buffer names one of a session's staging buffers. Each holds MaxBatchTokens rows; a row
// is one token's heads x head_dim elements of the model's dtype (Q and O: QHeads heads,
// K and V: KVHeads), the rows of a step in the order of its feeds.
type Buffer int

const (
	Q Buffer = iota
	K
	V
	O
)

var bufferNames = [...]string{"Q", "K", "V", "O"}

func (b Buffer) String() string {
	if b < Q || b > O {
		return "Buffer(?)"
	}
	return bufferNames[b]
}

// staging holds typed views of a host session's shared buffers (none for a GPU session).
type staging struct {
	dtype  uint32
	rows   int
	rowLen [4]int // elements per row
	raw    [4][]byte
	h16    [4][]uint16  // F16, BF16
	f32    [4][]float32 // F32
}

func (s *staging) init(m Model, b *C.pat_buffers_t) {
	s.dtype = m.Dtype
	s.rows = int(b.max_batch_tokens)
	ptrs := [4]unsafe.Pointer{b.q, b.k, b.v, b.o}
	for i, p := range ptrs {
		heads := m.QHeads
		if Buffer(i) == K || Buffer(i) == V {
			heads = m.KVHeads
		}
		s.rowLen[i] = int(heads * m.HeadDim)
		n := s.rows * s.rowLen[i]
		if m.Dtype == F32 {
			s.f32[i] = unsafe.Slice((*float32)(p), n)
			s.raw[i] = unsafe.Slice((*byte)(p), 4*n)
		} else {
			s.h16[i] = unsafe.Slice((*uint16)(p), n)
			s.raw[i] = unsafe.Slice((*byte)(p), 2*n)
		}
	}
}

// Raw is buffer b's memory itself (writing it hands data to the daemon), MaxBatchTokens
// rows of the model's dtype in host byte order; nil for a GPU session or a closed Conn.
// Valid until Close.
func (c *Conn) Raw(b Buffer) []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.h == nil || c.st.rows == 0 || b < Q || b > O {
		return nil
	}
	return c.st.raw[b]
}

// RowLen is the number of elements of one row of b: heads x head_dim.
func (c *Conn) RowLen(b Buffer) int {
	heads := c.model.QHeads
	if b == K || b == V {
		heads = c.model.KVHeads
	}
	return int(heads * c.model.HeadDim)
}

// row checks an access to row of b with n values; the caller holds the lock.
func (c *Conn) row(op string, b Buffer, row, n int) error {
	switch {
	case c.h == nil:
		return argError(op, syscall.EBADF, "the Conn is closed")
	case c.info.OnGPU:
		return argError(op, syscall.ENOTSUP, "a GPU session's staging is device memory")
	case b < Q || b > O:
		return argError(op, syscall.EINVAL, "no buffer %d", int(b))
	case row < 0 || row >= c.st.rows:
		return argError(op, syscall.EINVAL, "row %d of %d", row, c.st.rows)
	case n != c.st.rowLen[b]:
		return argError(op, syscall.EINVAL, "%d values for a %s row of %d", n, b, c.st.rowLen[b])
	}
	return nil
}

// Put writes one row of b from x (RowLen(b) values), converted to the model's dtype
// (rounded to nearest even).
func (c *Conn) Put(b Buffer, row int, x []float32) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.row("put", b, row, len(x)); err != nil {
		return err
	}
	off := row * len(x)
	switch c.st.dtype {
	case F32:
		copy(c.st.f32[b][off:off+len(x)], x)
	case BF16:
		dst := c.st.h16[b][off : off+len(x)]
		for i, v := range x {
			dst[i] = BF16Bits(v)
		}
	default:
		dst := c.st.h16[b][off : off+len(x)]
		for i, v := range x {
			dst[i] = F16Bits(v)
		}
	}
	return nil
}

// Get reads one row of b into dst (RowLen(b) values).
func (c *Conn) Get(b Buffer, row int, dst []float32) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.row("get", b, row, len(dst)); err != nil {
		return err
	}
	off := row * len(dst)
	switch c.st.dtype {
	case F32:
		copy(dst, c.st.f32[b][off:off+len(dst)])
	case BF16:
		for i, w := range c.st.h16[b][off : off+len(dst)] {
			dst[i] = BF16Float(w)
		}
	default:
		for i, w := range c.st.h16[b][off : off+len(dst)] {
			dst[i] = F16Float(w)
		}
	}
	return nil
}

// F16Bits is f as an IEEE binary16, rounded to nearest even (overflow to infinity, NaN
// kept quiet).
func F16Bits(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23) & 0xff
	man := b & 0x7fffff
	if exp == 0xff {
		if man != 0 {
			return sign | 0x7e00 | uint16(man>>13)
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15 // binary16's biased exponent
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 { // a binary16 subnormal (units of 2^-24) or zero
		if e < -10 {
			return sign // below half the smallest subnormal
		}
		m := man | 0x800000
		shift := uint(14 - e)
		h := m >> shift
		rem, half := m&(1<<shift-1), uint32(1)<<(shift-1)
		if rem > half || (rem == half && h&1 == 1) {
			h++
		}
		return sign | uint16(h)
	}
	h := uint32(e)<<10 | man>>13
	if rem := man & 0x1fff; rem > 0x1000 || (rem == 0x1000 && h&1 == 1) {
		h++ // a carry into the exponent is right, up to infinity
	}
	return sign | uint16(h)
}

// F16Float is the binary16 h as a float32 (exact).
func F16Float(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	man := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	case exp == 0:
		f := float32(man) / (1 << 24)
		if sign != 0 {
			f = -f
		}
		return f
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | man<<13)
}

// BF16Bits is f as a bfloat16, rounded to nearest even (NaN kept quiet).
func BF16Bits(f float32) uint16 {
	u := math.Float32bits(f)
	if f != f {
		return uint16(u>>16) | 0x40
	}
	return uint16((u + 0x7fff + (u>>16)&1) >> 16)
}

// BF16Float is the bfloat16 w as a float32 (exact).
func BF16Float(w uint16) float32 { return math.Float32frombits(uint32(w) << 16) }

// RoundTo is x as dtype (F16, BF16, F32) would hold it: what Put stores and Get reads back.
func RoundTo(dtype uint32, x float32) float32 {
	switch dtype {
	case F32:
		return x
	case BF16:
		return BF16Float(BF16Bits(x))
	}
	return F16Float(F16Bits(x))
}

// UnitRoundoff is the largest relative error of rounding to dtype to nearest: 2^-11 for
// F16, 2^-8 for BF16, 2^-24 for F32.
func UnitRoundoff(dtype uint32) float64 {
	switch dtype {
	case F32:
		return 0x1p-24
	case BF16:
		return 0x1p-8
	}
	return 0x1p-11
}
