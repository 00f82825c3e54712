//! The warm restart: the index of the blocks on disk comes back from the
//! segments' footers, newest segment first, while the server already
//! answers.
//!
//! [`SpillDir::open_segments`] registers the files without reading them;
//! a [`Loader`] then lists one segment at a time: from its footer (two
//! reads, no payload) when it has a valid one, or record by record when it
//! has none (the segment a shard was writing when the process died) or
//! its footer fails a checksum. Newest first, a key's first record is its
//! latest one: a tombstone or an expired record kills the older records
//! of its key (the loader keeps the dead keys until it is done), and the
//! store keeps a record only if the key is not in its index already (see
//! `Store::insert_loaded`: keys written or deleted by clients meanwhile win
//! over anything older on disk).

use std::io;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use hashbrown::HashSet;

use super::dir::{aligned, DiskLoc, Segment, SpillDir};
use super::footer::{self, TRAILER};
use super::record::{self, ALIGN};

/// One record found by the warm restart.
#[derive(Clone, Debug)]
pub struct Recovered {
    /// The key (in memory of its own: the disk index keeps it as it is).
    pub key: Box<[u8]>,
    /// Expiry (0: none).
    pub expire_at: u64,
    /// Where it is.
    pub loc: DiskLoc,
}

/// What a whole warm restart found ([`recover`]).
pub struct Recovery {
    /// The latest live record of each key, in no particular order.
    pub records: Vec<Recovered>,
    /// Records skipped for a bad checksum or a torn tail.
    pub skipped: u64,
}

/// One entry of a segment as its footer or a scan lists it.
struct Listed {
    /// In memory of its own: it becomes the disk index's key as it is.
    key: Box<[u8]>,
    /// Where the value starts in the record depends on it; the parent
    /// itself stays on disk.
    parent_len: usize,
    expire_at: u64,
    tombstone: bool,
    offset: u64,
    value_len: u32,
}

/// How one segment was listed (counted: INFO `spill_footers_read`,
/// `spill_segments_scanned`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Listing {
    /// From its footer.
    Footer,
    /// Record by record.
    Scan,
}

/// Indexes the segments of a directory, newest first.
pub struct Loader {
    /// Oldest first: the next one is popped from the end.
    segments: Vec<Arc<Segment>>,
    /// Keys a newer tombstone or expired record killed.
    dead: HashSet<Box<[u8]>>,
}

impl Loader {
    /// A loader of `segments` (oldest first, as
    /// [`SpillDir::open_segments`] returns them).
    pub fn new(segments: Vec<Arc<Segment>>) -> Loader {
        Loader {
            segments,
            dead: HashSet::new(),
        }
    }

    /// The live records of the next segment, newest first, leaving out
    /// what a newer tombstone killed and what expired by `now`. A record
    /// older than another live one of its key is still returned: the store
    /// keeps the first it sees.
    pub fn next(&mut self, dir: &SpillDir, now: u64) -> Option<io::Result<Vec<Recovered>>> {
        let segment = self.segments.pop()?;
        dir.counters.load_pending.fetch_sub(1, Relaxed);
        let (listed, skipped, how) = match list_segment(&segment) {
            Ok(found) => found,
            Err(e) => return Some(Err(e)),
        };
        let c = &dir.counters;
        c.recovery_skipped.fetch_add(skipped, Relaxed);
        match how {
            Listing::Footer => c.footers_read.fetch_add(1, Relaxed),
            Listing::Scan => c.segments_scanned.fetch_add(1, Relaxed),
        };
        let mut out = Vec::with_capacity(listed.len());
        for l in listed.into_iter().rev() {
            if self.dead.contains(&l.key) {
                continue;
            }
            if l.tombstone || (l.expire_at != 0 && l.expire_at <= now) {
                self.dead.insert(l.key);
                continue;
            }
            out.push(Recovered {
                loc: DiskLoc {
                    segment: Arc::clone(&segment),
                    offset: l.offset,
                    len: record::record_len(l.key.len(), l.parent_len, l.value_len as usize) as u32,
                    value_at: record::value_offset(l.key.len(), l.parent_len) as u32,
                    value_len: l.value_len,
                },
                key: l.key,
                expire_at: l.expire_at,
            });
        }
        Some(Ok(out))
    }
}

