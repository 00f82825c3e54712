//! Slot placement: consistent hashing of the 16384 hash slots over the
//! cluster's nodes in contiguous ranges, with bounded loads.
//!
//! Every node computes the same map from the same node list, with no
//! coordination. Each live node puts [`TOKENS`] tokens on the ring of slots
//! (fixed hashes of its id); the arc of slots ending at a token goes to the
//! token's node; a node over [`LOAD_CAP`] times its fair share hands some
//! of its arcs on to the next nodes clockwise with room. So the map is at
//! most `TOKENS × N` ranges (CLUSTER SLOTS stays small), no node holds more
//! than 1.4× the mean, and a join or a loss moves little more than 1/N of
//! the slots (docs/cluster.md has the measured table).
//!
//! Hot-key replicas follow rendezvous (highest random weight) order over
//! groups of [`REPLICA_GROUP`] slots, skipping the owner, so a range's
//! replicas change only at group boundaries.

use std::fmt;

use kvtier_store::slot::SLOTS;

/// One member of the cluster as configured: `ID@HOST:PORT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// Node id (`--node-id`), unique in the cluster.
    pub id: String,
    /// Host clients and peers connect to.
    pub host: String,
    /// RESP port.
    pub port: u16,
    /// `host:port`, formed once (every forwarded command names it).
    addr: String,
    /// The id, shared (replies on their way from this node name it).
    name: std::sync::Arc<str>,
}

impl Node {
    /// A member `id` at `host:port`.
    pub fn new(id: &str, host: &str, port: u16) -> Node {
        Node {
            id: id.to_string(),
            host: host.to_string(),
            port,
            addr: format!("{host}:{port}"),
            name: std::sync::Arc::from(id),
        }
    }

    /// The id, as a shared handle (no allocation).
    pub fn name(&self) -> std::sync::Arc<str> {
        std::sync::Arc::clone(&self.name)
    }

    /// `host:port`, as MOVED and peers use it.
    pub fn addr(&self) -> &str {
        &self.addr
    }
}

impl fmt::Display for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}:{}", self.id, self.host, self.port)
    }
}

/// Where clients reach a node: what topology replies and MOVED name. By
/// default the node's list address; `--cluster-announce-ip`, `-port` and
/// `-hostname` change it (a node behind NAT or a published container port),
/// and peers learn it from the node's pings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// Address (`--cluster-announce-ip`, else the list's host).
    pub ip: String,
    /// Port (`--cluster-announce-port`, else the list's port).
    pub port: u16,
    /// `--cluster-announce-hostname`; empty when unset.
    pub hostname: String,
}

impl Endpoint {
    /// The endpoint of `node` when it announces nothing.
    pub fn of(node: &Node) -> Endpoint {
        Endpoint {
            ip: node.host.clone(),
            port: node.port,
            hostname: String::new(),
        }
    }

    /// What clients are told to connect to: the hostname when
    /// `hostname_first` (`--cluster-preferred-endpoint-type hostname`) and
    /// one is set, else the ip.
    pub fn preferred(&self, hostname_first: bool) -> &str {
        if hostname_first && !self.hostname.is_empty() {
            &self.hostname
        } else {
            &self.ip
        }
    }
}

