//! Splitting an inline command line into arguments, with the quoting rules of
//! Redis's `sdssplitargs`: `"..."` understands `\n \r \t \b \a \\ \"` and
//! `\xHH`; `'...'` understands `\'`; a closing quote must be followed by a
//! space or the end of the line.

/// Splits `line` into arguments; `None` when quotes are unbalanced.
pub fn split_inline_args(line: &[u8]) -> Option<Vec<Vec<u8>>> {
    let mut args = Vec::new();
    let mut i = 0;
    let at = |i: usize| line.get(i).copied().unwrap_or(0);
    loop {
        while i < line.len() && is_space(line[i]) {
            i += 1;
        }
        if i >= line.len() || line[i] == 0 {
            return Some(args);
        }
        let mut current = Vec::new();
        let (mut in_double, mut in_single) = (false, false);
        loop {
            let c = at(i);
            if in_double {
                if c == b'\\' && at(i + 1) == b'x' && is_hex(at(i + 2)) && is_hex(at(i + 3)) {
                    current.push(hex(at(i + 2)) * 16 + hex(at(i + 3)));
                    i += 3;
                } else if c == b'\\' && i + 1 < line.len() {
                    i += 1;
                    current.push(match line[i] {
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        b'b' => 8,
                        b'a' => 7,
                        other => other,
                    });
                } else if c == b'"' {
                    if i + 1 < line.len() && !is_space(line[i + 1]) {
                        return None;
                    }
                    i += 1;
                    break;
                } else if i >= line.len() {
                    return None;
                } else {
                    current.push(c);
                }
            } else if in_single {
                if c == b'\\' && at(i + 1) == b'\'' {
                    i += 1;
                    current.push(b'\'');
                } else if c == b'\'' {
                    if i + 1 < line.len() && !is_space(line[i + 1]) {
                        return None;
                    }
                    i += 1;
                    break;
                } else if i >= line.len() {
                    return None;
                } else {
                    current.push(c);
                }
            } else {
                match c {
                    b' ' | b'\n' | b'\r' | b'\t' | 0 => break,
                    b'"' => in_double = true,
                    b'\'' => in_single = true,
                    _ => current.push(c),
                }
            }
            i += 1;
        }
        args.push(current);
    }
}

fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c)
}

fn is_hex(b: u8) -> bool {
    b.is_ascii_hexdigit()
}

fn hex(b: u8) -> u8 {
    (b as char).to_digit(16).unwrap_or(0) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(s: &str) -> Option<Vec<String>> {
        split_inline_args(s.as_bytes()).map(|v| {
            v.into_iter()
                .map(|a| String::from_utf8(a).unwrap())
                .collect()
        })
    }

    #[test]
    fn quoting_like_sdssplitargs() {
        assert_eq!(split("set a b").unwrap(), ["set", "a", "b"]);
        assert_eq!(split("  set   a  ").unwrap(), ["set", "a"]);
        assert_eq!(split("a\"b c\"").unwrap(), ["ab c"]);
        assert_eq!(split("\"\\x41\\x4a\"").unwrap(), ["AJ"]);
        assert_eq!(split("'it\\'s'").unwrap(), ["it's"]);
        assert_eq!(split("\"\"").unwrap(), [""]);
        assert_eq!(split("\"a\"b"), None);
        assert_eq!(split("'a'b"), None);
        assert_eq!(split("\"abc"), None);
        assert_eq!(split("'abc"), None);
        assert_eq!(split("").unwrap(), Vec::<String>::new());
    }
}