/// Indexes every segment of the directory at once (tests and tools; the
/// server loads in the background with a [`Loader`]): the latest live
/// record of each key, live counts set, segments with nothing live deleted.
pub fn recover(dir: &SpillDir) -> io::Result<Recovery> {
    let mut loader = Loader::new(dir.open_segments()?);
    let skipped_before = dir.counters.recovery_skipped.load(Relaxed);
    let mut seen = HashSet::new();
    let mut records = Vec::new();
    while let Some(found) = loader.next(dir, crate::clock::now_ms()) {
        for r in found? {
            if seen.insert(r.key.clone()) {
                dir.add_live(&r.loc.segment, 1);
                records.push(r);
            }
        }
    }
    dir.finish_loading();
    dir.counters.recovered.store(records.len() as u64, Relaxed);
    let skipped = dir.counters.recovery_skipped.load(Relaxed) - skipped_before;
    Ok(Recovery { records, skipped })
}

/// The keys of a segment's records (not of its tombstones), from its
/// footer or by a scan: what reclaim looks up.
pub(crate) fn segment_keys(segment: &Arc<Segment>) -> io::Result<Vec<Bytes>> {
    let (listed, _, _) = list_segment(segment)?;
    Ok(listed
        .into_iter()
        .filter(|l| !l.tombstone)
        .map(|l| Bytes::from(l.key))
        .collect())
}

/// A segment's entries in offset order, the records skipped, and how they
/// were found.
fn list_segment(segment: &Arc<Segment>) -> io::Result<(Vec<Listed>, u64, Listing)> {
    let len = segment.size.load(Relaxed);
    if let Some(listed) = read_footer(segment, len) {
        return Ok((listed, 0, Listing::Footer));
    }
    let (listed, skipped) = scan_segment(segment, len)?;
    Ok((listed, skipped, Listing::Scan))
}

/// The segment's footer, if it has one that passes its checksums and
/// lists records inside the segment.
fn read_footer(segment: &Segment, len: u64) -> Option<Vec<Listed>> {
    if len < (ALIGN + TRAILER) as u64 || !len.is_multiple_of(ALIGN as u64) {
        return None;
    }
    let mut block = aligned(TRAILER);
    read_exact(segment, &mut block, len - TRAILER as u64).ok()?;
    let (at, body_len, entries, crc) = footer::trailer(&block)?;
    if !at.is_multiple_of(ALIGN as u64) || at + footer::footer_len(body_len) as u64 != len {
        return None;
    }
    let mut body = aligned(body_len.div_ceil(ALIGN) * ALIGN);
    read_exact(segment, &mut body, at).ok()?;
    body.truncate(body_len);
    let found = footer::decode(&body, entries, crc)?;
    let mut out = Vec::with_capacity(found.len());
    for e in found {
        if !e.offset.is_multiple_of(ALIGN as u64) || e.offset + e.record_len() as u64 > at {
            return None;
        }
        // Keys are copied: a slice would keep the whole body alive.
        out.push(Listed {
            key: e.key.into(),
            parent_len: e.parent.map_or(0, <[u8]>::len),
            expire_at: e.expire_at,
            tombstone: e.tombstone,
            offset: e.offset,
            value_len: e.value_len,
        });
    }
    Some(out)
}

