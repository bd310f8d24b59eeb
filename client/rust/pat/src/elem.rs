//! The staging buffers' element types. std has no f16 or bf16 (and this crate takes no
//! dependencies), so a 16-bit model's buffers are slices of `u16` words, converted with the
//! functions here (IEEE binary16 and bfloat16, round to nearest even); an f32 model's are `f32`.
use crate::Dtype;

mod sealed {
    pub trait Sealed {}
    impl Sealed for u16 {}
    impl Sealed for f32 {}
}

/// A type a staging buffer can be viewed as: `u16` for [`Dtype::F16`] and [`Dtype::Bf16`]
/// (the raw words), `f32` for [`Dtype::F32`].
pub trait Element: Copy + sealed::Sealed + 'static {
    /// whether buffers of a model of `dtype` hold this type
    fn holds(dtype: Dtype) -> bool;
}

impl Element for u16 {
    fn holds(dtype: Dtype) -> bool {
        matches!(dtype, Dtype::F16 | Dtype::Bf16)
    }
}

impl Element for f32 {
    fn holds(dtype: Dtype) -> bool {
        dtype == Dtype::F32
    }
}

/// Rounds `m` (an integer significand) right by `shift` bits, to nearest, ties to even.
fn round_shift(m: u32, shift: u32) -> u32 {
    let q = m >> shift;
    let rem = m & ((1u32 << shift) - 1);
    let half = 1u32 << (shift - 1);
    if rem > half || (rem == half && q & 1 == 1) {
        q + 1
    } else {
        q
    }
}

/// f32 to IEEE binary16, rounded to nearest even: overflow gives an infinity, tiny values
/// subnormals or a signed zero, a NaN stays a (quiet) NaN.
pub fn f32_to_f16(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let man = b & 0x7f_ffff;
    if exp == 0xff {
        return sign
            | 0x7c00
            | if man != 0 {
                0x200 | (man >> 13) as u16
            } else {
                0
            };
    }
    // binary16's biased exponent: f32's bias is 127, binary16's 15
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        // subnormal: |x| = m 2^(exp - 150) = (m >> (14 - e)) units of 2^-24; below 2^-25
        // (e < -10) even the smallest one is more than twice |x| away
        if e < -10 {
            return sign;
        }
        let m = man | 0x80_0000;
        // a carry to 0x400 is the smallest normal: the encoding runs on
        return sign | round_shift(m, (14 - e) as u32) as u16;
    }
    // a carry out of the 10 mantissa bits increments the exponent (to infinity at the top)
    sign | round_shift((e as u32) << 23 | man, 13) as u16
}

/// IEEE binary16 to f32 (exact).
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h & 0x8000) as u32) << 16;
    let e = ((h >> 10) & 0x1f) as u32;
    let m = (h & 0x3ff) as u32;
    match e {
        // m units of 2^-24, exact in f32
        0 => f32::from_bits(sign | (m as f32 * f32::from_bits((127 - 24) << 23)).to_bits()),
        0x1f => f32::from_bits(sign | 0x7f80_0000 | m << 13),
        _ => f32::from_bits(sign | (e + 127 - 15) << 23 | m << 13),
    }
}

/// f32 to bfloat16, rounded to nearest even; a NaN stays a (quiet) NaN.
pub fn f32_to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    (((b as u64) + 0x7fff + ((b as u64 >> 16) & 1)) >> 16) as u16
}

/// bfloat16 to f32 (exact).
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_known_values() {
        let cases: &[(f32, u16)] = &[
            (0.0, 0x0000),
            (-0.0, 0x8000),
            (1.0, 0x3c00),
            (-2.0, 0xc000),
            (0.333_333_34, 0x3555),
            (65504.0, 0x7bff), // the largest finite
            (65520.0, 0x7c00), // halfway to 2^16: ties to even, which is infinity
            (65519.99, 0x7bff),
            (1e10, 0x7c00),
            (f32::INFINITY, 0x7c00),
            (6.103_515_6e-5, 0x0400), // 2^-14, the smallest normal
            (5.960_464_5e-8, 0x0001), // 2^-24, the smallest subnormal
            (2.980_232_2e-8, 0x0000), // 2^-25: halfway, ties to even (zero)
            (4.470_348_4e-8, 0x0001), // 1.5 * 2^-25
            (1e-10, 0x0000),
        ];
        for &(x, h) in cases {
            assert_eq!(f32_to_f16(x), h, "{:e}", x);
        }
        assert!(f16_to_f32(f32_to_f16(f32::NAN)).is_nan());
    }

    /// Every binary16 value survives the round trip, and every point halfway between two
    /// neighbours rounds to the even one (just off it: to the nearer one).
    #[test]
    fn f16_exhaustive() {
        for h in 0..=u16::MAX {
            let x = f16_to_f32(h);
            if x.is_nan() {
                assert!(h & 0x7c00 == 0x7c00 && h & 0x3ff != 0);
                assert!(f16_to_f32(f32_to_f16(x)).is_nan());
                continue;
            }
            assert_eq!(f32_to_f16(x), h, "{:#06x}", h);
            let next = h.wrapping_add(1);
            if h & 0x7fff >= 0x7bff || next & 0x7fff == 0 {
                continue; // no finite neighbour above
            }
            let y = f16_to_f32(next);
            // exact in f32: the midpoint needs 12 significant bits
            let mid = ((x as f64 + y as f64) / 2.0) as f32;
            let even = if h & 1 == 0 { h } else { next };
            assert_eq!(f32_to_f16(mid), even, "mid {:#06x}", h);
            let toward_y = f32::from_bits(mid.to_bits() + 1); // one f32 ulp from mid, away from 0
            assert_eq!(f32_to_f16(toward_y), next, "above mid {:#06x}", h);
            let toward_x = f32::from_bits(mid.to_bits() - 1);
            assert_eq!(f32_to_f16(toward_x), h, "below mid {:#06x}", h);
        }
    }

    #[test]
    fn bf16_round_trip() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80); // tie: even
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82); // tie: even
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
        for h in (0..=u16::MAX).step_by(7) {
            let x = bf16_to_f32(h);
            if !x.is_nan() {
                assert_eq!(f32_to_bf16(x), h);
            }
        }
    }
}
