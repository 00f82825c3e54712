//! Bitmap commands on string values: SETBIT, GETBIT, BITCOUNT, BITPOS, BITOP,
//! BITFIELD and BITFIELD_RO, with
//! Redis 7's semantics (bit 0 is the most significant bit of byte 0; a
//! string grows with zero bytes; offsets and ranges as Redis checks them).

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use kvtier_protocol::Reply;
use kvtier_store::{now_ms, Store};

use super::fan_out;
use super::flags::*;
use super::{
    clamp, is, not_integer, oom_error, parse_int, store_raw, syntax_error, Args, Client,
    CommandSpec, Handler, KeyOp, KeySpec, LocalBoxFuture, DEFAULTS, KEY1,
};
use crate::acl::{category, perm, KeyUse};
use crate::shard::slot::key_slot;
use crate::shard::{Access, ShardGone};

const BASE: CommandSpec = CommandSpec {
    arity: 2,
    flags: READONLY,
    keys: KEY1,
    group: "bitmap",
    since: "2.2.0",
    syntax: "key",
    categories: category::BITMAP,
    ..DEFAULTS
};

/// The bitmap family.
pub const COMMANDS: &[CommandSpec] = &[
    CommandSpec {
        name: "setbit",
        arity: 4,
        flags: WRITE | DENYOOM,
        summary: "Sets or clears the bit at offset of the string value. Creates the key if it doesn't exist.",
        syntax: "key offset:integer value:integer",
        handler: Handler::Key(setbit),
        ..BASE
    },
    CommandSpec {
        name: "getbit",
        arity: 3,
        flags: READONLY | FAST,
        summary: "Returns a bit value by offset.",
        syntax: "key offset:integer",
        handler: Handler::Key(getbit),
        ..BASE
    },
    CommandSpec {
        name: "bitcount",
        arity: -2,
        summary: "Counts the number of set bits (population counting) in a string.",
        complexity: "O(N)",
        syntax: "key [start:integer end:integer [BYTE|BIT]]",
        handler: Handler::Key(bitcount),
        ..BASE
    },
    CommandSpec {
        name: "bitpos",
        arity: -3,
        since: "2.8.7",
        summary: "Finds the first set (1) or clear (0) bit in a string.",
        complexity: "O(N)",
        syntax: "key bit:integer [start:integer [end:integer [BYTE|BIT]]]",
        handler: Handler::Key(bitpos),
        ..BASE
    },
    CommandSpec {
        name: "bitop",
        // BITOP writes its destination and reads its sources.
        key_use: KeyUse::OneDiffers {
            at: 2,
            that: perm::WRITE,
            rest: perm::READ,
        },
        arity: -4,
        flags: WRITE | DENYOOM,
        keys: KeySpec::range(2, -1, 1),
        summary: "Performs bitwise operations on multiple strings, and stores the result.",
        complexity: "O(N)",
        syntax: "(AND|OR|XOR|NOT) destkey key [key ...]",
        handler: Handler::Async(bitop),
        ..BASE
    },
    CommandSpec {
        name: "bitfield",
        key_use: KeyUse::ByArgs(bitfield_key_use),
        arity: -2,
        flags: WRITE | DENYOOM,
        since: "3.2.0",
        summary: "Performs arbitrary bitfield integer operations on strings.",
        complexity: "O(1) for each subcommand specified",
        syntax: "key [GET encoding offset] [OVERFLOW WRAP|SAT|FAIL] [SET encoding offset value:integer] [INCRBY encoding offset increment:integer]",
        handler: Handler::Key(bitfield),
        ..BASE
    },
    CommandSpec {
        name: "bitfield_ro",
        arity: -2,
        flags: READONLY | FAST,
        since: "6.0.0",
        summary: "Performs arbitrary read-only bitfield integer operations on strings.",
        complexity: "O(1) for each subcommand specified",
        syntax: "key [GET encoding offset]",
        handler: Handler::Key(bitfield_ro),
        ..BASE
    },
];

