//! Multi-key commands whose keys live on several nodes: one sub-command per
//! node, sent in parallel, merged in key order; prefix commands stop at the
//! first miss of any node; a chain is stored run by run in chain order.

use std::sync::atomic::Ordering::Relaxed;

use bytes::Bytes;
use kvtier_cluster::topology::View;
use kvtier_cluster::Cluster;
use kvtier_protocol::Reply;

use super::copies::{answer_from_copies, count_reads, write_through};
use super::forward::{forward, lane};
use crate::commands::{block, execute, flags, is, parse_int, Args, Client, CommandSpec, Spread};

/// Runs a command whose keys live on several nodes, as its spec's
/// [`Spread`] says.
pub async fn coordinate(client: &mut Client, spec: &'static CommandSpec, args: Args) -> Reply {
    let Some(cluster) = client.shard.shared.cluster.clone() else {
        return Reply::error("ERR This instance has cluster support disabled");
    };
    cluster.stats.coordinated.fetch_add(1, Relaxed);
    let view = client.shard.view();
    let mut spreading = Spreading {
        client,
        cluster: &cluster,
        view: &view,
        spec,
    };
    let s = &mut spreading;
    match spec.spread {
        Spread::ByPosition if spec.keys.movable() => s.mexists(&args).await,
        Spread::ByPosition => s.positional(&args).await,
        Spread::AllOk => s.all_ok(&args).await,
        Spread::Sum => s.sum(&args).await,
        Spread::PrefixCount => s.prefix_len(&args).await,
        Spread::PrefixValues => s.mget_prefix(&args).await,
        Spread::Blocks => s.mset_block(&args).await,
        Spread::No => Reply::error("CROSSSLOT Keys in request don't hash to the same slot"),
    }
}

/// One node's share of a command: which of the command's keys (by their
/// position among the keys) it holds, and the sub-command it gets.
struct Part {
    node: usize,
    positions: Vec<usize>,
    args: Vec<Bytes>,
}

/// A command being spread over the nodes that own its keys.
struct Spreading<'c> {
    client: &'c mut Client,
    cluster: &'c Cluster,
    view: &'c View,
    spec: &'static CommandSpec,
}

