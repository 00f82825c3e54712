//! `kvtier-bench spill-index DIR`: a spill directory as a tier of many small
//! blocks would leave it, without the disk to hold them: each segment file
//! is sparse (its records a hole, no byte written) and ends with a valid
//! footer listing them. A server started on it indexes every block from the
//! footers as it would a real tier's, so restart time and the DRAM each
//! block on disk costs can be measured at 50M blocks on a small disk; a
//! read of one is a miss (the hole fails the record's checksum).

use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use clap::Args;
use kvtier_store::spill::record;
use kvtier_store::spill::{footer, SEGMENT_SIZE};

use crate::workload::parse_size;

/// Options of `kvtier-bench spill-index`.
#[derive(Args, Debug, Clone)]
pub struct SpillIndexArgs {
    /// The directory to fill (created; must not hold segments already).
    pub dir: PathBuf,
    /// Blocks to list.
    #[arg(long, default_value_t = 1_000_000)]
    pub blocks: u64,
    /// Each block's size.
    #[arg(long, default_value = "16KiB")]
    pub value_size: String,
    /// Shards the segments are spread over (their owners).
    #[arg(long, default_value_t = 2)]
    pub shards: usize,
}

/// A 45-byte key like LMCache's `model@world_size@rank@hash@dtype`.
fn key(i: u64) -> Bytes {
    let hash = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    Bytes::from(format!("llama-70b@8@0@{hash:016x}{i:08x}@bf16"))
}

/// Writes the segments.
pub fn run(a: SpillIndexArgs) -> io::Result<()> {
    let value =
        parse_size(&a.value_size).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    std::fs::create_dir_all(&a.dir)?;
    let started = Instant::now();
    let rec_len = record::record_len(key(0).len(), 0, value) as u64;
    let per_segment = (SEGMENT_SIZE / rec_len).max(1);
    let (mut seq, mut i, mut bytes) = (1u64, 0u64, 0u64);
    while i < a.blocks {
        let n = per_segment.min(a.blocks - i);
        let (mut body, mut entries) = (BytesMut::new(), 0);
        for j in 0..n {
            // The footer entry of the record that would be there.
            footer::put_entry(
                &mut body,
                j * rec_len,
                0,
                value as u32,
                0,
                false,
                &key(i + j),
                &[],
            );
            entries += 1;
        }
        let at = n * rec_len;
        let path = a
            .dir
            .join(format!("{seq:016x}-{}.seg", seq as usize % a.shards));
        let out = footer::encode(at, &body, entries);
        std::fs::File::create(&path)?.write_all_at(&out, at)?;
        bytes += out.len() as u64;
        i += n;
        seq += 1;
    }
    println!(
        "{} blocks of {} in {} sparse segments ({:.1} MB of footers) in {:.1?}",
        a.blocks,
        a.value_size,
        seq - 1,
        bytes as f64 / 1e6,
        started.elapsed()
    );
    Ok(())
}
