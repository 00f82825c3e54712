//! Glob-style pattern matching with Redis's rules (KEYS, SCAN MATCH, CONFIG
//! GET, COMMAND LIST FILTERBY PATTERN): `*`, `?`, `[abc]`, `[^a]`, `[a-z]`,
//! and `\` to escape. An unterminated `[` class ends at the end of the
//! pattern, as in Redis's `stringmatchlen`.
//!
//! Every token but `*` consumes exactly one byte, so the classic matcher that
//! remembers only the last `*` is exact and runs in O(pattern × string) time
//! with no recursion (Redis's recursive matcher can blow up on `a*a*a*...`).

/// Whether `string` matches `pattern`; `nocase` folds ASCII case.
pub fn glob_match(pattern: &[u8], string: &[u8], nocase: bool) -> bool {
    let (mut p, mut s) = (0usize, 0usize);
    // After the last `*` seen: where the pattern resumes, and the string
    // position that `*` has swallowed up to.
    let mut star: Option<(usize, usize)> = None;
    while s < string.len() {
        if p < pattern.len() {
            if pattern[p] == b'*' {
                while p < pattern.len() && pattern[p] == b'*' {
                    p += 1;
                }
                if p == pattern.len() {
                    return true;
                }
                star = Some((p, s));
                continue;
            }
            if let Some(next) = match_one(pattern, p, string[s], nocase) {
                p = next;
                s += 1;
                continue;
            }
        }
        match star {
            Some((sp, ss)) => {
                p = sp;
                s = ss + 1;
                star = Some((sp, ss + 1));
            }
            None => return false,
        }
    }
    pattern[p.min(pattern.len())..].iter().all(|&b| b == b'*')
}

/// Matches the single-byte token at `pattern[p]` against `c`; on success the
/// index of the next token.
fn match_one(pattern: &[u8], p: usize, c: u8, nocase: bool) -> Option<usize> {
    let eq = |a: u8, b: u8| {
        if nocase {
            a.eq_ignore_ascii_case(&b)
        } else {
            a == b
        }
    };
    match pattern[p] {
        b'?' => Some(p + 1),
        b'\\' if p + 1 < pattern.len() => eq(pattern[p + 1], c).then_some(p + 2),
        b'[' => {
            let mut i = p + 1;
            let negate = i < pattern.len() && pattern[i] == b'^';
            if negate {
                i += 1;
            }
            let mut matched = false;
            loop {
                if i >= pattern.len() {
                    break;
                }
                match pattern[i] {
                    b']' => {
                        i += 1;
                        break;
                    }
                    b'\\' if i + 1 < pattern.len() => {
                        matched |= eq(pattern[i + 1], c);
                        i += 2;
                    }
                    lo if i + 2 < pattern.len() && pattern[i + 1] == b'-' => {
                        let hi = pattern[i + 2];
                        let (lo, hi) = if lo > hi { (hi, lo) } else { (lo, hi) };
                        let in_range = |x: u8| lo <= x && x <= hi;
                        matched |= if nocase {
                            in_range(c.to_ascii_lowercase()) || in_range(c.to_ascii_uppercase())
                        } else {
                            in_range(c)
                        };
                        i += 3;
                    }
                    other => {
                        matched |= eq(other, c);
                        i += 1;
                    }
                }
            }
            (matched != negate).then_some(i)
        }
        other => eq(other, c).then_some(p + 1),
    }
}

#[cfg(test)]
mod tests {
    use super::glob_match;

    fn m(p: &str, s: &str) -> bool {
        glob_match(p.as_bytes(), s.as_bytes(), false)
    }

    #[test]
    fn redis_glob_rules() {
        assert!(m("*", ""));
        assert!(m("*", "anything"));
        assert!(m("h?llo", "hello"));
        assert!(!m("h?llo", "hllo"));
        assert!(m("h*llo", "heeeello"));
        assert!(m("h[ae]llo", "hallo"));
        assert!(!m("h[ae]llo", "hillo"));
        assert!(m("h[^e]llo", "hallo"));
        assert!(!m("h[^e]llo", "hello"));
        assert!(m("h[a-b]llo", "hbllo"));
        assert!(m("h[b-a]llo", "hallo"));
        assert!(m("h\\*llo", "h*llo"));
        assert!(!m("h\\*llo", "hallo"));
        assert!(m("key:*:end", "key:1:2:end"));
        assert!(!m("key:*:end", "key:1:2:en"));
        assert!(m("a*b*c", "aXbYc"));
        assert!(!m("a*b*c", "aXbY"));
        assert!(m("[abc", "a"));
        assert!(!m("*[", "x["));
        assert!(glob_match(b"MAX*", b"maxmemory", true));
    }

    #[test]
    fn pathological_pattern_is_fast() {
        let s = "a".repeat(10_000);
        let p = "a*".repeat(50) + "b";
        assert!(!m(&p, &s));
    }
}
