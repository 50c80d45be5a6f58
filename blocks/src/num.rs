//! Exact numbers for predicates and metadata values.
//!
//! A number is a signed fixed-point decimal: an `i128` counting units of 10^-18. That covers
//! every 64-bit integer (signed and unsigned: |x| < 1.7 * 10^20) and decimals with up to 18
//! fractional digits, all compared exactly: `0.1` is exactly one tenth, and the integers
//! 9007199254740993 and 9007199254740992 (which collapse to one `f64`) stay distinct. Decimal
//! text with more fractional digits, out-of-range magnitudes, NaN and infinities are rejected
//! with an error instead of being rounded. An `f64` is converted through its shortest decimal
//! representation (what `{}` prints), so `0.1_f64` becomes exactly `0.1`.

use std::fmt;

/// Fractional digits kept exactly.
pub const SCALE_DIGITS: u32 = 18;
const SCALE: i128 = 1_000_000_000_000_000_000;
/// Largest magnitude of the integer part (keeps `int * SCALE` inside `i128`).
const MAX_INT: u128 = (i128::MAX / SCALE) as u128;

/// An exact decimal number (see the module docs for the representation).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Num(i128);

/// Why a number was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NumError {
    #[error("not a number: {0:?}")]
    Syntax(String),
    #[error("NaN and infinities are not allowed")]
    NotFinite,
    #[error("more than {SCALE_DIGITS} fractional digits in {0:?} cannot be represented exactly")]
    TooPrecise(String),
    #[error("{0:?} is out of range (magnitude must stay below 1.7e20)")]
    OutOfRange(String),
}

impl Num {
    /// Zero.
    pub const ZERO: Num = Num(0);

    /// The raw fixed-point units (10^-18 each); stable, used by data images.
    pub fn to_raw(self) -> i128 {
        self.0
    }

    /// Rebuilds a number from [`Num::to_raw`].
    pub fn from_raw(raw: i128) -> Num {
        Num(raw)
    }

    /// The integer part if the number is integral, for compact storage.
    pub fn as_i64(self) -> Option<i64> {
        // a float estimate checked by one multiplication: a 128-bit division is a library
        // call, and a shard build asks this of every bound (20 million at W1). Below 2^50
        // the estimate of an integral number is exact (its error is under 0.3), so a
        // failed check means the number is not integral.
        // (the float made from the two halves: `i128 as f64` is a library call too)
        let float =
            (self.0 >> 64) as i64 as f64 * 18_446_744_073_709_551_616.0 + self.0 as u64 as f64;
        let est = (float / SCALE as f64).round();
        if est.abs() < (1u64 << 50) as f64 {
            let q = est as i64;
            return (i128::from(q) * SCALE == self.0).then_some(q);
        }
        if self.0 % SCALE == 0 {
            i64::try_from(self.0 / SCALE).ok()
        } else {
            None
        }
    }

    /// The largest integer not above the number.
    pub fn floor_int(self) -> i128 {
        self.0.div_euclid(SCALE)
    }

    /// Converts an `f64` exactly via its shortest decimal representation.
    pub fn from_f64(v: f64) -> Result<Num, NumError> {
        if !v.is_finite() {
            return Err(NumError::NotFinite);
        }
        // `{:?}` never uses exponent-free forms for huge values, `{}` always does: use `{}`.
        Num::parse(&format!("{v}"))
    }

    /// An approximate `f64`, for estimates and display only (never for comparisons).
    pub fn to_f64(self) -> f64 {
        self.0 as f64 / SCALE as f64
    }

    /// Parses decimal text: optional sign, digits, optional fraction, optional exponent.
    pub fn parse(text: &str) -> Result<Num, NumError> {
        let s = text.trim();
        let lower = s.to_ascii_lowercase();
        let body = lower.trim_start_matches(['+', '-']);
        if matches!(body, "nan" | "inf" | "infinity") {
            return Err(NumError::NotFinite);
        }
        let bytes = s.as_bytes();
        let mut i = 0;
        let neg = match bytes.first() {
            Some(b'-') => {
                i = 1;
                true
            }
            Some(b'+') => {
                i = 1;
                false
            }
            _ => false,
        };
        let mut digits: Vec<u8> = Vec::with_capacity(s.len());
        let mut frac_len: i64 = 0;
        let mut seen_digit = false;
        let mut seen_dot = false;
        while i < bytes.len() {
            match bytes[i] {
                c @ b'0'..=b'9' => {
                    digits.push(c - b'0');
                    seen_digit = true;
                    if seen_dot {
                        frac_len += 1;
                    }
                }
                b'.' if !seen_dot => seen_dot = true,
                b'e' | b'E' => break,
                _ => return Err(NumError::Syntax(crate::quote::clip(text))),
            }
            i += 1;
        }
        if !seen_digit {
            return Err(NumError::Syntax(crate::quote::clip(text)));
        }
        let mut exp: i64 = 0;
        if i < bytes.len() {
            // exponent
            let e = &s[i + 1..];
            exp = e
                .parse::<i64>()
                .map_err(|_| NumError::Syntax(crate::quote::clip(text)))?;
            if exp.abs() > 1000 {
                return Err(NumError::OutOfRange(crate::quote::clip(text)));
            }
        }
        // value = digits * 10^(exp - frac_len); we want units of 10^-18.
        let shift = exp - frac_len + SCALE_DIGITS as i64;
        // strip leading zeros to bound work
        let first = digits.iter().position(|&d| d != 0).unwrap_or(digits.len());
        let digits = &digits[first..];
        let mut keep = digits.len() as i64 + shift.min(0);
        if keep < 0 {
            keep = 0;
        }
        // digits dropped by a negative shift must be zeros
        if digits[keep as usize..].iter().any(|&d| d != 0) {
            return Err(NumError::TooPrecise(crate::quote::clip(text)));
        }
        let mut acc: i128 = 0;
        for &d in &digits[..keep as usize] {
            acc = acc
                .checked_mul(10)
                .and_then(|a| a.checked_add(d as i128))
                .ok_or_else(|| NumError::OutOfRange(crate::quote::clip(text)))?;
        }
        for _ in 0..shift.max(0) {
            if acc == 0 {
                break;
            }
            acc = acc
                .checked_mul(10)
                .ok_or_else(|| NumError::OutOfRange(crate::quote::clip(text)))?;
        }
        let int_part = (acc / SCALE).unsigned_abs();
        if int_part > MAX_INT {
            return Err(NumError::OutOfRange(crate::quote::clip(text)));
        }
        Ok(Num(if neg { -acc } else { acc }))
    }
}