impl Spreading<'_> {
    /// Runs the parts: remote ones sent first (in parallel), or answered
    /// here when this node holds a copy of every key of the part (a hot
    /// prefix spread over nodes is then read here whole), then local ones
    /// here, then the remote replies collected. Replies in part order.
    async fn run_parts(&mut self, parts: &[Part], blocking: bool) -> Vec<Reply> {
        let (cluster, view, spec) = (self.cluster, self.view, self.spec);
        let client = &mut *self.client;
        let mut pending: Vec<Option<Reply>> = {
            let copies = client.shard.copies.borrow();
            let from_copies =
                spec.from_copies.is_some() && client.multi.is_none() && !copies.is_empty();
            parts
                .iter()
                .map(|p| {
                    (view.me != Some(p.node)).then(|| {
                        let mut args = p.args.clone();
                        if from_copies {
                            let part = Args::of(spec, args);
                            if let Some(reply) = answer_from_copies(&copies, spec, &part) {
                                cluster.stats.replica_hits.fetch_add(1, Relaxed);
                                return reply;
                            }
                            args = part.into_vec();
                        }
                        forward(
                            &client.shard,
                            cluster,
                            view,
                            p.node,
                            lane(client),
                            args,
                            blocking,
                        )
                    })
                })
                .collect()
        };
        let mut out = Vec::with_capacity(parts.len());
        for (part, remote) in parts.iter().zip(pending.iter_mut()) {
            let reply = match remote.take() {
                Some(r) => r,
                None => {
                    // This node's part: as any command run here (counted
                    // for hot keys, hand-off pulls and deletes, dropped
                    // copies).
                    let args = Args::of(spec, part.args.clone());
                    if spec.has(flags::READONLY) {
                        count_reads(client, cluster, &args);
                    }
                    let handed = !super::handoff::handoff_keys(cluster, view, &args).is_empty();
                    if handed && spec.has(flags::READONLY) {
                        super::handoff::handoff_read(client, spec, args).await
                    } else if handed && spec.has(flags::WRITE) {
                        super::handoff::handoff_write(client, spec, args).await
                    } else if spec.has(flags::WRITE) && cluster.has_replicated() {
                        write_through(client, spec, args).await
                    } else {
                        execute(client, spec, args).await
                    }
                }
            };
            out.push(reply);
        }
        let mut resolved = Vec::with_capacity(out.len());
        for r in out {
            resolved.push(if r.has_pending() {
                r.resolve().await
            } else {
                r
            });
        }
        resolved
    }

    /// MGET: values placed back by key position.
    async fn positional(&mut self, args: &Args) -> Reply {
        let parts = split(self.view, args, 1);
        let replies = self.run_parts(&parts, false).await;
        merge_positions(args.len() - 1, &parts, replies)
    }

    /// MSET over several nodes: OK when every node stored its pairs.
    async fn all_ok(&mut self, args: &Args) -> Reply {
        if args.len().is_multiple_of(2) {
            return crate::commands::arity_error("mset");
        }
        let parts = split(self.view, args, 2);
        let replies = self.run_parts(&parts, false).await;
        first_error(&replies).unwrap_or(Reply::status("OK"))
    }

    /// DEL, UNLINK, EXISTS, TOUCH: the nodes' counts added up.
    async fn sum(&mut self, args: &Args) -> Reply {
        let parts = split(self.view, args, 1);
        let replies = self.run_parts(&parts, false).await;
        if let Some(e) = first_error(&replies) {
            return e;
        }
        Reply::Int(
            replies
                .iter()
                .map(|r| if let Reply::Int(n) = r { *n } else { 0 })
                .sum(),
        )
    }

    /// MEXISTS: per-key answers placed by position.
    async fn mexists(&mut self, args: &Args) -> Reply {
        if let Err(e) = exact_count(args) {
            return e;
        }
        let (n, parts) = counted_parts(self.view, args, 1, |_| Vec::new());
        let replies = self.run_parts(&parts, false).await;
        merge_positions(n, &parts, replies)
    }

    /// PREFIXLEN: each node's own leading run, the earliest miss wins.
    async fn prefix_len(&mut self, args: &Args) -> Reply {
        let hold = match block::parse_prefixlen(args) {
            Ok((_, hold)) => hold.map(|ms| Bytes::from(ms.to_string())),
            Err(e) => return e,
        };
        // Each node holds its own keys (charged there to this node's link).
        let (n, parts) = counted_parts(self.view, args, 1, |_| match &hold {
            Some(ms) => vec![Bytes::from_static(b"HOLD"), ms.clone()],
            None => Vec::new(),
        });
        let replies = self.run_parts(&parts, false).await;
        if let Some(e) = first_error(&replies) {
            return e;
        }
        let counts: Vec<usize> = replies
            .iter()
            .map(|r| {
                if let Reply::Int(c) = r {
                    (*c).max(0) as usize
                } else {
                    0
                }
            })
            .collect();
        Reply::Int(first_miss(n, &parts, |i| counts[i]) as i64)
    }

    /// MGETPREFIX: each node returns its own leading run (waiting, with BLOCK,
    /// for its share of the first MIN keys); the prefix ends at the earliest
    /// miss of any node, and MAXBYTES is applied to the merged prefix.
    async fn mget_prefix(&mut self, args: &Args) -> Reply {
        let read = match block::parse_prefix_read(args) {
            Ok(r) => r,
            Err(e) => return e,
        };
        let n = read.end - 2;
        let max_bytes = read.max_bytes;
        let block = read.block_ms.map(|ms| Bytes::from(ms.to_string()));
        let wanted = read.min;
        let node_opts = |positions: &[usize]| {
            let mut o = Vec::new();
            if let Some(b) = max_bytes {
                o.push(Bytes::from_static(b"MAXBYTES"));
                o.push(Bytes::from(b.to_string()));
            }
            if let Some(ms) = &block {
                let share = positions.iter().filter(|&&p| p < wanted).count();
                if share > 0 {
                    o.push(Bytes::from_static(b"BLOCK"));
                    o.push(ms.clone());
                    o.push(Bytes::from_static(b"MIN"));
                    o.push(Bytes::from(share.to_string()));
                }
            }
            o
        };
        let (_, parts) = counted_parts(self.view, args, 1, node_opts);
        let replies = self.run_parts(&parts, block.is_some()).await;
        if let Some(e) = first_error(&replies) {
            return e;
        }
        let runs: Vec<Vec<Reply>> = replies
            .into_iter()
            .map(|r| {
                if let Reply::Array(items) = r {
                    items
                } else {
                    Vec::new()
                }
            })
            .collect();
        let end = first_miss(n, &parts, |i| runs[i].len());
        let mut out = vec![Reply::Nil; end];
        for (part, run) in parts.iter().zip(runs) {
            for (&p, item) in part.positions.iter().zip(run) {
                if p < end {
                    out[p] = item;
                }
            }
        }
        if let Some(limit) = max_bytes {
            let mut total = 0u64;
            let keep = out
                .iter()
                .take_while(|r| {
                    total += if let Reply::Bulk(b) = r {
                        b.len() as u64
                    } else {
                        0
                    };
                    total <= limit
                })
                .count();
            out.truncate(keep);
        }
        Reply::Array(out)
    }

    /// MSETBLOCK: without CHAIN, every node stores its blocks in parallel; with
    /// CHAIN, runs of consecutive blocks of one node are stored one run after
    /// another, each naming the previous run's last block as its parent, so
    /// the chain is published in order across nodes too.
    async fn mset_block(&mut self, args: &Args) -> Reply {
        let (n, end) = match block::parse_count(args, 2, "numblocks") {
            Ok(found) => found,
            Err(e) => return e,
        };
        let parsed = match block::parse_set_options(args, end) {
            Ok(o) => o,
            Err(e) => return e,
        };
        // The options every node gets: expiry and REPLACE as sent (CHAIN,
        // PARENT and PARTIAL are per run).
        let opts = &args[end..];
        let mut common = Vec::new();
        let mut i = 0;
        while i < opts.len() {
            if is(&opts[i], "ex") || is(&opts[i], "px") {
                common.extend_from_slice(&opts[i..i + 2]);
                i += 2;
            } else if is(&opts[i], "chain") {
                let named = opts.get(i + 1).is_some_and(|w| is(w, "parent")) && i + 2 < opts.len();
                i += if named { 3 } else { 1 };
            } else if is(&opts[i], "partial") {
                i += 1;
            } else {
                common.push(opts[i].clone()); // REPLACE
                i += 1;
            }
        }
        let (chain, mut parent) = (parsed.chain, parsed.parent);
        if !chain {
            let (_, parts) = counted_parts(self.view, args, 2, |_| common.clone());
            let replies = self.run_parts(&parts, false).await;
            return merge_positions(n, &parts, replies);
        }
        // Runs of consecutive blocks on one node, stored in chain order.
        let mut out = vec![Reply::Nil; n];
        let mut start = 0;
        while start < n {
            let key = |p: usize| &args[2 + 2 * p];
            let node = self.view.owner(args.slot(2 + 2 * start));
            let mut end = start + 1;
            while end < n && self.view.owner(args.slot(2 + 2 * end)) == node {
                end += 1;
            }
            let part = Part {
                node,
                positions: (start..end).collect(),
                args: chain_run(
                    &args[0],
                    &args[2 + 2 * start..2 + 2 * end],
                    &common,
                    parent.as_ref(),
                    parsed.partial && end == n,
                ),
            };
            let reply = self
                .run_parts(std::slice::from_ref(&part), false)
                .await
                .pop()
                .unwrap_or(Reply::Nil);
            if reply.is_error() {
                return reply;
            }
            let Reply::Array(items) = reply else {
                return Reply::error("ERR cluster: unexpected reply from a peer");
            };
            let failed = items.iter().any(|r| matches!(r, Reply::Int(n) if *n < 0));
            for (p, item) in (start..end).zip(items) {
                out[p] = item;
            }
            if failed {
                // As on one node: a chain is not stored past a block that
                // could not be stored.
                for slot in out.iter_mut().skip(end) {
                    *slot = Reply::Int(-1);
                }
                return Reply::Array(out);
            }
            parent = Some(key(end - 1).clone());
            start = end;
        }
        Reply::Array(out)
    }
}