fn read_exact(segment: &Segment, buf: &mut [u8], offset: u64) -> io::Result<()> {
    if read_some_at(segment, buf, offset)? < buf.len() {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

/// Reads one segment sequentially, record by record; returns its entries
/// and how many records were skipped (a torn tail, flipped bytes).
fn scan_segment(segment: &Segment, len: u64) -> io::Result<(Vec<Listed>, u64)> {
    const CHUNK: usize = 8 << 20;
    let mut listed = Vec::new();
    let mut skipped = 0;
    let mut window = BytesMut::new();
    let mut window_start = 0u64;
    let mut read_to = 0u64;
    let mut pos = 0u64;
    while pos < len {
        // Make sure the window holds at least a header at `pos`.
        let need_header = pos + record::HEADER as u64;
        while read_to < need_header.min(len) {
            read_more(segment, &mut window, &mut read_to, len, CHUNK)?;
        }
        let at = (pos - window_start) as usize;
        let Some(h) = record::header(&window[at..]) else {
            // Not a record here (a hole, a torn write, a footer): try the
            // next block.
            pos += ALIGN as u64;
            trim(&mut window, &mut window_start, pos);
            continue;
        };
        let rec_len = h.record_len() as u64;
        if pos + rec_len > len {
            skipped += 1;
            break;
        }
        while read_to < pos + rec_len {
            read_more(segment, &mut window, &mut read_to, len, CHUNK)?;
        }
        let at = (pos - window_start) as usize;
        let bytes = Bytes::copy_from_slice(&window[at..at + rec_len as usize]);
        match record::decode(bytes) {
            Some(r) if r.tombstone && r.key.is_empty() => {
                for key in record::read_key_list(&r.value) {
                    listed.push(Listed {
                        key: key[..].into(),
                        parent_len: 0,
                        expire_at: 0,
                        tombstone: true,
                        offset: pos,
                        value_len: 0,
                    });
                }
                pos += rec_len;
            }
            Some(r) => {
                listed.push(Listed {
                    key: r.key[..].into(),
                    parent_len: h.parent_len,
                    expire_at: r.expire_at,
                    tombstone: r.tombstone,
                    offset: pos,
                    value_len: h.value_len as u32,
                });
                pos += rec_len;
            }
            None => {
                skipped += 1;
                pos += ALIGN as u64;
            }
        }
        trim(&mut window, &mut window_start, pos);
    }
    Ok((listed, skipped))
}

fn read_more(
    segment: &Segment,
    window: &mut BytesMut,
    read_to: &mut u64,
    len: u64,
    chunk: usize,
) -> io::Result<()> {
    let n = chunk.min((len - *read_to) as usize).div_ceil(ALIGN) * ALIGN;
    let mut buf = aligned(n);
    let got = read_some_at(segment, &mut buf, *read_to)?;
    window.extend_from_slice(&buf[..got.min((len - *read_to) as usize)]);
    *read_to += got.min((len - *read_to) as usize) as u64;
    if got == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

fn read_some_at(segment: &Segment, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    use std::os::unix::fs::FileExt;
    let mut done = 0;
    while done < buf.len() {
        match segment.file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

fn trim(window: &mut BytesMut, window_start: &mut u64, pos: u64) {
    let drop = (pos - *window_start).min(window.len() as u64) as usize;
    if drop > (4 << 20) {
        let _ = window.split_to(drop);
        *window_start += drop as u64;
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::record::{encode, Record};
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("kvtier-load-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn rec(key: &str, value: &[u8], tombstone: bool) -> Record {
        Record {
            key: Bytes::copy_from_slice(key.as_bytes()),
            parent: None,
            value: Bytes::copy_from_slice(value),
            expire_at: 0,
            tombstone,
        }
    }

    /// A segment of `records`, sealed with a footer when `with_footer`.
    fn write_segment(
        d: &SpillDir,
        owner: usize,
        records: &[Record],
        with_footer: bool,
    ) -> Arc<Segment> {
        let seg = d.new_segment(owner).unwrap();
        let mut batch = aligned(0);
        let mut body = BytesMut::new();
        let mut entries = 0;
        for r in records {
            let at = batch.len();
            encode(&mut batch, r);
            entries += footer::note_record(&mut body, at as u64, &batch[at..]);
        }
        let off = d.reserve(&seg, batch.len() as u64).unwrap();
        let mut out = aligned(batch.len());
        out.copy_from_slice(&batch);
        d.write(&seg, off, &out).unwrap();
        for _ in records {
            d.add_live(&seg, 1);
        }
        if with_footer {
            let at = d
                .reserve(&seg, footer::footer_len(body.len()) as u64)
                .unwrap();
            d.write(&seg, at, &footer::encode(at, &body, entries))
                .unwrap();
        }
        seg
    }

    fn files(path: &PathBuf) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(path)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        files
    }

    fn flip(file: &PathBuf, at: usize) {
        let mut bytes = std::fs::read(file).unwrap();
        bytes[at] ^= 1;
        std::fs::write(file, &bytes).unwrap();
    }

    /// The keys recovered and what reading each gives (`None`: a miss).
    fn recovered(d: &SpillDir) -> (Vec<(Bytes, Option<Bytes>)>, u64) {
        let found = recover(d).unwrap();
        let mut keys: Vec<(Bytes, Option<Bytes>)> = found
            .records
            .iter()
            .map(|r| {
                let value = d.read(&r.loc, &r.key).unwrap().map(|rec| rec.value);
                (Bytes::copy_from_slice(&r.key), value)
            })
            .collect();
        keys.sort();
        (keys, found.skipped)
    }

    #[test]
    fn recovery_keeps_the_latest_record_and_skips_damage() {
        let path = dir("recover");
        {
            let d = SpillDir::open(&path, 0).unwrap();
            let s1 = write_segment(
                &d,
                0,
                &[
                    rec("a", b"old", false),
                    rec("b", b"bee", false),
                    rec("c", b"sea", false),
                ],
                false,
            );
            d.seal(&s1);
            write_segment(
                &d,
                1,
                &[rec("a", b"new", false), rec("c", b"", true)],
                false,
            );
        }
        // Flip a byte inside b's record and leave a torn tail.
        let files = files(&path);
        let first = std::fs::read(&files[0]).unwrap();
        flip(&files[0], 4096 + record::HEADER + 1);
        let mut second = std::fs::read(&files[1]).unwrap();
        second.extend_from_slice(&first[..record::HEADER + 8]);
        std::fs::write(&files[1], &second).unwrap();

        let d = SpillDir::open(&path, 0).unwrap();
        let (keys, skipped) = recovered(&d);
        assert_eq!(keys, vec![(Bytes::from("a"), Some(Bytes::from("new")))]);
        assert_eq!(skipped, 2, "the flipped record and the torn tail");
        assert_eq!(d.counters.segments_scanned.load(Relaxed), 2);
        let _ = std::fs::remove_dir_all(&path);
    }

    #[test]
    fn a_footer_lists_the_segment_without_reading_payloads() {
        let path = dir("footer");
        let big = vec![7u8; 10_000];
        {
            let d = SpillDir::open(&path, 0).unwrap();
            let s1 = write_segment(
                &d,
                0,
                &[
                    rec("a", b"old", false),
                    rec("b", &big, false),
                    rec("c", b"sea", false),
                    rec("d", b"dee", false),
                ],
                true,
            );
            d.seal(&s1);
            // A newer segment with a footer: a new `a`, `c` deleted by a
            // tombstone list, `d` by a plain tombstone.
            let mut list = rec("", b"", true);
            list.value = record::key_list(&[Bytes::from_static(b"c")]);
            write_segment(
                &d,
                1,
                &[rec("a", b"new", false), list, rec("d", b"", true)],
                true,
            );
        }
        let d = SpillDir::open(&path, 0).unwrap();
        let (keys, skipped) = recovered(&d);
        let want = vec![
            (Bytes::from("a"), Some(Bytes::from("new"))),
            (Bytes::from("b"), Some(Bytes::from(big.clone()))),
        ];
        assert_eq!(keys, want);
        assert_eq!(skipped, 0);
        assert_eq!(d.counters.footers_read.load(Relaxed), 2);
        assert_eq!(d.counters.segments_scanned.load(Relaxed), 0);
        drop(d);

        // A flipped payload byte: the footer still lists the record (no
        // payload is read at restart) and the read of it is a miss.
        let files = files(&path);
        flip(&files[0], 4096 + record::HEADER + 1 + 5000);
        let d = SpillDir::open(&path, 0).unwrap();
        let (keys, _) = recovered(&d);
        assert_eq!(
            keys,
            vec![
                (Bytes::from("a"), Some(Bytes::from("new"))),
                (Bytes::from("b"), None),
            ]
        );
        assert_eq!(d.counters.footers_read.load(Relaxed), 2);
        drop(d);

        // A flipped footer byte (body, then trailer): that segment is
        // scanned instead, with the same outcome.
        let len = std::fs::metadata(&files[1]).unwrap().len() as usize;
        for at in [len - TRAILER - ALIGN + 3, len - TRAILER + 10] {
            flip(&files[1], at);
            let d = SpillDir::open(&path, 0).unwrap();
            let (keys, _) = recovered(&d);
            assert_eq!(keys.len(), 2);
            assert_eq!(keys[0], (Bytes::from("a"), Some(Bytes::from("new"))));
            assert_eq!(d.counters.segments_scanned.load(Relaxed), 1);
            assert_eq!(d.counters.footers_read.load(Relaxed), 1);
            flip(&files[1], at);
        }
        let _ = std::fs::remove_dir_all(&path);
    }

    #[test]
    fn nothing_is_deleted_while_loading() {
        let path = dir("loading");
        {
            let d = SpillDir::open(&path, 0).unwrap();
            let s = write_segment(&d, 0, &[rec("a", b"x", false)], true);
            d.seal(&s);
        }
        let d = SpillDir::open(&path, 0).unwrap();
        let segments = d.open_segments().unwrap();
        assert!(d.loading());
        // Sealed with nothing live yet, but kept until the load is done.
        d.add_live(&segments[0], 1);
        d.drop_live(&segments[0], 1);
        assert_eq!(d.segment_count(), 1);
        assert_eq!(d.claim_oldest(), None, "no reclaim while loading");
        let mut loader = Loader::new(segments);
        let found = loader.next(&d, crate::clock::now_ms()).unwrap().unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(d.counters.footers_read.load(Relaxed), 1);
        assert!(loader.next(&d, crate::clock::now_ms()).is_none());
        d.finish_loading();
        assert_eq!(d.segment_count(), 0, "nothing live: deleted once loaded");
        let _ = std::fs::remove_dir_all(&path);
    }

    mod property {
        use proptest::prelude::*;

        use super::*;

        /// Two segments with footers, the newer overwriting or deleting
        /// some keys of the older, both stopped gracefully; then `flips`
        /// bytes flipped anywhere in the files (records, footer bodies,
        /// trailers, padding) and, if `cut`, the newer file cut short.
        fn restart_after_damage(
            ops: &[(u8, u16, bool)],
            flips: &[(bool, u32)],
            cut: Option<u32>,
            case: u64,
        ) -> Result<(), TestCaseError> {
            let path = dir(&format!("prop-{case}"));
            // What each key holds after the writes, as a model.
            let mut model: std::collections::HashMap<String, Option<Vec<u8>>> =
                std::collections::HashMap::new();
            {
                let d = SpillDir::open(&path, 0).unwrap();
                let (mut old, mut new) = (Vec::new(), Vec::new());
                for (i, &(key, len, delete)) in ops.iter().enumerate() {
                    let key = format!("k{}", key % 16);
                    let value: Vec<u8> = (0..len as usize).map(|j| (i + j) as u8).collect();
                    let newer = i >= ops.len() / 2;
                    let batch = if newer { &mut new } else { &mut old };
                    if delete && newer {
                        batch.push(rec(&key, b"", true));
                        model.insert(key, None);
                    } else {
                        batch.push(rec(&key, &value, false));
                        model.insert(key, Some(value));
                    }
                }
                let s1 = write_segment(&d, 0, &old, true);
                d.seal(&s1);
                let s2 = write_segment(&d, 1, &new, true);
                d.seal(&s2);
            }
            let files = files(&path);
            for &(second, at) in flips {
                let file = &files[second as usize % files.len()];
                let len = std::fs::metadata(file).unwrap().len();
                if len > 0 {
                    flip(file, (at as u64 % len) as usize);
                }
            }
            if let Some(cut) = cut {
                let file = &files[files.len() - 1];
                let len = std::fs::metadata(file).unwrap().len();
                let f = std::fs::OpenOptions::new().write(true).open(file).unwrap();
                f.set_len(cut as u64 % (len + 1)).unwrap();
            }
            let d = SpillDir::open(&path, 0).unwrap();
            let (found, _) = recovered(&d);
            if flips.is_empty() && cut.is_none() {
                let mut want: Vec<String> = model
                    .iter()
                    .filter(|(_, v)| v.is_some())
                    .map(|(k, _)| k.clone())
                    .collect();
                want.sort();
                let got: Vec<String> = found
                    .iter()
                    .map(|(k, _)| String::from_utf8(k.to_vec()).unwrap())
                    .collect();
                prop_assert_eq!(got, want);
            }
            for (key, value) in found {
                let key = String::from_utf8(key.to_vec()).unwrap();
                // A block read back is exactly what was last written under
                // its key, or a miss; a deleted key may come back only as
                // its old value when the tombstone was damaged (never as
                // wrong bytes).
                let Some(value) = value else { continue };
                let last = model.get(&key).cloned().flatten();
                let wrote = ops.iter().enumerate().any(|(i, &(k, len, _))| {
                    format!("k{}", k % 16) == key
                        && value.len() == len as usize
                        && value.iter().enumerate().all(|(j, &b)| b == (i + j) as u8)
                });
                prop_assert!(wrote, "{key}: bytes never written");
                if flips.is_empty() && cut.is_none() {
                    prop_assert_eq!(Some(value.to_vec()), last, "{}", key);
                }
            }
            let _ = std::fs::remove_dir_all(&path);
            Ok(())
        }

        proptest! {
            #![proptest_config(ProptestConfig {
                cases: std::env::var("PROPTEST_CASES")
                    .ok()
                    .and_then(|c| c.parse().ok())
                    .unwrap_or(32),
                // Failures are reported in the output, not saved in the tree.
                failure_persistence: None,
                ..ProptestConfig::default()
            })]

            #[test]
            fn a_restart_after_any_damage_serves_no_wrong_byte(
                ops in prop::collection::vec((any::<u8>(), 0u16..9000, any::<bool>()), 2..40),
                flips in prop::collection::vec((any::<bool>(), any::<u32>()), 0..4),
                cut in prop::option::of(any::<u32>()),
                case in any::<u64>(),
            ) {
                restart_after_damage(&ops, &flips, cut, case)?;
            }
        }
    }
}