impl From<i64> for Num {
    fn from(v: i64) -> Num {
        Num(v as i128 * SCALE)
    }
}

impl From<u64> for Num {
    fn from(v: u64) -> Num {
        Num(v as i128 * SCALE)
    }
}

impl From<i32> for Num {
    fn from(v: i32) -> Num {
        Num::from(v as i64)
    }
}

impl std::str::FromStr for Num {
    type Err = NumError;
    fn from_str(s: &str) -> Result<Num, NumError> {
        Num::parse(s)
    }
}

impl fmt::Display for Num {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let neg = self.0 < 0;
        let abs = self.0.unsigned_abs();
        let int = abs / SCALE as u128;
        let frac = abs % SCALE as u128;
        if neg {
            f.write_str("-")?;
        }
        write!(f, "{int}")?;
        if frac != 0 {
            let s = format!("{frac:018}");
            write!(f, ".{}", s.trim_end_matches('0'))?;
        }
        Ok(())
    }
}

impl fmt::Debug for Num {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> Num {
        Num::parse(s).expect(s)
    }

    #[test]
    fn parses_and_prints() {
        for (input, out) in [
            ("0", "0"),
            ("-0", "0"),
            ("42", "42"),
            ("-17.250", "-17.25"),
            ("0.1", "0.1"),
            ("1e3", "1000"),
            ("1.5E-3", "0.0015"),
            ("+7", "7"),
            ("9223372036854775807", "9223372036854775807"),
            ("18446744073709551615", "18446744073709551615"),
            ("0.000000000000000001", "0.000000000000000001"),
            ("1.10e-17", "0.000000000000000011"),
            ("100e-2", "1"),
        ] {
            assert_eq!(n(input).to_string(), out, "{input}");
        }
    }

    #[test]
    fn rejects() {
        assert_eq!(Num::parse("NaN"), Err(NumError::NotFinite));
        assert_eq!(Num::parse("-inf"), Err(NumError::NotFinite));
        assert!(matches!(Num::parse(""), Err(NumError::Syntax(_))));
        assert!(matches!(Num::parse("1.2.3"), Err(NumError::Syntax(_))));
        assert!(matches!(Num::parse("0x10"), Err(NumError::Syntax(_))));
        assert!(matches!(
            Num::parse("0.0000000000000000001"),
            Err(NumError::TooPrecise(_))
        ));
        assert!(matches!(Num::parse("1e30"), Err(NumError::OutOfRange(_))));
        assert!(matches!(Num::from_f64(f64::NAN), Err(NumError::NotFinite)));
    }

    #[test]
    fn exact_ordering() {
        // these collapse to one f64
        assert!(n("9007199254740993") > n("9007199254740992"));
        assert!(n("9223372036854775807") > n("9223372036854775806"));
        assert!(n("0.1") + 0 == n("0.10"));
        assert!(n("0.30000000000000001") > n("0.3"));
        assert_eq!(Num::from_f64(0.1).expect("finite"), n("0.1"));
        assert_eq!(Num::from(-5i64), n("-5"));
        assert_eq!(n("12").as_i64(), Some(12));
        assert_eq!(n("12.5").as_i64(), None);
    }

    /// The estimate's answer is the division's, around every edge it has: the smallest
    /// fractions, the 2^50 switch to the division, the ends of `i64`.
    #[test]
    fn as_i64_agrees_with_the_division() {
        let exact = |x: Num| {
            if x.0 % SCALE == 0 {
                i64::try_from(x.0 / SCALE).ok()
            } else {
                None
            }
        };
        let mut raws: Vec<i128> = vec![0, 1, -1, SCALE - 1, SCALE + 1, -SCALE - 1];
        for k in [
            1i128,
            12,
            -7,
            i32::MAX as i128,
            i32::MIN as i128,
            (1 << 50) - 1,
            1 << 50,
            (1 << 50) + 1,
            (1 << 53) + 1,
            i64::MAX as i128,
            i64::MIN as i128,
            i64::MAX as i128 + 1,
            i64::MIN as i128 - 1,
        ] {
            for d in [-1, 0, 1] {
                raws.push(k * SCALE + d);
                raws.push(-k * SCALE + d);
            }
        }
        // and a seeded spread of magnitudes
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let k = (x >> (x % 64)) as i64 as i128;
            let d = [0i128, 1, -1, (x % 1000) as i128][(x % 4) as usize];
            raws.push(k * SCALE + d);
        }
        for r in raws {
            assert_eq!(Num(r).as_i64(), exact(Num(r)), "raw {r}");
        }
    }

    impl std::ops::Add<i32> for Num {
        type Output = Num;
        fn add(self, rhs: i32) -> Num {
            Num(self.0 + rhs as i128 * SCALE)
        }
    }
}
