//! INCRBYFLOAT's arithmetic: the x87 80-bit extended precision type (C's
//! `long double` on x86-64 Linux, which Redis uses), in software.
//!
//! Redis parses both numbers with `strtold`, adds them as `long double` and
//! prints the sum with `%.17Lf` minus trailing zeros, so `3.1 + 5.0e3` is
//! `5003.10000000000000009` and `1e308 + 1e308` is finite. An `f64` gives
//! other digits, so clients would see different values than from Redis.
//!
//! A value is `mantissa × 2^exponent` with a 64-bit mantissa. Every
//! operation is done exactly on big integers and rounded once, to nearest
//! with ties to even, as the hardware and glibc do.

use std::cmp::Ordering;

/// Exponent of the lowest mantissa bit of the smallest subnormal.
const MIN_EXP: i64 = -16445;
/// Exponent of the lowest mantissa bit of the largest finite value.
const MAX_EXP: i64 = 16320;

/// A finite or infinite extended-precision value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LongDouble {
    negative: bool,
    /// 0 for zero; `u64::MAX` with `exponent == i64::MAX` for infinity.
    mantissa: u64,
    exponent: i64,
}

/// Why a string is not a valid `long double` for Redis's `string2ld`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotAFloat;

impl LongDouble {
    const fn infinity(negative: bool) -> Self {
        LongDouble {
            negative,
            mantissa: u64::MAX,
            exponent: i64::MAX,
        }
    }

    /// Whether the value is infinite.
    pub fn is_infinite(&self) -> bool {
        self.exponent == i64::MAX
    }

    /// Parses `s` as Redis's `string2ld` does: the whole string must be what
    /// `strtold` reads (decimal or hex, `inf`/`infinity`), without leading
    /// space, shorter than 5120 bytes, not NaN, and not so large or so small
    /// that `strtold` reports a range error with infinity or zero.
    pub fn parse(s: &[u8]) -> Result<LongDouble, NotAFloat> {
        if s.is_empty() || s.len() >= 5120 {
            return Err(NotAFloat);
        }
        let (negative, body) = match s[0] {
            b'-' => (true, &s[1..]),
            b'+' => (false, &s[1..]),
            _ => (false, s),
        };
        let lower = body.to_ascii_lowercase();
        if lower == b"inf" || lower == b"infinity" {
            return Ok(LongDouble::infinity(negative));
        }
        let (value, inexact) = if lower.starts_with(b"0x") {
            parse_hex(&lower[2..])?
        } else {
            parse_decimal(body)?
        };
        let nonzero = !value.0.is_zero();
        let rounded = round(negative, value.0, value.1, inexact);
        // strtold's ERANGE cases that string2ld refuses: overflow to
        // infinity, and a non-zero input that rounded to zero.
        if rounded.is_infinite() || (rounded.mantissa == 0 && nonzero) {
            return Err(NotAFloat);
        }
        Ok(rounded)
    }

    /// `printf("%.17Lf")` with trailing zeros (and a bare point) removed, and
    /// `-0` written `0`: Redis's `ld2string(..., LD_STR_HUMAN)`.
    pub fn to_human_string(self) -> String {
        if self.is_infinite() {
            return if self.negative { "-inf" } else { "inf" }.to_string();
        }
        // round(value × 10^17), ties to even.
        let scaled = Big::from_u64(self.mantissa).mul_small_pow(10, 17);
        let units = if self.exponent >= 0 {
            scaled.shl(self.exponent as usize)
        } else {
            let (mut q, half, rest) = scaled.shr_with_rest((-self.exponent) as usize);
            if half && (rest || q.is_odd()) {
                q = q.add(&Big::from_u64(1));
            }
            q
        };
        let digits = units.to_decimal();
        let digits = format!("{digits:0>18}");
        let (int_part, frac) = digits.split_at(digits.len() - 17);
        let frac = frac.trim_end_matches('0');
        let mut out = String::with_capacity(digits.len() + 2);
        if self.negative {
            out.push('-');
        }
        out.push_str(int_part);
        if !frac.is_empty() {
            out.push('.');
            out.push_str(frac);
        }
        if out == "-0" {
            out.remove(0);
        }
        out
    }
}