/// Parses `ID@HOST:PORT[,ID@HOST:PORT...]` into nodes sorted by id.
pub fn parse_nodes(list: &str) -> Result<Vec<Node>, String> {
    let mut nodes = Vec::new();
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (id, addr) = item
            .split_once('@')
            .ok_or_else(|| format!("cluster node '{item}': expected ID@HOST:PORT"))?;
        let (host, port) = addr
            .rsplit_once(':')
            .ok_or_else(|| format!("cluster node '{item}': expected ID@HOST:PORT"))?;
        let port: u16 = port
            .parse()
            .ok()
            .filter(|&p| p != 0)
            .ok_or_else(|| format!("cluster node '{item}': invalid port '{port}'"))?;
        let valid_id = !id.is_empty()
            && id.len() <= 64
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
        if !valid_id {
            return Err(format!(
                "cluster node '{item}': the id must be 1 to 64 of [A-Za-z0-9._-]"
            ));
        }
        if host.is_empty() {
            return Err(format!("cluster node '{item}': empty host"));
        }
        if nodes.iter().any(|n: &Node| n.id == id) {
            return Err(format!("cluster node id '{id}' appears twice"));
        }
        nodes.push(Node::new(
            id,
            host.trim_matches(|c| c == '[' || c == ']'),
            port,
        ));
    }
    if nodes.is_empty() {
        return Err("the cluster node list is empty".into());
    }
    nodes.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(nodes)
}

