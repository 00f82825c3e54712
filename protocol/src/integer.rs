//! Integers in requests and replies, parsed as Redis parses them.

/// Parses an integer exactly as Redis's `string2ll` does: an optional `-`,
/// then digits without leading zeros (`0` alone is fine), nothing else, and it
/// must fit an `i64`. `" 1"`, `"+1"`, `"01"` and `"1.0"` are all rejected.
pub fn parse_i64_strict(s: &[u8]) -> Option<i64> {
    if s.is_empty() || s.len() > 20 {
        return None;
    }
    if s == b"0" {
        return Some(0);
    }
    let (negative, digits) = match s[0] {
        b'-' => (true, &s[1..]),
        _ => (false, s),
    };
    if digits.is_empty() || !(b'1'..=b'9').contains(&digits[0]) {
        return None;
    }
    let mut value: u64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        value = value.checked_mul(10)?.checked_add((d - b'0') as u64)?;
    }
    if negative {
        if value > i64::MAX as u64 + 1 {
            None
        } else {
            Some((value as i64).wrapping_neg())
        }
    } else {
        i64::try_from(value).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::parse_i64_strict as p;

    #[test]
    fn integers_like_string2ll() {
        assert_eq!(p(b"0"), Some(0));
        assert_eq!(p(b"-1"), Some(-1));
        assert_eq!(p(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(p(b"-9223372036854775808"), Some(i64::MIN));
        assert_eq!(p(b"9223372036854775808"), None);
        for bad in [
            &b""[..],
            b"-",
            b"-0",
            b"01",
            b"+1",
            b" 1",
            b"1 ",
            b"1.0",
            b"abc",
        ] {
            assert_eq!(p(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