/// Groups key positions `0..count` by owner, in order of first appearance.
fn group(view: &View, count: usize, slot: impl Fn(usize) -> u16) -> Vec<(usize, Vec<usize>)> {
    let mut groups: Vec<(usize, Vec<usize>)> = Vec::new();
    for p in 0..count {
        let node = view.owner(slot(p));
        match groups.iter_mut().find(|(n, _)| *n == node) {
            Some((_, ps)) => ps.push(p),
            None => groups.push((node, vec![p])),
        }
    }
    groups
}

fn first_error(replies: &[Reply]) -> Option<Reply> {
    replies.iter().find(|r| r.is_error()).cloned()
}

/// The parts of `NAME key [key ...]` (`step` 1) or `NAME key value [key
/// value ...]` (`step` 2): each node gets the name and its own keys (with
/// their values), in order.
fn split(view: &View, args: &Args, step: usize) -> Vec<Part> {
    let count = (args.len() - 1) / step;
    group(view, count, |p| args.slot(1 + p * step))
        .into_iter()
        .map(|(node, positions)| {
            let mut sub = Vec::with_capacity(1 + positions.len() * step);
            sub.push(args[0].clone());
            for &p in &positions {
                sub.extend_from_slice(&args[1 + p * step..1 + (p + 1) * step]);
            }
            Part {
                node,
                positions,
                args: sub,
            }
        })
        .collect()
}