/// BITOP: the sources are read on their shards in parallel, combined here,
/// and the result stored on the destination's shard (or the destination
/// deleted when every source is empty), as Redis does.
fn bitop(client: &mut Client, args: Args) -> LocalBoxFuture<'_> {
    Box::pin(async move {
        let args = Arc::new(args);
        #[derive(Clone, Copy, PartialEq)]
        enum Op {
            And,
            Or,
            Xor,
            Not,
        }
        let op = match args[1].to_ascii_lowercase().as_slice() {
            b"and" => Op::And,
            b"or" => Op::Or,
            b"xor" => Op::Xor,
            b"not" => Op::Not,
            _ => return syntax_error(),
        };
        if op == Op::Not && args.len() != 4 {
            return Reply::error("ERR BITOP NOT must be called with a single source key.");
        }
        let sources: Vec<usize> = (3..args.len()).collect();
        let read = fan_out(
            client,
            &args,
            &sources,
            Access::Write,
            |store, slot, key, _, now| {
                store.materialize(slot, key, now);
                store
                    .peek(slot, key, now)
                    .map(|e| e.value.bytes().unwrap_or_default())
            },
        )
        .await;
        let Ok(values) = read else {
            return Reply::from(ShardGone);
        };
        let values: Vec<Bytes> = values.into_iter().map(Option::unwrap_or_default).collect();
        let len = values.iter().map(Bytes::len).max().unwrap_or(0);
        let mut out = BytesMut::zeroed(len);
        for i in 0..len {
            let byte = |v: &Bytes| v.get(i).copied().unwrap_or(0);
            out[i] = match op {
                Op::Not => !byte(&values[0]),
                Op::And => values.iter().map(byte).fold(0xff, |a, b| a & b),
                Op::Or => values.iter().map(byte).fold(0, |a, b| a | b),
                Op::Xor => values.iter().map(byte).fold(0, |a, b| a ^ b),
            };
        }
        let dest = args[2].clone();
        let slot = key_slot(&dest);
        let owner = client.shard.owner_of(slot);
        let value = out.freeze();
        let stored = client
            .shard
            .call(owner, move |s| {
                let mut store = s.store.lock();
                let now = now_ms();
                if value.is_empty() {
                    store.remove(slot, &dest);
                    return true;
                }
                store.insert(slot, &dest, value, 0, now).is_ok()
            })
            .await;
        match stored {
            Ok(true) => Reply::Int(len as i64),
            Ok(false) => oom_error(),
            Err(_) => Reply::from(ShardGone),
        }
    })
}

/// A bit offset as Redis accepts it: 0 up to the bits of the longest
/// string (`proto-max-bulk-len` bytes).
fn bit_offset(arg: &[u8], max_len: usize) -> Result<u64, Reply> {
    let err = || Reply::error("ERR bit offset is not an integer or out of range");
    let n = parse_int(arg).ok_or_else(err)?;
    if n < 0 || (n as u64 >> 3) >= max_len as u64 {
        return Err(err());
    }
    Ok(n as u64)
}

/// The string at the key (empty when absent), read for a bit command.
fn value_of(store: &mut Store, op: &KeyOp, now: u64, touch: bool) -> Option<Bytes> {
    store.materialize(op.slot, op.key(), now);
    let entry = if touch {
        store.read(op.slot, op.key(), now, op.touch)
    } else {
        store.peek(op.slot, op.key(), now)
    };
    entry.map(|e| e.value.bytes().unwrap_or_default())
}

fn setbit(store: &mut Store, op: &KeyOp, now: u64) -> Reply {
    let offset = match bit_offset(&op.args[2], store.max_value_len()) {
        Ok(o) => o,
        Err(e) => return e,
    };
    let on = match parse_int(&op.args[3]) {
        Some(0) => false,
        Some(1) => true,
        _ => return Reply::error("ERR bit is not an integer or out of range"),
    };
    let (slot, key) = (op.slot, op.key());
    store.materialize(slot, key, now);
    let (old, expire_at) = store
        .peek(slot, key, now)
        .map(|e| (e.value.bytes().unwrap_or_default(), e.expire_at))
        .unwrap_or_default();
    let byte = (offset >> 3) as usize;
    let mask = 0x80u8 >> (offset & 7);
    let was = old.get(byte).is_some_and(|b| b & mask != 0);
    if was == on && byte < old.len() {
        return Reply::Int(was as i64);
    }
    let len = old.len().max(byte + 1);
    if !store.could_ever_fit(len) {
        // Refused before the value is built or anything evicted for it.
        return oom_error();
    }
    let mut value = BytesMut::zeroed(len);
    value[..old.len()].copy_from_slice(&old);
    if on {
        value[byte] |= mask;
    } else {
        value[byte] &= !mask;
    }
    match store_raw(store, slot, key, value, expire_at, now) {
        Ok(()) => Reply::Int(was as i64),
        Err(e) => e,
    }
}