impl std::ops::Add for LongDouble {
    type Output = LongDouble;

    /// The exact sum, rounded.
    fn add(self, other: LongDouble) -> LongDouble {
        if self.is_infinite() || other.is_infinite() {
            return if self.is_infinite() { self } else { other };
        }
        if other.mantissa == 0 {
            return if self.mantissa == 0 && self.negative != other.negative {
                LongDouble {
                    negative: false,
                    ..self
                }
            } else {
                self
            };
        }
        if self.mantissa == 0 {
            return other;
        }
        let base = self.exponent.min(other.exponent);
        let a = Big::from_u64(self.mantissa).shl((self.exponent - base) as usize);
        let b = Big::from_u64(other.mantissa).shl((other.exponent - base) as usize);
        if self.negative == other.negative {
            return round(self.negative, a.add(&b), base, false);
        }
        match a.cmp(&b) {
            Ordering::Equal => LongDouble {
                negative: false,
                mantissa: 0,
                exponent: 0,
            },
            Ordering::Greater => round(self.negative, a.sub(&b), base, false),
            Ordering::Less => round(other.negative, b.sub(&a), base, false),
        }
    }
}

/// Rounds `n × 2^exp` (plus a sticky bit below it when `inexact`) to the
/// nearest extended value, ties to even, with subnormals and overflow.
fn round(negative: bool, n: Big, exp: i64, inexact: bool) -> LongDouble {
    let bits = n.bit_len() as i64;
    if bits == 0 {
        return LongDouble {
            negative,
            mantissa: 0,
            exponent: 0,
        };
    }
    let top = exp + bits - 1;
    if top > MAX_EXP + 63 {
        return LongDouble::infinity(negative);
    }
    // The exponent the result's lowest mantissa bit will have.
    let mut e = (top - 63).max(MIN_EXP);
    let shift = e - exp;
    let mantissa = if shift <= 0 {
        n.shl((-shift) as usize).to_u64()
    } else {
        let (q, half, rest) = n.shr_with_rest(shift as usize);
        let mut m = q.to_u64();
        if half && (rest || inexact || m & 1 == 1) {
            m = m.wrapping_add(1);
            if m == 0 {
                // Carried out of 64 bits.
                m = 1 << 63;
                e += 1;
            }
        }
        m
    };
    if e > MAX_EXP {
        return LongDouble::infinity(negative);
    }
    if mantissa == 0 {
        e = 0;
    }
    LongDouble {
        negative,
        mantissa,
        exponent: e,
    }
}

/// Decimal digits with an optional point and exponent, exactly as a big
/// integer times a power of two (plus whether bits were lost below it).
fn parse_decimal(s: &[u8]) -> Result<((Big, i64), bool), NotAFloat> {
    let mut i = 0;
    let mut digits: Vec<u8> = Vec::new();
    let mut seen_digit = false;
    let mut frac_digits: i64 = 0;
    while i < s.len() && s[i].is_ascii_digit() {
        digits.push(s[i] - b'0');
        seen_digit = true;
        i += 1;
    }
    if i < s.len() && s[i] == b'.' {
        i += 1;
        while i < s.len() && s[i].is_ascii_digit() {
            digits.push(s[i] - b'0');
            frac_digits += 1;
            seen_digit = true;
            i += 1;
        }
    }
    if !seen_digit {
        return Err(NotAFloat);
    }
    let mut exp10: i64 = 0;
    if i < s.len() && (s[i] == b'e' || s[i] == b'E') {
        i += 1;
        let negative = sign(s, &mut i);
        let start = i;
        while i < s.len() && s[i].is_ascii_digit() {
            exp10 = (exp10 * 10 + (s[i] - b'0') as i64).min(1_000_000);
            i += 1;
        }
        if i == start {
            return Err(NotAFloat);
        }
        if negative {
            exp10 = -exp10;
        }
    }
    if i != s.len() {
        return Err(NotAFloat);
    }
    let first = digits.iter().position(|&d| d != 0).unwrap_or(digits.len());
    let digits = &digits[first..];
    let mut k = exp10 - frac_digits;
    // Trailing zeros only scale.
    let last = digits.iter().rposition(|&d| d != 0).map_or(0, |p| p + 1);
    k += (digits.len() - last) as i64;
    let digits = &digits[..last];
    if digits.is_empty() {
        return Ok(((Big::zero(), 0), false));
    }
    let magnitude = digits.len() as i64 + k; // value < 10^magnitude
    if magnitude > 4934 {
        return Ok(((Big::from_u64(1), MAX_EXP + 200), false));
    }
    if magnitude < -4952 {
        return Ok(((Big::from_u64(1), MIN_EXP - 200), false));
    }
    let mut n = Big::zero();
    for chunk in digits.chunks(9) {
        let mut v = 0u32;
        for &d in chunk {
            v = v * 10 + d as u32;
        }
        n = n
            .mul_small(10u32.pow(chunk.len() as u32))
            .add(&Big::from_u64(v as u64));
    }
    if k >= 0 {
        return Ok(((n.mul_small_pow(5, k as u32), k), false));
    }
    // n / 10^q = (n × 2^s / 5^q) × 2^-(s+q), with s chosen so that the
    // quotient keeps at least 66 significant bits.
    let q = (-k) as u32;
    let five_bits = (q as f64 * std::f64::consts::LOG2_10 - q as f64).ceil() as i64 + 1;
    let s = (five_bits - n.bit_len() as i64 + 66).max(0);
    let (quotient, inexact) = n.shl(s as usize).div_small_pow(5, q);
    Ok(((quotient, -(s + q as i64)), inexact))
}