/// Places each part's array items at their key positions.
fn merge_positions(count: usize, parts: &[Part], replies: Vec<Reply>) -> Reply {
    if let Some(e) = first_error(&replies) {
        return e;
    }
    let mut out = vec![Reply::Nil; count];
    for (part, reply) in parts.iter().zip(replies) {
        let Reply::Array(items) = reply else {
            return Reply::error("ERR cluster: unexpected reply from a peer");
        };
        for (&p, item) in part.positions.iter().zip(items) {
            out[p] = item;
        }
    }
    Reply::Array(out)
}

/// The parts of a `NAME numkeys key [key ...] [options]` command; `opts`
/// gives each node's options from its key positions.
fn counted_parts(
    view: &View,
    args: &Args,
    step: usize,
    opts: impl Fn(&[usize]) -> Vec<Bytes>,
) -> (usize, Vec<Part>) {
    let n = parse_int(&args[1]).unwrap_or(0).max(0) as usize;
    let parts = group(view, n, |p| args.slot(2 + p * step))
        .into_iter()
        .map(|(node, positions)| {
            let mut sub = vec![args[0].clone(), Bytes::from(positions.len().to_string())];
            for &p in &positions {
                sub.extend_from_slice(&args[2 + p * step..2 + p * step + step]);
            }
            sub.extend(opts(&positions));
            Part {
                node,
                positions,
                args: sub,
            }
        })
        .collect();
    (n, parts)
}

/// `numkeys` keys and nothing after them, with the single-node errors.
fn exact_count(args: &[Bytes]) -> Result<(), Reply> {
    let (_, end) = block::parse_count(args, 1, "numkeys")?;
    if end != args.len() {
        return Err(crate::commands::syntax_error());
    }
    Ok(())
}

/// The first key position (of `n`) that some node lacks: each node knows
/// how many of its own keys, in order, are present.
fn first_miss(n: usize, parts: &[Part], present: impl Fn(usize) -> usize) -> usize {
    parts
        .iter()
        .enumerate()
        .filter_map(|(i, part)| part.positions.get(present(i)).copied())
        .min()
        .unwrap_or(n)
}

/// The MSETBLOCK CHAIN a node is sent for one run of a chain's blocks
/// (`pairs`: keys and values): the options every node gets, the previous
/// run's last block as PARENT, and PARTIAL only with the chain's last run
/// (the request's final partial block is the chain's last, not each run's).
fn chain_run(
    cmd: &Bytes,
    pairs: &[Bytes],
    common: &[Bytes],
    parent: Option<&Bytes>,
    partial: bool,
) -> Vec<Bytes> {
    let mut sub = vec![cmd.clone(), Bytes::from((pairs.len() / 2).to_string())];
    sub.extend_from_slice(pairs);
    sub.extend_from_slice(common);
    sub.push(Bytes::from_static(b"CHAIN"));
    if let Some(p) = parent {
        sub.push(Bytes::from_static(b"PARENT"));
        sub.push(p.clone());
    }
    if partial {
        sub.push(Bytes::from_static(b"PARTIAL"));
    }
    sub
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_last_run_of_a_chain_is_sent_partial() {
        let b = |s: &'static str| Bytes::from_static(s.as_bytes());
        let (cmd, pairs, common) = (
            b("MSETBLOCK"),
            [b("k2"), b("v2"), b("k3"), b("v")],
            [b("EX"), b("9")],
        );
        let parent = b("k1");
        let middle = chain_run(&cmd, &pairs, &common, Some(&parent), false);
        let last = chain_run(&cmd, &pairs, &common, Some(&parent), true);
        let words = |v: &[Bytes]| {
            v.iter()
                .map(|w| String::from_utf8_lossy(w).into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert_eq!(
            words(&middle),
            "MSETBLOCK 2 k2 v2 k3 v EX 9 CHAIN PARENT k1"
        );
        assert_eq!(
            words(&last),
            "MSETBLOCK 2 k2 v2 k3 v EX 9 CHAIN PARENT k1 PARTIAL"
        );
        let first = chain_run(&cmd, &pairs[..2], &[], None, false);
        assert_eq!(words(&first), "MSETBLOCK 1 k2 v2 CHAIN");
    }
}
