//! What the load is made of: verifiable values without per-request
//! allocation, key choosers (uniform, Zipf, Gaussian), and a cheap RNG.

use bytes::Bytes;

/// xorshift64*: fast, good enough for choosing keys.
#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed (any value).
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [0, n).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }
}

/// FNV-1a, to place a key's value in the pool.
pub fn hash(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// A block of pseudo-random bytes from which every value is a slice: the
/// value of key `k` with length `n` starts at an offset derived from `k`.
/// Writing costs no allocation (a `Bytes` slice), and any fetched value can be
/// compared byte for byte with what must have been stored under that key.
pub struct ValuePool {
    pool: Bytes,
}

/// The largest value a benchmark makes: a server's default
/// `proto-max-bulk-len` (Redis's and kvtier's), so a size past it is a
/// mistake in the flags, refused before anything is allocated.
pub const MAX_VALUE: usize = 512 << 20;

/// `len` if a value of that size can be sent, else what is wrong with it
/// (`what` names where the size came from).
pub fn value_size(len: usize, what: &str) -> Result<usize, String> {
    if len > MAX_VALUE {
        return Err(format!(
            "{what}: a value of {len} bytes is over {} MiB, the most a server takes \
             (proto-max-bulk-len)",
            MAX_VALUE >> 20
        ));
    }
    Ok(len)
}

impl ValuePool {
    /// A pool able to serve values of up to `max_len` bytes (`Err` when no
    /// server would take a value that long, [`value_size`]).
    pub fn new(max_len: usize, what: &str) -> Result<ValuePool, String> {
        let max_len = value_size(max_len, what)?;
        let len = max_len + 4 * 1024 * 1024;
        let mut v = vec![0u8; len];
        let mut rng = Rng::new(0x6b76_7469_6572);
        for chunk in v.chunks_mut(8) {
            let bytes = rng.next_u64().to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
        Ok(ValuePool {
            pool: Bytes::from(v),
        })
    }

    /// The value stored under `key` when it is `len` bytes long.
    pub fn value(&self, key: &[u8], len: usize) -> Bytes {
        let room = (self.pool.len() - len) as u64 + 1;
        let start = (hash(key) % room) as usize;
        self.pool.slice(start..start + len)
    }

    /// Whether `got` is exactly the value of `key` with length `len`.
    pub fn verify(&self, key: &[u8], len: usize, got: &[u8]) -> bool {
        got.len() == len && self.value(key, len)[..] == *got
    }
}

/// How keys are picked.
#[derive(Clone)]
pub enum KeyChooser {
    /// Every key equally likely.
    Uniform { keys: u64 },
    /// Rank r with probability ∝ 1/r^s (rejection-inversion sampling, so
    /// no table even for millions of keys).
    Zipf(Zipf),
    /// Around the middle of the key space with the given standard deviation.
    Gaussian { keys: u64, sigma: f64 },
}

impl KeyChooser {
    /// Index of the next key, in [0, keys).
    pub fn next(&self, rng: &mut Rng) -> u64 {
        match self {
            KeyChooser::Uniform { keys } => rng.below(*keys),
            KeyChooser::Zipf(z) => z.sample(rng) - 1,
            KeyChooser::Gaussian { keys, sigma } => {
                // Box–Muller.
                let (u1, u2) = (rng.next_f64().max(f64::MIN_POSITIVE), rng.next_f64());
                let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
                let x = *keys as f64 / 2.0 + z * sigma;
                x.clamp(0.0, *keys as f64 - 1.0) as u64
            }
        }
    }

    /// A short description for reports.
    pub fn describe(&self) -> String {
        match self {
            KeyChooser::Uniform { keys } => format!("uniform over {keys} keys"),
            KeyChooser::Zipf(z) => format!("zipf s={} over {} keys", z.exponent, z.n),
            KeyChooser::Gaussian { keys, sigma } => {
                format!("gaussian sigma={sigma:.0} over {keys} keys")
            }
        }
    }
}

/// Zipf over ranks 1..=n (Hörmann & Derflinger's rejection-inversion, as in
/// Apache Commons' RejectionInversionZipfSampler).
#[derive(Clone)]
pub struct Zipf {
    n: u64,
    exponent: f64,
    h_integral_x1: f64,
    h_integral_n: f64,
    s: f64,
}

impl Zipf {
    /// Ranks 1..=n with exponent `exponent` (> 0).
    pub fn new(n: u64, exponent: f64) -> Zipf {
        let mut z = Zipf {
            n: n.max(1),
            exponent,
            h_integral_x1: 0.0,
            h_integral_n: 0.0,
            s: 0.0,
        };
        z.h_integral_x1 = z.h_integral(1.5) - 1.0;
        z.h_integral_n = z.h_integral(z.n as f64 + 0.5);
        z.s = 2.0 - z.h_integral_inverse(z.h_integral(2.5) - z.h(2.0));
        z
    }

    /// A rank in 1..=n.
    pub fn sample(&self, rng: &mut Rng) -> u64 {
        loop {
            let u = self.h_integral_n + rng.next_f64() * (self.h_integral_x1 - self.h_integral_n);
            let x = self.h_integral_inverse(u);
            let k = ((x + 0.5) as u64).clamp(1, self.n);
            if (k as f64 - x) <= self.s || u >= self.h_integral(k as f64 + 0.5) - self.h(k as f64) {
                return k;
            }
        }
    }

    fn h(&self, x: f64) -> f64 {
        (-self.exponent * x.ln()).exp()
    }

    fn h_integral(&self, x: f64) -> f64 {
        let log_x = x.ln();
        helper2((1.0 - self.exponent) * log_x) * log_x
    }

    fn h_integral_inverse(&self, x: f64) -> f64 {
        let t = (x * (1.0 - self.exponent)).max(-1.0);
        (helper1(t) * x).exp()
    }
}

fn helper1(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.ln_1p() / x
    } else {
        1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x))
    }
}