fn getbit(store: &mut Store, op: &KeyOp, now: u64) -> Reply {
    let offset = match bit_offset(&op.args[2], store.max_value_len()) {
        Ok(o) => o,
        Err(e) => return e,
    };
    let value = value_of(store, op, now, true).unwrap_or_default();
    let byte = (offset >> 3) as usize;
    let bit = value
        .get(byte)
        .is_some_and(|b| b & (0x80 >> (offset & 7)) != 0);
    Reply::Int(bit as i64)
}

/// `start end [BYTE|BIT]` at `args[from..]`: the range and whether it
/// counts bits.
fn parse_range(args: &[Bytes], from: usize) -> Result<(i64, Option<i64>, bool), Reply> {
    let start = parse_int(&args[from]).ok_or_else(not_integer)?;
    let end = match args.get(from + 1) {
        Some(a) => Some(parse_int(a).ok_or_else(not_integer)?),
        None => None,
    };
    let bits = match args.get(from + 2) {
        None => false,
        Some(a) if is(a, "byte") => false,
        Some(a) if is(a, "bit") => true,
        Some(_) => return Err(syntax_error()),
    };
    Ok((start, end, bits))
}

fn bit_at(value: &[u8], i: i64) -> bool {
    value[(i >> 3) as usize] & (0x80 >> (i & 7)) != 0
}

/// Set bits of `value` in the bit range `first..=last`.
fn count_bits(value: &[u8], first: i64, last: i64) -> i64 {
    let (fb, lb) = ((first >> 3) as usize, (last >> 3) as usize);
    let mut n: i64 = value[fb..=lb].iter().map(|b| b.count_ones() as i64).sum();
    for i in (fb as i64 * 8)..first {
        n -= bit_at(value, i) as i64;
    }
    for i in (last + 1)..((lb as i64 + 1) * 8) {
        n -= bit_at(value, i) as i64;
    }
    n
}

fn bitcount(store: &mut Store, op: &KeyOp, now: u64) -> Reply {
    let args = &op.args;
    let range = match args.len() {
        2 => None,
        4 | 5 => match parse_range(args, 2) {
            Ok((start, Some(end), bits)) => Some((start, end, bits)),
            Ok(_) => return syntax_error(),
            Err(e) => return e,
        },
        _ => return syntax_error(),
    };
    let Some(value) = value_of(store, op, now, true) else {
        return Reply::Int(0);
    };
    // Both ends from the end, start after end: empty (as GETRANGE).
    if let Some((start, end, _)) = range {
        if start < 0 && end < 0 && start > end {
            return Reply::Int(0);
        }
    }
    let bits_total = value.len() as i64 * 8;
    let (first, last) = match range {
        None => (0, bits_total - 1),
        Some((start, end, true)) => match clamp(start, end, bits_total) {
            Some(r) => r,
            None => return Reply::Int(0),
        },
        Some((start, end, false)) => match clamp(start, end, value.len() as i64) {
            Some((s, e)) => (s * 8, e * 8 + 7),
            None => return Reply::Int(0),
        },
    };
    if first > last {
        return Reply::Int(0);
    }
    Reply::Int(count_bits(&value, first, last))
}

