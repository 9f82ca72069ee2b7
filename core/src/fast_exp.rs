//! `exp` for f32 without a branch or a library call, so a loop over it vectorises (libm's `expf`
//! is a call per value, which keeps exp, sigmoid, silu, the GELUs and softmax scalar).
//!
//! The method is the classic one (Cephes' `expf`): `exp(x) = 2^n * exp(r)` with `n` the nearest
//! integer to `x / ln 2` and `|r| <= ln 2 / 2`, `exp(r)` from a degree-7 polynomial. Within 2 ulp
//! of the exact value over the whole range, subnormal results and overflow to infinity included.

/// `1.5 * 2^23`: adding it rounds an f32 in (-2^22, 2^22) to the nearest integer (ties to even)
/// and leaves that integer in the low mantissa bits; no call to `round`, which is a library call
/// on baseline x86-64.
const ROUND: f32 = 12_582_912.0;

/// exp(x), to within 2 ulp; NaN stays NaN, +inf gives +inf, -inf gives 0.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    // Beyond these bounds the result is +inf or 0 anyway; clamping keeps n in range for the
    // exponent arithmetic below (a NaN is put back at the end).
    let (e, n) = reduced::<false>(x.clamp(-104.0, 89.0));
    // 2^n as two factors 2^h * 2^(n-h), each a normal number for n in [-150, 129]: a single
    // factor would overflow the exponent field at the ends, where the product is subnormal or inf.
    let h = n >> 1;
    let s1 = f32::from_bits(((h + 127) as u32) << 23);
    let s2 = f32::from_bits(((n - h + 127) as u32) << 23);
    let y = e * s1 * s2;
    if x.is_nan() { x } else { y }
}

/// exp(x) for `x` in [-87, 0], where the result is a normal float, to within 2 ulp; NaN stays
/// NaN. [`exp`] without its clamp and its two-factor scale, which only the range's ends need: a
/// softmax's exponentials, whose arguments are at most 0 and floored at -87. Without `FUSED`,
/// [`exp`]'s bits; with it, each multiply-add of the reduction and the polynomial is one rounding
/// (`f32::mul_add`), for a loop compiled with FMA, where the chain of dependent operations per
/// value is about half as long (elsewhere `mul_add` is a library call).
#[inline(always)]
pub fn exp_normal_with<const FUSED: bool>(x: f32) -> f32 {
    let (e, n) = reduced::<FUSED>(x);
    // n in [-126, 0]: 2^n is one normal factor.
    e * f32::from_bits((n.wrapping_add(127) as u32) << 23)
}

/// `a * b + c`: one rounding when `FUSED`, two otherwise.
#[inline(always)]
fn madd<const FUSED: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FUSED { a.mul_add(b, c) } else { a * b + c }
}

/// `(exp(r), n)` with `x = n ln 2 + r`, `n` the nearest integer to `x / ln 2`, for `x` inside
/// (-2^22 ln 2, 2^22 ln 2) or NaN.
#[inline(always)]
fn reduced<const FUSED: bool>(x: f32) -> (f32, i32) {
    let z = madd::<FUSED>(x, std::f32::consts::LOG2_E, ROUND);
    let n = z - ROUND;
    // x - n ln 2 in two parts (ln 2 = C1 + C2, C1 exact in few bits), so the product n * C1 is exact.
    let r = if FUSED {
        n.mul_add(2.121_944_4e-4, (-n).mul_add(0.693_359_4, x))
    } else {
        (x - n * 0.693_359_4) + n * 2.121_944_4e-4
    };
    let p = 1.987_569_1e-4;
    let p = madd::<FUSED>(p, r, 1.398_199_9e-3);
    let p = madd::<FUSED>(p, r, 8.333_452e-3);
    let p = madd::<FUSED>(p, r, 4.166_579_6e-2);
    let p = madd::<FUSED>(p, r, 0.166_666_65);
    let p = madd::<FUSED>(p, r, 0.5);
    let e = madd::<FUSED>(p * r, r, r) + 1.0;
    (e, (z.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32))
}

#[cfg(test)]
mod tests {
    use super::{exp, exp_normal_with};

    fn ulps(a: f32, b: f32) -> u32 {
        if a == b {
            return 0;
        }
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
    }

    /// Every 97th f32 from -104 to 89 (about 20 million values, subnormal results included) is
    /// within 2 ulp of the f64 exp rounded to f32.
    #[test]
    fn within_two_ulp_over_the_range() {
        let (lo, hi) = ((-104.0f32).to_bits(), 89.0f32.to_bits());
        let mut worst = (0, 0.0f32);
        // Negative floats have bits above 0x8000_0000, ordered by magnitude; walk both halves.
        let negs = (0x8000_0000u32..=lo).step_by(97);
        let poss = (0u32..=hi).step_by(97);
        for bits in negs.chain(poss) {
            let x = f32::from_bits(bits);
            let want = (x as f64).exp() as f32;
            let u = ulps(exp(x), want);
            if u > worst.0 {
                worst = (u, x);
            }
        }
        assert!(worst.0 <= 2, "exp({}) is {} ulp off", worst.1, worst.0);
    }

    /// Every 7th f32 from -87 to 0 has exp's bits with the shortcut, and NaN stays NaN.
    #[test]
    fn exp_normal_is_exp_over_its_range() {
        let lo = (-87.0f32).to_bits();
        for bits in (0x8000_0000u32..=lo).step_by(7).chain([0, lo]) {
            let x = f32::from_bits(bits);
            assert_eq!(exp_normal_with::<false>(x).to_bits(), exp(x).to_bits(), "exp_normal({x})");
        }
        assert!(exp_normal_with::<false>(f32::NAN).is_nan());
    }

    /// With fused multiply-adds, every 13th f32 from -87 to 0 is within 2 ulp of the f64 exp
    /// rounded to f32, and NaN stays NaN.
    #[test]
    fn fused_exp_normal_within_two_ulp() {
        let lo = (-87.0f32).to_bits();
        for bits in (0x8000_0000u32..=lo).step_by(13).chain([0, lo]) {
            let x = f32::from_bits(bits);
            let u = ulps(exp_normal_with::<true>(x), (x as f64).exp() as f32);
            assert!(u <= 2, "exp_normal_with::<true>({x}) is {u} ulp off");
        }
        assert!(exp_normal_with::<true>(f32::NAN).is_nan());
    }

    #[test]
    fn ends_and_nan() {
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp(89.0), f32::INFINITY);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-104.0), 0.0);
        assert!(exp(f32::NAN).is_nan());
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(88.72), (88.72f32 as f64).exp() as f32);
    }
}