fn helper2(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.exp_m1() / x
    } else {
        1.0 + x * 0.5 * (1.0 + x / 3.0 * (1.0 + 0.25 * x))
    }
}

/// Parses sizes like `64`, `4k`, `4KiB`, `2MiB`, `1m`, `1g` (k/m/g are
/// powers of 1024, as benchmark users expect for value sizes).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let lower = s.trim().to_ascii_lowercase();
    let split = lower
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(lower.len());
    let (digits, unit) = lower.split_at(split);
    let n: usize = digits.parse().map_err(|_| format!("bad size '{s}'"))?;
    let mul = match unit {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1024,
        "m" | "mb" | "mib" => 1024 * 1024,
        "g" | "gb" | "gib" => 1024 * 1024 * 1024,
        _ => return Err(format!("bad size unit in '{s}'")),
    };
    n.checked_mul(mul)
        .ok_or_else(|| format!("size '{s}' too large"))
}

/// A fixed size (`64KiB`) or an inclusive range (`1KiB-64KiB`).
#[derive(Clone, Copy, Debug)]
pub struct SizeRange {
    /// Smallest value.
    pub min: usize,
    /// Largest value.
    pub max: usize,
}

impl SizeRange {
    /// Parses `N` or `A-B`.
    pub fn parse(s: &str) -> Result<SizeRange, String> {
        match s.split_once('-') {
            Some((a, b)) => {
                let (min, max) = (parse_size(a)?, parse_size(b)?);
                if min > max {
                    return Err(format!("empty size range '{s}'"));
                }
                Ok(SizeRange { min, max })
            }
            None => {
                let n = parse_size(s)?;
                Ok(SizeRange { min: n, max: n })
            }
        }
    }

    /// The size of the value under `key` (fixed per key, so it can be
    /// verified).
    pub fn for_key(&self, key: &[u8]) -> usize {
        if self.min == self.max {
            self.min
        } else {
            self.min + (hash(key).rotate_left(17) % (self.max - self.min + 1) as u64) as usize
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_values_verify_and_differ() {
        let pool = ValuePool::new(1 << 16, "test").unwrap();
        let a = pool.value(b"a", 1000);
        assert!(pool.verify(b"a", 1000, &a));
        assert!(!pool.verify(b"b", 1000, &a));
        let mut bad = a.to_vec();
        bad[500] ^= 1;
        assert!(!pool.verify(b"a", 1000, &bad));
    }

    #[test]
    fn zipf_is_skewed_and_in_range() {
        let z = Zipf::new(1000, 0.99);
        let mut rng = Rng::new(7);
        let mut counts = vec![0u32; 1001];
        for _ in 0..100_000 {
            let k = z.sample(&mut rng);
            assert!((1..=1000).contains(&k));
            counts[k as usize] += 1;
        }
        // Rank 1 is drawn about twice as often as rank 2, far more than rank 100.
        assert!(counts[1] > counts[2] && counts[2] > counts[100] * 10);
        let top10: u32 = counts[1..=10].iter().sum();
        assert!(top10 > 30_000, "{top10}");
    }

    #[test]
    fn sizes() {
        assert!(ValuePool::new(MAX_VALUE + 1, "--value-size")
            .err()
            .is_some_and(
                |e| e.starts_with("--value-size: a value of 536870913 bytes is over 512 MiB")
            ));
        assert_eq!(parse_size("64").unwrap(), 64);
        assert_eq!(parse_size("64KiB").unwrap(), 65536);
        assert_eq!(parse_size("2m").unwrap(), 2 << 20);
        let r = SizeRange::parse("1k-4k").unwrap();
        for k in 0..100u32 {
            let n = r.for_key(&k.to_le_bytes());
            assert!((1024..=4096).contains(&n));
        }
    }
}