/// Hex digits (after `0x`) with an optional point and `p` exponent.
fn parse_hex(s: &[u8]) -> Result<((Big, i64), bool), NotAFloat> {
    let mut i = 0;
    let mut n = Big::zero();
    let mut seen_digit = false;
    let mut exp2: i64 = 0;
    let mut in_fraction = false;
    while i < s.len() {
        let c = s[i];
        if c == b'.' && !in_fraction {
            in_fraction = true;
        } else if let Some(d) = (c as char).to_digit(16) {
            seen_digit = true;
            if n.bit_len() < 20_000 {
                n = n.mul_small(16).add(&Big::from_u64(d as u64));
                if in_fraction {
                    exp2 -= 4;
                }
            } else if !in_fraction {
                exp2 += 4;
            }
        } else {
            break;
        }
        i += 1;
    }
    if !seen_digit {
        return Err(NotAFloat);
    }
    if i < s.len() && s[i] == b'p' {
        i += 1;
        let negative = sign(s, &mut i);
        let start = i;
        let mut p: i64 = 0;
        while i < s.len() && s[i].is_ascii_digit() {
            p = (p * 10 + (s[i] - b'0') as i64).min(1_000_000);
            i += 1;
        }
        if i == start {
            return Err(NotAFloat);
        }
        exp2 += if negative { -p } else { p };
    }
    if i != s.len() {
        return Err(NotAFloat);
    }
    let bits = n.bit_len() as i64;
    if bits != 0 && bits + exp2 > MAX_EXP + 200 {
        return Ok(((Big::from_u64(1), MAX_EXP + 200), false));
    }
    if bits != 0 && bits + exp2 < MIN_EXP - 200 {
        return Ok(((Big::from_u64(1), MIN_EXP - 200), false));
    }
    Ok(((n, exp2), false))
}

/// A minimal unsigned big integer (little-endian 32-bit limbs).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Big(Vec<u32>);

impl Big {
    fn zero() -> Big {
        Big(Vec::new())
    }

    fn from_u64(v: u64) -> Big {
        let mut b = Big(vec![v as u32, (v >> 32) as u32]);
        b.trim();
        b
    }

    fn trim(&mut self) {
        while self.0.last() == Some(&0) {
            self.0.pop();
        }
    }

    fn is_zero(&self) -> bool {
        self.0.is_empty()
    }

    fn is_odd(&self) -> bool {
        self.0.first().is_some_and(|l| l & 1 == 1)
    }

    fn bit_len(&self) -> usize {
        match self.0.last() {
            None => 0,
            Some(top) => self.0.len() * 32 - top.leading_zeros() as usize,
        }
    }

    fn bit(&self, i: usize) -> bool {
        self.0.get(i / 32).is_some_and(|l| (l >> (i % 32)) & 1 == 1)
    }