/// The list as `parse_nodes` reads it.
pub fn format_nodes(nodes: &[Node]) -> String {
    nodes
        .iter()
        .map(Node::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// Tokens each live node puts on the ring of slots.
pub const TOKENS: u32 = 20;

/// The most a node holds, as a multiple of the mean (numerator,
/// denominator): 7/5. A tighter cap balances better but moves more on a
/// join (docs/decisions.md).
pub const LOAD_CAP: (usize, usize) = (7, 5);

/// Slots per group of the replica order (64 groups).
pub const REPLICA_GROUP: u16 = 256;

/// A fixed 64-bit hash of `(id, x)`: FNV-1a of the id, mixed with `x` by
/// SplitMix64's finaliser; the same on every node, platform and version.
fn mix(id: &str, x: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in id.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let mut z = h ^ x.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The slot at which the node named `id` puts its token `j`.
pub fn token(id: &str, j: u32) -> u16 {
    // Inputs from 2^32 up: apart from the replica order's.
    (mix(id, (1 << 32) + j as u64) % SLOTS as u64) as u16
}

/// The rendezvous weight of replica group `group` on the node named `id`.
pub fn weight(group: u16, id: &str) -> u64 {
    mix(id, group as u64)
}

/// The owner of every slot when the nodes `live` (indices, ascending) are
/// the live ones among `nodes`.
///
/// 1. Every live node's [`TOKENS`] tokens, sorted, cut the ring into arcs:
///    the arc `(previous token, token]` goes to the token's node.
/// 2. A node holding more than the cap ([`LOAD_CAP`] × the mean) sheds arcs,
///    in an order fixed by a hash of each token, until it is under the cap.
/// 3. Each shed arc, in ring order, goes to the first node clockwise (by the
///    following tokens) with room for it.
///
/// Only overloaded nodes shed, and their order of shedding is fixed, so a
/// join or a loss changes little beyond the slots it must move.
fn place(nodes: &[Node], live: &[usize]) -> Vec<u16> {
    let mut owner = vec![0u16; SLOTS];
    let Some(&first) = live.first() else {
        return owner;
    };
    let mut tokens: Vec<(u16, usize)> = live
        .iter()
        .flat_map(|&i| (0..TOKENS).map(move |j| (token(&nodes[i].id, j), i)))
        .collect();
    tokens.sort_unstable();
    let n = tokens.len();
    // Arcs as (token index, length, node); a token on the previous one's
    // slot has none, and a ring of one position is one whole arc.
    let mut arcs: Vec<(usize, usize, usize)> = Vec::with_capacity(n);
    for (k, &(pos, node)) in tokens.iter().enumerate() {
        let prev = tokens[(k + n - 1) % n].0;
        match (pos as usize + SLOTS - prev as usize) % SLOTS {
            0 if k == 0 && tokens.iter().all(|t| t.0 == pos) => arcs.push((k, SLOTS, node)),
            0 => {}
            len => arcs.push((k, len, node)),
        }
    }
    let cap = (SLOTS * LOAD_CAP.0).div_ceil(LOAD_CAP.1 * live.len());
    let mut load = vec![0usize; nodes.len()];
    for &(_, len, node) in &arcs {
        load[node] += len;
    }
    let mut shed = vec![false; arcs.len()];
    for &i in live {
        if load[i] <= cap {
            continue;
        }
        let mut mine: Vec<(u64, usize)> = arcs
            .iter()
            .enumerate()
            .filter(|(_, a)| a.2 == i)
            .map(|(x, a)| (mix(&nodes[i].id, (1 << 33) + tokens[a.0].0 as u64), x))
            .collect();
        mine.sort_unstable();
        for (_, x) in mine {
            if load[i] <= cap {
                break;
            }
            shed[x] = true;
            load[i] -= arcs[x].1;
        }
    }
    for x in (0..arcs.len()).filter(|&x| shed[x]) {
        let (k, len, _) = arcs[x];
        let node = (1..n)
            .map(|d| tokens[(k + d) % n].1)
            .find(|&i| load[i] + len <= cap)
            .unwrap_or_else(|| {
                // No node has room for the whole arc: the least loaded.
                live.iter()
                    .copied()
                    .min_by_key(|&i| load[i])
                    .unwrap_or(first)
            });
        load[node] += len;
        arcs[x].2 = node;
    }
    for (k, len, node) in arcs {
        let pos = tokens[k].0 as usize;
        for step in 0..len {
            owner[(pos + SLOTS - step) % SLOTS] = node as u16;
        }
    }
    owner
}

/// One consistent picture of the cluster: the node list of an epoch, which
/// nodes are live, and the slot map that follows.
#[derive(Debug, Clone)]
pub struct View {
    /// Configuration epoch of the node list (CLUSTER SETNODES raises it).
    pub epoch: u64,
    /// Members, sorted by id.
    pub nodes: Vec<Node>,
    /// Whether each member answers (this node always does).
    pub alive: Vec<bool>,
    /// This node's index, if it is a member.
    pub me: Option<usize>,
    /// Where clients reach each member (announced, or its list address).
    pub endpoints: Vec<Endpoint>,
    /// Owner (index into `nodes`) of every slot.
    owner: Vec<u16>,
    /// Slots this node gained from a node that is still live, for the
    /// warm hand-off: `(previous owner, since)` by slot (`NO_HANDOFF`:
    /// none); empty when there are none.
    handoff: Vec<(u16, u64)>,
    /// When this node began rejoining after being cut off (Unix ms; 0:
    /// it is not): every node that comes back meanwhile re-aims its
    /// hand-off at where its slots went without it.
    pub rejoined_at: u64,
    /// [`View::ranges`] computed once (clients ask for CLUSTER SLOTS often).
    ranges_cache: std::sync::OnceLock<(usize, Ranges)>,
}

/// No hand-off for a slot.
const NO_HANDOFF: u16 = u16::MAX;

/// Slot ranges with their holders, owner first.
pub type Ranges = Vec<(u16, u16, Vec<usize>)>;

impl View {
    /// Computes the slot map of `nodes` with the given liveness; clients
    /// reach every node at its list address.
    pub fn new(epoch: u64, nodes: Vec<Node>, alive: Vec<bool>, me: Option<usize>) -> View {
        let endpoints = nodes.iter().map(Endpoint::of).collect();
        View::with_endpoints(epoch, nodes, alive, me, endpoints)
    }

    /// [`View::new`] with the endpoints clients are told (one per node).
    pub fn with_endpoints(
        epoch: u64,
        nodes: Vec<Node>,
        alive: Vec<bool>,
        me: Option<usize>,
        endpoints: Vec<Endpoint>,
    ) -> View {
        let mut view = View {
            epoch,
            endpoints,
            nodes,
            alive,
            me,
            owner: Vec::new(),
            handoff: Vec::new(),
            rejoined_at: 0,
            ranges_cache: std::sync::OnceLock::new(),
        };
        let live: Vec<usize> = (0..view.nodes.len()).filter(|&i| view.alive[i]).collect();
        view.owner = place(&view.nodes, &live);
        view
    }

    /// This view with this node counted out: where its slots went while it
    /// was away (its own start, the others' partition or pause).
    pub fn without_me(&self) -> View {
        let mut alive = self.alive.clone();
        if let Some(me) = self.me {
            alive[me] = false;
        }
        View::with_endpoints(
            self.epoch,
            self.nodes.clone(),
            alive,
            self.me,
            self.endpoints.clone(),
        )
    }

    /// Whether this node was cut off in this view: it heard at most half
    /// of the members (itself included), so it was the side of a partition
    /// or pause that did not stay whole.
    pub fn was_cut_off(&self) -> bool {
        let live = self.alive.iter().filter(|a| **a).count();
        self.nodes.len() > 1 && live * 2 <= self.nodes.len()
    }

    /// Whether this node owned a slot in `before` that it does not own
    /// here.
    pub fn loses(&self, before: &View) -> bool {
        let (Some(now), Some(then)) = (self.me, before.me) else {
            return false;
        };
        if self.nodes[now].id != before.nodes[then].id {
            return false;
        }
        (0..SLOTS as u16).any(|s| before.owner(s) == then && self.owner(s) != now)
    }

    /// Whether a node that `before` counted failed is live here.
    pub fn revives(&self, before: &View) -> bool {
        self.nodes
            .iter()
            .zip(&self.alive)
            .any(|(n, &alive)| alive && before.index_of(&n.id).is_some_and(|i| !before.alive[i]))
    }

    /// Records the warm hand-off after `before`: each slot this node owns
    /// that `before` gave to another node still live here is handed off
    /// from that node since `now_ms`; a hand-off `before` had that is still
    /// within `window_ms` and still applies carries on from its start.
    /// Slots that already have a hand-off here keep it.
    pub fn carry_handoff(&mut self, before: &View, now_ms: u64, window_ms: u64) {
        let Some(me) = self.me else {
            return;
        };
        if window_ms == 0 {
            return;
        }
        // Index here of each node of `before`, if it is live here.
        let live_here: Vec<Option<usize>> = before
            .nodes
            .iter()
            .map(|n| self.index_of(&n.id).filter(|&i| self.alive[i] && i != me))
            .collect();
        let mut handoff = std::mem::take(&mut self.handoff);
        let mut any = !handoff.is_empty();
        if handoff.is_empty() {
            handoff = vec![(NO_HANDOFF, 0); SLOTS];
        }
        for slot in 0..SLOTS as u16 {
            if self.owner(slot) != me || handoff[slot as usize].0 != NO_HANDOFF {
                continue;
            }
            let gained = live_here[before.owner(slot)].map(|prev| (prev, now_ms));
            let carried = before.handoff_from(slot).and_then(|(prev, since)| {
                (now_ms < since.saturating_add(window_ms))
                    .then_some(live_here[prev].map(|p| (p, since)))
                    .flatten()
            });
            // A slot this node owned before has no `gained` (it is not live
            // "elsewhere") and keeps the hand-off it had, if any.
            if let Some((prev, since)) = gained.or(carried) {
                handoff[slot as usize] = (prev as u16, since);
                any = true;
            }
        }
        self.handoff = if any { handoff } else { Vec::new() };
    }

    /// The node `slot` is handed off from and since when (Unix ms), if it
    /// is one this node gained from a live node (the caller checks the
    /// window).
    pub fn handoff_from(&self, slot: u16) -> Option<(usize, u64)> {
        match self.handoff.get(slot as usize) {
            Some(&(prev, since)) if prev != NO_HANDOFF => Some((prev as usize, since)),
            _ => None,
        }
    }

    /// Whether any slot is handed off (within its window or not).
    pub fn has_handoff(&self) -> bool {
        !self.handoff.is_empty()
    }

    /// The node owning `slot`.
    pub fn owner(&self, slot: u16) -> usize {
        self.owner[slot as usize] as usize
    }

    /// Whether this node owns `slot`.
    pub fn owns(&self, slot: u16) -> bool {
        self.me == Some(self.owner(slot))
    }

    /// Live nodes other than the owner in `slot`'s replica order
    /// (rendezvous weight of the slot's group, highest first).
    fn replica_order(&self, slot: u16) -> Vec<usize> {
        let owner = self.owner(slot);
        let group = slot / REPLICA_GROUP;
        let mut live: Vec<(u64, usize)> = (0..self.nodes.len())
            .filter(|&i| self.alive[i] && i != owner)
            .map(|i| (weight(group, &self.nodes[i].id), i))
            .collect();
        live.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        live.into_iter().map(|(_, i)| i).collect()
    }

    /// The `count` nodes a hot key of `slot` is copied to.
    pub fn replicas(&self, slot: u16, count: usize) -> Vec<usize> {
        let mut order = self.replica_order(slot);
        order.truncate(count);
        order
    }

    /// Runs of consecutive slots with the same owner and (`replicas` > 0)
    /// the same replicas: `(first, last, [owner, replicas...])`, as CLUSTER
    /// SLOTS lists them.
    pub fn ranges(&self, replicas: usize) -> Ranges {
        let (cached_for, cached) = self
            .ranges_cache
            .get_or_init(|| (replicas, self.compute_ranges(replicas)));
        if *cached_for == replicas {
            return cached.clone();
        }
        self.compute_ranges(replicas)
    }

    fn compute_ranges(&self, replicas: usize) -> Ranges {
        let mut out: Ranges = Vec::new();
        // Replicas depend on the owner and the group only.
        let mut last_key = None;
        let mut holders = Vec::new();
        for slot in 0..SLOTS as u16 {
            let key = (self.owner(slot), slot / REPLICA_GROUP);
            if last_key != Some(key) {
                last_key = Some(key);
                holders = vec![key.0];
                if replicas > 0 {
                    holders.extend(self.replicas(slot, replicas));
                }
            }
            match out.last_mut() {
                Some((_, last, h)) if *h == holders && *last + 1 == slot => *last = slot,
                _ => out.push((slot, slot, holders.clone())),
            }
        }
        out
    }

    /// Number of slots each node owns.
    pub fn slot_counts(&self) -> Vec<usize> {
        let mut counts = vec![0; self.nodes.len()];
        for &o in &self.owner {
            counts[o as usize] += 1;
        }
        counts
    }

    /// The index of the node named `id`.
    pub fn index_of(&self, id: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.id == id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(ids: &[&str]) -> Vec<Node> {
        let list: Vec<String> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| format!("{id}@127.0.0.1:{}", 7000 + i))
            .collect();
        parse_nodes(&list.join(",")).unwrap()
    }

    fn view(ids: &[&str]) -> View {
        let n = nodes(ids);
        let alive = vec![true; n.len()];
        View::new(1, n, alive, Some(0))
    }

    #[test]
    fn parses_and_rejects_node_lists() {
        let n = parse_nodes("b@10.0.0.2:7001, a@host-a:7000").unwrap();
        assert_eq!(n[0].id, "a");
        assert_eq!(n[0].addr(), "host-a:7000");
        assert_eq!(format_nodes(&n), "a@host-a:7000,b@10.0.0.2:7001");
        for bad in [
            "",
            "a",
            "a@host",
            "a@host:0",
            "a@host:x",
            "@h:1",
            "a@:1",
            "a@h:1,a@h:2",
            "a b@h:1",
        ] {
            assert!(parse_nodes(bad).is_err(), "{bad:?}");
        }
    }

    fn ids(n: usize) -> Vec<String> {
        (1..=n).map(|i| format!("n{i}")).collect()
    }

    fn view_of(ids: &[String]) -> View {
        let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        view(&refs)
    }

    /// Slots whose owner (by id) differs between two views.
    fn moved(a: &View, b: &View) -> usize {
        (0..SLOTS as u16)
            .filter(|&s| a.nodes[a.owner(s)].id != b.nodes[b.owner(s)].id)
            .count()
    }

    #[test]
    fn every_node_computes_the_same_bounded_map() {
        let a = view(&["n1", "n2", "n3"]);
        // Another order of the same list, seen from another node, gives the
        // same map.
        let b = View::new(1, nodes(&["n3", "n1", "n2"]), vec![true; 3], Some(2));
        assert_eq!(moved(&a, &b), 0);
        for n in [1, 2, 3, 10, 100] {
            let v = view_of(&ids(n));
            let counts = v.slot_counts();
            assert_eq!(counts.iter().sum::<usize>(), SLOTS);
            let cap = (SLOTS * LOAD_CAP.0).div_ceil(LOAD_CAP.1 * n);
            assert!(counts.iter().all(|&c| c <= cap), "{n} nodes: {counts:?}");
            assert!(counts.iter().all(|&c| c > 0), "{n} nodes: {counts:?}");
        }
    }

    #[test]
    fn slots_come_in_few_contiguous_ranges() {
        for (n, most) in [(3, 64), (10, 200), (100, 2000)] {
            let ranges = view_of(&ids(n)).ranges(0).len();
            assert!(ranges <= most, "{n} nodes: {ranges} ranges");
            assert!(ranges <= TOKENS as usize * n + 1);
        }
    }

    #[test]
    fn a_join_moves_about_one_nth_of_the_slots_mostly_to_the_newcomer() {
        for n in [3, 10, 100] {
            let before = view_of(&ids(n));
            let after = view_of(&ids(n + 1));
            let newcomer = format!("n{}", n + 1);
            let to_newcomer = (0..SLOTS as u16)
                .filter(|&s| after.nodes[after.owner(s)].id == newcomer)
                .count();
            let moved = moved(&before, &after);
            // About its fair share moves to the newcomer (its tokens' arcs
            // vary); bounded loads shift a little more between the others.
            let fair = SLOTS / (n + 1);
            assert!(moved <= fair * 2, "{n}+1 nodes: {moved} moved, fair {fair}");
            assert!(to_newcomer * 2 >= fair, "{n}+1: newcomer {to_newcomer}");
            assert!(
                moved - to_newcomer <= fair / 2,
                "{n}+1: {moved} moved, {to_newcomer} to it"
            );
        }
    }

    #[test]
    fn a_failed_node_loses_its_slots_and_little_else_moves() {
        for n in [3, 10, 100] {
            let all = view_of(&ids(n));
            let mut alive = vec![true; n];
            alive[1] = false;
            let without = View::new(1, all.nodes.clone(), alive, Some(0));
            assert!((0..SLOTS as u16).all(|s| without.owner(s) != 1));
            let moved = moved(&all, &without);
            let own = all.slot_counts()[1];
            assert!(moved >= own);
            assert!(
                moved <= own * 3 / 2,
                "{n} nodes: {moved} moved, owned {own}"
            );
        }
    }

    #[test]
    fn replicas_skip_the_owner_and_change_only_at_group_edges() {
        let v = view(&["n1", "n2", "n3", "n4"]);
        for s in 0..SLOTS as u16 {
            let r = v.replicas(s, 2);
            assert_eq!(r.len(), 2);
            assert!(!r.contains(&v.owner(s)));
            if s % REPLICA_GROUP != 0 && v.owner(s) == v.owner(s - 1) {
                assert_eq!(r, v.replicas(s - 1, 2));
            }
        }
        assert!(v.ranges(2).len() <= v.ranges(0).len() + (SLOTS / REPLICA_GROUP as usize));
    }

    #[test]
    fn ranges_cover_every_slot_once() {
        let v = view(&["n1", "n2", "n3"]);
        for replicas in [0, 1] {
            let ranges = v.ranges(replicas);
            let mut next = 0u32;
            for (first, last, holders) in &ranges {
                assert_eq!(*first as u32, next);
                assert!(last >= first);
                assert!((*first..=*last).all(|s| v.owner(s) == holders[0]));
                assert_eq!(holders.len(), 1 + replicas);
                next = *last as u32 + 1;
            }
            assert_eq!(next, SLOTS as u32);
        }
    }

    #[test]
    fn a_newcomer_hands_off_its_slots_from_their_previous_owners() {
        let three = view(&["n1", "n2", "n3"]);
        let four_nodes = nodes(&["n1", "n2", "n3", "n4"]);
        let mut newcomer = View::new(1, four_nodes.clone(), vec![true; 4], Some(3));
        let without = newcomer.without_me();
        newcomer.carry_handoff(&without, 1_000, 60_000);
        for s in 0..SLOTS as u16 {
            let from = newcomer.handoff_from(s);
            if newcomer.owns(s) {
                let (prev, since) = from.expect("a gained slot is handed off");
                assert_eq!(newcomer.nodes[prev].id, three.nodes[three.owner(s)].id);
                assert_eq!(since, 1_000);
            } else {
                assert_eq!(from, None);
            }
        }
        // An old node only loses slots, except what bounded loads shift
        // between the old nodes: each of those comes from a live node.
        let mut old = View::new(1, four_nodes, vec![true; 4], Some(0));
        let before = View::new(0, nodes(&["n1", "n2", "n3"]), vec![true; 3], Some(0));
        old.carry_handoff(&before, 2_000, 60_000);
        for s in 0..SLOTS as u16 {
            match old.handoff_from(s) {
                Some((prev, _)) => {
                    assert!(old.owns(s) && !before.owns(s));
                    assert_eq!(old.nodes[prev].id, before.nodes[before.owner(s)].id);
                }
                None => assert!(!old.owns(s) || before.owns(s)),
            }
        }
        // A failed previous owner hands off nothing; a zero window none.
        let mut alive = vec![true; 4];
        alive[1] = false;
        let mut lonely = View::new(1, nodes(&["n1", "n2", "n3", "n4"]), alive, Some(3));
        lonely.carry_handoff(&without, 1_000, 60_000);
        assert!((0..SLOTS as u16)
            .filter_map(|s| lonely.handoff_from(s))
            .all(|(prev, _)| lonely.nodes[prev].id != "n2"));
        let mut off = View::new(1, nodes(&["n1", "n2", "n3", "n4"]), vec![true; 4], Some(3));
        off.carry_handoff(&without, 1_000, 0);
        assert!(!off.has_handoff());
    }

    #[test]
    fn a_revived_node_is_noticed() {
        let all = view(&["n1", "n2", "n3"]);
        let mut alive = vec![true; 3];
        alive[2] = false;
        let split = View::new(1, all.nodes.clone(), alive, Some(0));
        assert!(all.revives(&split));
        assert!(!split.revives(&all));
        assert!(!all.revives(&all));
    }

    #[test]
    fn a_node_hearing_at_most_half_was_cut_off_and_losing_slots_is_seen() {
        let all = view(&["n1", "n2", "n3"]);
        let mut alone = vec![false; 3];
        alone[0] = true;
        let cut = View::new(1, all.nodes.clone(), alone, Some(0));
        assert!(cut.was_cut_off());
        let mut two = vec![true; 3];
        two[2] = false;
        let majority = View::new(1, all.nodes.clone(), two, Some(0));
        assert!(!majority.was_cut_off() && !all.was_cut_off());
        // Alone it owned everything; whole again it loses the others' slots.
        assert!(all.loses(&cut));
        assert!(!cut.loses(&all));
        assert!(!all.loses(&all));
    }
}