fn bitpos(store: &mut Store, op: &KeyOp, now: u64) -> Reply {
    let args = &op.args;
    let want = match parse_int(&args[2]) {
        Some(0) => false,
        Some(1) => true,
        Some(_) => return Reply::error("ERR The bit argument must be 1 or 0."),
        None => return not_integer(),
    };
    // As in Redis 7.0, a missing key answers before the range is read: an
    // endless run of zero bits.
    let Some(value) = value_of(store, op, now, true) else {
        return Reply::Int(if want { -1 } else { 0 });
    };
    if args.len() > 6 {
        return syntax_error();
    }
    let (start, end, bits) = if args.len() >= 4 {
        match parse_range(args, 3) {
            Ok(r) => r,
            Err(e) => return e,
        }
    } else {
        (0, None, false)
    };
    let end_given = end.is_some();
    let unit_total = if bits {
        value.len() as i64 * 8
    } else {
        value.len() as i64
    };
    let Some((s, e)) = clamp(start, end.unwrap_or(-1), unit_total) else {
        return Reply::Int(-1);
    };
    let (first, last) = if bits { (s, e) } else { (s * 8, e * 8 + 7) };
    // Whole bytes that cannot hold the bit are skipped a byte at a time.
    let skip = if want { 0x00 } else { 0xff };
    let mut i = first;
    while i <= last {
        if i & 7 == 0 && i + 7 <= last && value[(i >> 3) as usize] == skip {
            i += 8;
            continue;
        }
        if bit_at(&value, i) == want {
            return Reply::Int(i);
        }
        i += 1;
    }
    // No such bit in range: a clear bit is found just past the string when
    // the caller did not bound the range.
    Reply::Int(if !want && !end_given { last + 1 } else { -1 })
}

// ---- BITFIELD -----------------------------------------------------------------

/// What a BITFIELD write does when the value leaves its type's range.
#[derive(Clone, Copy, PartialEq)]
enum Overflow {
    Wrap,
    Sat,
    Fail,
}

#[derive(Clone, Copy)]
enum FieldOp {
    Get,
    Set(i64),
    IncrBy(i64),
}

/// One GET, SET or INCRBY of a BITFIELD call.
struct Field {
    op: FieldOp,
    signed: bool,
    bits: u32,
    offset: u64,
    overflow: Overflow,
}

fn field_type(arg: &[u8]) -> Result<(bool, u32), Reply> {
    let err = || {
        Reply::error(
            "ERR Invalid bitfield type. Use something like i16 u8. Note that u64 is not supported but i64 is.",
        )
    };
    let (signed, digits) = match arg.split_first() {
        Some((b'i' | b'I', rest)) => (true, rest),
        Some((b'u' | b'U', rest)) => (false, rest),
        _ => return Err(err()),
    };
    let bits = std::str::from_utf8(digits)
        .ok()
        .and_then(|s| s.parse::<u32>().ok())
        .ok_or_else(err)?;
    let max = if signed { 64 } else { 63 };
    if bits == 0 || bits > max {
        return Err(err());
    }
    Ok((signed, bits))
}

/// A field offset: bits, or `#N` for the N-th field of this width.
fn field_offset(arg: &[u8], bits: u32, max_len: usize) -> Result<u64, Reply> {
    let err = || Reply::error("ERR bit offset is not an integer or out of range");
    let (hash, digits) = match arg.split_first() {
        Some((b'#', rest)) => (true, rest),
        _ => (false, arg),
    };
    let mut n = parse_int(digits).ok_or_else(err)?;
    if hash {
        n = n.checked_mul(bits as i64).ok_or_else(err)?;
    }
    if n < 0 || (n as u64 >> 3) >= max_len as u64 {
        return Err(err());
    }
    Ok(n as u64)
}

fn parse_fields(args: &[Bytes], read_only: bool, max_len: usize) -> Result<Vec<Field>, Reply> {
    let mut fields = Vec::new();
    let mut overflow = Overflow::Wrap;
    let mut i = 2;
    while i < args.len() {
        let word = args[i].to_ascii_lowercase();
        let left = args.len() - i - 1;
        match word.as_slice() {
            b"get" if left >= 2 => {
                let (signed, bits) = field_type(&args[i + 1])?;
                let offset = field_offset(&args[i + 2], bits, max_len)?;
                fields.push(Field {
                    op: FieldOp::Get,
                    signed,
                    bits,
                    offset,
                    overflow,
                });
                i += 3;
            }
            b"set" | b"incrby" if left >= 3 => {
                if read_only {
                    return Err(Reply::error(
                        "ERR BITFIELD_RO only supports the GET subcommand",
                    ));
                }
                let (signed, bits) = field_type(&args[i + 1])?;
                let offset = field_offset(&args[i + 2], bits, max_len)?;
                let n = parse_int(&args[i + 3]).ok_or_else(not_integer)?;
                let op = if word.as_slice() == b"set" {
                    FieldOp::Set(n)
                } else {
                    FieldOp::IncrBy(n)
                };
                fields.push(Field {
                    op,
                    signed,
                    bits,
                    offset,
                    overflow,
                });
                i += 4;
            }
            b"overflow" if left >= 1 => {
                overflow = match args[i + 1].to_ascii_lowercase().as_slice() {
                    b"wrap" => Overflow::Wrap,
                    b"sat" => Overflow::Sat,
                    b"fail" => Overflow::Fail,
                    _ => return Err(Reply::error("ERR Invalid OVERFLOW type specified")),
                };
                i += 2;
            }
            _ => return Err(syntax_error()),
        }
    }
    Ok(fields)
}