    /// The low 64 bits.
    fn to_u64(&self) -> u64 {
        let lo = self.0.first().copied().unwrap_or(0) as u64;
        let hi = self.0.get(1).copied().unwrap_or(0) as u64;
        lo | hi << 32
    }

    fn shl(&self, bits: usize) -> Big {
        if self.is_zero() {
            return Big::zero();
        }
        let (limbs, rem) = (bits / 32, bits % 32);
        let mut out = vec![0u32; limbs];
        let mut carry = 0u32;
        for &l in &self.0 {
            if rem == 0 {
                out.push(l);
            } else {
                out.push(l << rem | carry);
                carry = l >> (32 - rem);
            }
        }
        out.push(carry);
        let mut b = Big(out);
        b.trim();
        b
    }

    /// `self >> bits`, the bit just below the cut, and whether any bit
    /// further below is set.
    fn shr_with_rest(&self, bits: usize) -> (Big, bool, bool) {
        let half = bits > 0 && self.bit(bits - 1);
        let rest = bits > 1 && (0..bits - 1).any(|i| i / 32 < self.0.len() && self.bit(i));
        let (limbs, rem) = (bits / 32, bits % 32);
        if limbs >= self.0.len() {
            return (Big::zero(), half, rest);
        }
        let src = &self.0[limbs..];
        let mut out = Vec::with_capacity(src.len());
        for i in 0..src.len() {
            let lo = src[i] as u64;
            let hi = src.get(i + 1).copied().unwrap_or(0) as u64;
            out.push(((lo | hi << 32) >> rem) as u32);
        }
        let mut b = Big(out);
        b.trim();
        (b, half, rest)
    }

    fn add(&self, other: &Big) -> Big {
        let mut out = Vec::with_capacity(self.0.len().max(other.0.len()) + 1);
        let mut carry = 0u64;
        for i in 0..self.0.len().max(other.0.len()) {
            let s = self.0.get(i).copied().unwrap_or(0) as u64
                + other.0.get(i).copied().unwrap_or(0) as u64
                + carry;
            out.push(s as u32);
            carry = s >> 32;
        }
        out.push(carry as u32);
        let mut b = Big(out);
        b.trim();
        b
    }

    /// `self - other`; `self` must not be smaller.
    fn sub(&self, other: &Big) -> Big {
        let mut out = Vec::with_capacity(self.0.len());
        let mut borrow = 0i64;
        for i in 0..self.0.len() {
            let mut d = self.0[i] as i64 - other.0.get(i).copied().unwrap_or(0) as i64 - borrow;
            borrow = 0;
            if d < 0 {
                d += 1 << 32;
                borrow = 1;
            }
            out.push(d as u32);
        }
        let mut b = Big(out);
        b.trim();
        b
    }

    fn mul_small(&self, m: u32) -> Big {
        let mut out = Vec::with_capacity(self.0.len() + 1);
        let mut carry = 0u64;
        for &l in &self.0 {
            let p = l as u64 * m as u64 + carry;
            out.push(p as u32);
            carry = p >> 32;
        }
        out.push(carry as u32);
        let mut b = Big(out);
        b.trim();
        b
    }

    /// `self × base^power` for a small base.
    fn mul_small_pow(&self, base: u32, mut power: u32) -> Big {
        let (chunk, chunk_power) = largest_power(base);
        let mut b = self.clone();
        while power >= chunk_power {
            b = b.mul_small(chunk);
            power -= chunk_power;
        }
        b.mul_small(base.pow(power))
    }

    /// `self / d` and the remainder.
    fn div_small(&self, d: u32) -> (Big, u32) {
        let mut out = vec![0u32; self.0.len()];
        let mut rem = 0u64;
        for i in (0..self.0.len()).rev() {
            let cur = rem << 32 | self.0[i] as u64;
            out[i] = (cur / d as u64) as u32;
            rem = cur % d as u64;
        }
        let mut b = Big(out);
        b.trim();
        (b, rem as u32)
    }