fn get_unsigned(value: &[u8], offset: u64, bits: u32) -> u64 {
    let mut out = 0u64;
    for j in 0..bits as u64 {
        let at = offset + j;
        let bit = value
            .get((at >> 3) as usize)
            .is_some_and(|b| b & (0x80 >> (at & 7)) != 0);
        out = (out << 1) | bit as u64;
    }
    out
}

fn get_signed(value: &[u8], offset: u64, bits: u32) -> i64 {
    let raw = get_unsigned(value, offset, bits);
    if bits < 64 && raw & (1 << (bits - 1)) != 0 {
        (raw | (u64::MAX << bits)) as i64
    } else {
        raw as i64
    }
}

fn set_bits(value: &mut [u8], offset: u64, bits: u32, v: u64) {
    for j in 0..bits as u64 {
        let at = offset + j;
        let on = v & (1u64 << (bits as u64 - 1 - j)) != 0;
        let (byte, mask) = ((at >> 3) as usize, 0x80u8 >> (at & 7));
        if on {
            value[byte] |= mask;
        } else {
            value[byte] &= !mask;
        }
    }
}

/// `value + incr` in an unsigned field of `bits`: the result, or `None`
/// when it overflows under FAIL (Redis's checkUnsignedBitfieldOverflow).
fn unsigned_result(value: u64, incr: i64, bits: u32, overflow: Overflow) -> Option<u64> {
    let max: u64 = if bits == 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    };
    let maxincr = max.wrapping_sub(value) as i64;
    let minincr = (value as i64).wrapping_neg();
    let wrapped = value.wrapping_add(incr as u64) & max;
    let up = value > max || (incr > 0 && incr > maxincr);
    let down = !up && incr < 0 && incr < minincr;
    match (up || down, overflow) {
        (false, _) | (true, Overflow::Wrap) => Some(wrapped),
        (true, Overflow::Sat) => Some(if up { max } else { 0 }),
        (true, Overflow::Fail) => None,
    }
}

/// The same for a signed field (checkSignedBitfieldOverflow).
fn signed_result(value: i64, incr: i64, bits: u32, overflow: Overflow) -> Option<i64> {
    let max: i64 = if bits == 64 {
        i64::MAX
    } else {
        (1i64 << (bits - 1)) - 1
    };
    let min = -max - 1;
    let maxincr = max.wrapping_sub(value);
    let minincr = min.wrapping_sub(value);
    let up =
        value > max || (bits != 64 && incr > maxincr) || (value >= 0 && incr > 0 && incr > maxincr);
    let down = !up
        && (value < min
            || (bits != 64 && incr < minincr)
            || (value < 0 && incr < 0 && incr < minincr));
    let wrap = || {
        let mask: u64 = if bits == 64 {
            u64::MAX
        } else {
            (1u64 << bits) - 1
        };
        let msb = 1u64 << (bits - 1);
        let c = (value as u64).wrapping_add(incr as u64);
        (if c & msb != 0 { c | !mask } else { c & mask }) as i64
    };
    match (up || down, overflow) {
        (false, _) => Some(value.wrapping_add(incr)),
        (true, Overflow::Wrap) => Some(wrap()),
        (true, Overflow::Sat) => Some(if up { max } else { min }),
        (true, Overflow::Fail) => None,
    }
}

fn bitfield(store: &mut Store, op: &KeyOp, now: u64) -> Reply {
    bitfield_run(store, op, now, false)
}

fn bitfield_ro(store: &mut Store, op: &KeyOp, now: u64) -> Reply {
    bitfield_run(store, op, now, true)
}

fn bitfield_run(store: &mut Store, op: &KeyOp, now: u64, read_only: bool) -> Reply {
    let fields = match parse_fields(&op.args, read_only, store.max_value_len()) {
        Ok(f) => f,
        Err(e) => return e,
    };
    let (slot, key) = (op.slot, op.key());
    // Writes grow (or create) the string to fit every field they touch
    // before any of them runs, as Redis does.
    let needed = fields
        .iter()
        .filter(|f| !matches!(f.op, FieldOp::Get))
        .map(|f| ((f.offset + f.bits as u64 - 1) >> 3) as usize + 1)
        .max();
    let Some(needed) = needed else {
        let value = value_of(store, op, now, true).unwrap_or_default();
        return Reply::Array(fields.iter().map(|f| read_field(&value, f)).collect());
    };
    store.materialize(slot, key, now);
    let (old, expire_at) = store
        .peek(slot, key, now)
        .map(|e| (e.value.bytes().unwrap_or_default(), e.expire_at))
        .unwrap_or_default();
    let mut value = BytesMut::zeroed(old.len().max(needed));
    value[..old.len()].copy_from_slice(&old);
    let mut out = Vec::with_capacity(fields.len());
    for f in &fields {
        let reply = match f.op {
            FieldOp::Get => read_field(&value, f),
            FieldOp::Set(n) | FieldOp::IncrBy(n) => {
                let set = matches!(f.op, FieldOp::Set(_));
                if f.signed {
                    let old = get_signed(&value, f.offset, f.bits);
                    let result = if set {
                        signed_result(n, 0, f.bits, f.overflow)
                    } else {
                        signed_result(old, n, f.bits, f.overflow)
                    };
                    match result {
                        Some(v) => {
                            set_bits(&mut value, f.offset, f.bits, v as u64);
                            Reply::Int(if set { old } else { v })
                        }
                        None => Reply::Nil,
                    }
                } else {
                    let old = get_unsigned(&value, f.offset, f.bits);
                    let result = if set {
                        unsigned_result(n as u64, 0, f.bits, f.overflow)
                    } else {
                        unsigned_result(old, n, f.bits, f.overflow)
                    };
                    match result {
                        Some(v) => {
                            set_bits(&mut value, f.offset, f.bits, v);
                            Reply::Int(if set { old as i64 } else { v as i64 })
                        }
                        None => Reply::Nil,
                    }
                }
            }
        };
        out.push(reply);
    }
    match store_raw(store, slot, key, value, expire_at, now) {
        Ok(()) => Reply::Array(out),
        Err(e) => e,
    }
}

fn read_field(value: &[u8], f: &Field) -> Reply {
    if f.signed {
        Reply::Int(get_signed(value, f.offset, f.bits))
    } else {
        Reply::Int(get_unsigned(value, f.offset, f.bits) as i64)
    }
}

/// BITFIELD with only GET (and OVERFLOW) subcommands reads; with SET or
/// INCRBY (or anything it cannot read) it reads and writes, as Redis's
/// `bitfieldGetKeys`.
fn bitfield_key_use(args: &[Bytes], _key: usize) -> u8 {
    let mut i = 2;
    while i < args.len() {
        let left = args.len() - i - 1;
        if is(&args[i], "get") && left >= 2 {
            i += 3;
        } else if is(&args[i], "overflow") && left >= 1 {
            i += 2;
        } else {
            return perm::ALL;
        }
    }
    perm::READ
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_bits_in_partial_bytes() {
        let v = [0xffu8, 0x0f, 0x80];
        assert_eq!(count_bits(&v, 0, 23), 13);
        assert_eq!(count_bits(&v, 4, 11), 4);
        assert_eq!(count_bits(&v, 12, 16), 5);
        assert_eq!(count_bits(&v, 17, 23), 0);
    }

    #[test]
    fn clamps_like_redis() {
        assert_eq!(clamp(0, -1, 3), Some((0, 2)));
        assert_eq!(clamp(-100, 100, 3), Some((0, 2)));
        assert_eq!(clamp(2, 1, 3), None);
        assert_eq!(clamp(0, -1, 0), None);
    }
}