    /// `floor(self / base^power)` and whether it was inexact.
    fn div_small_pow(&self, base: u32, mut power: u32) -> (Big, bool) {
        let (chunk, chunk_power) = largest_power(base);
        let mut b = self.clone();
        let mut inexact = false;
        while power > 0 {
            let step = power.min(chunk_power);
            let d = if step == chunk_power {
                chunk
            } else {
                base.pow(step)
            };
            let (q, r) = b.div_small(d);
            inexact |= r != 0;
            b = q;
            power -= step;
        }
        (b, inexact)
    }

    fn to_decimal(&self) -> String {
        if self.is_zero() {
            return "0".to_string();
        }
        let mut parts = Vec::new();
        let mut b = self.clone();
        while !b.is_zero() {
            let (q, r) = b.div_small(1_000_000_000);
            parts.push(r);
            b = q;
        }
        let mut out = parts.pop().map(|p| p.to_string()).unwrap_or_default();
        for p in parts.iter().rev() {
            out.push_str(&format!("{p:09}"));
        }
        out
    }
}

impl PartialOrd for Big {
    fn partial_cmp(&self, other: &Big) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Big {
    fn cmp(&self, other: &Big) -> Ordering {
        self.0
            .len()
            .cmp(&other.0.len())
            .then_with(|| self.0.iter().rev().cmp(other.0.iter().rev()))
    }
}

/// The largest power of `base` that fits a `u32`, and its exponent.
fn largest_power(base: u32) -> (u32, u32) {
    let (mut value, mut power) = (base, 1);
    while let Some(next) = value.checked_mul(base) {
        value = next;
        power += 1;
    }
    (value, power)
}

/// An exponent's sign at `s[*i]` (`-` or `+`, skipped): whether it is
/// negative.
fn sign(s: &[u8], i: &mut usize) -> bool {
    match s.get(*i) {
        Some(b'-') => {
            *i += 1;
            true
        }
        Some(b'+') => {
            *i += 1;
            false
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn incr(current: &str, by: &str) -> String {
        let a = LongDouble::parse(current.as_bytes()).unwrap();
        let b = LongDouble::parse(by.as_bytes()).unwrap();
        (a + b).to_human_string()
    }

    #[test]
    fn sums_like_redis_on_x86_64() {
        // Replies of redis-server 7.0 on x86-64 Linux.
        assert_eq!(incr("0", "1.5"), "1.5");
        assert_eq!(incr("3.1", "5.0e3"), "5003.10000000000000009");
        assert_eq!(incr("0", "1.23456789012345678901"), "1.23456789012345679");
        assert_eq!(
            incr("0", "123456789.123456789"),
            "123456789.12345678899873747"
        );
        assert_eq!(
            incr("12345678901234567890123", "0"),
            "12345678901234567889920"
        );
        assert_eq!(incr("-9223372036854775808", "1"), "-9223372036854775807");
        assert_eq!(incr("10.50", "0"), "10.5");
        assert_eq!(incr("-1.25", "1.25"), "0");
        assert_eq!(incr("0", "-0"), "0");
        assert_eq!(incr("0", "0x10"), "16");
        assert_eq!(incr("0", "1e-20"), "0");
        assert_eq!(incr("3", "0.1"), "3.1");
        assert!(incr("0", "1e308").starts_with("99999999999999999996685879655845645660"));
        assert!(incr("1e308", "1e308").starts_with("19999999999999999999337175931169129132"));
    }

    #[test]
    fn parses_like_string2ld() {
        for ok in [
            "1",
            "-1",
            "+1",
            "1.",
            ".5",
            "1e3",
            "1E+3",
            "0x1p-2",
            "0X.8",
            "inf",
            "-Infinity",
            "1e4000",
            "1e-4940",
        ] {
            assert!(LongDouble::parse(ok.as_bytes()).is_ok(), "{ok}");
        }
        for bad in [
            "", " 1", "1 ", "nan", "1e", "1e+", ".", "-", "0x", "1_0", "abc", "1e5000", "1e-5000",
            "0x1p",
        ] {
            assert_eq!(LongDouble::parse(bad.as_bytes()), Err(NotAFloat), "{bad}");
        }
        assert!(LongDouble::parse(b"inf").unwrap().is_infinite());
        let huge = LongDouble::parse(b"1e4932").unwrap();
        assert!((huge + huge).is_infinite());
    }
}
