//! Slot placement: the 16384 hash slots over the cluster's nodes in
//! contiguous ranges, balanced, moving only what a change must move.
//!
//! Every node computes the same map from the same node list, with no
//! coordination. The list records when each member joined (the epoch of
//! the CLUSTER SETNODES that added it) and which members left and when, and
//! the map replays that history ([`place`]): a newcomer takes its fair
//! share in pieces cut from the fullest nodes, none cut below
//! [`FLOOR`] of the fair share, and a leaver's ranges are dealt to the
//! emptiest. So a join moves exactly the newcomer's share, a departure
//! exactly the leaver's, no node holds much less than [`FLOOR`] of the
//! mean (0.88 at 100 nodes, after rounding), and the map is a few ranges
//! a node (docs/cluster.md has the measured
//! table). A failed member's slots go back to the nodes it took them
//! from (for the newest member: the map before it joined), until it
//! answers again: nothing else moves.
//!
//! Hot-key replicas follow rendezvous (highest random weight) order over
//! groups of [`REPLICA_GROUP`] slots, skipping the owner, so a range's
//! replicas change only at group boundaries.

use std::cmp::Reverse;
use std::fmt::{self, Write as _};

use kvtier_store::slot::SLOTS;

/// One member of the cluster as configured: `ID@HOST:PORT`, or
/// `ID@HOST:PORT#EPOCH` for one that joined at that epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// Node id (`--node-id`), unique in the cluster.
    pub id: String,
    /// The epoch at which it joined (0: a member from the start), which
    /// orders the joins [`place`] replays.
    pub since: u64,
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
            since: 0,
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

/// A member that left (a CLUSTER SETNODES without it): `~ID#SINCE-UNTIL`.
/// The list keeps it so the map can replay its stay; it is not a member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Left {
    /// Its id.
    pub id: String,
    /// The epoch at which it joined.
    pub since: u64,
    /// The epoch of the list without it.
    pub until: u64,
}

/// A node list as configured and as pings carry it: the members and the
/// members that left.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeList {
    /// Members, sorted by id.
    pub nodes: Vec<Node>,
    /// Members that left, in the order they left (then by id).
    pub left: Vec<Left>,
}

impl NodeList {
    /// The list of epoch `epoch` that CLUSTER SETNODES makes of `given`
    /// when this list is the current one: a member already here keeps its
    /// join epoch, a new one joins at `epoch`, and a member missing from
    /// `given` leaves at `epoch`. What `given` says of joins and departures
    /// is not taken: the cluster's own history is.
    pub fn succeeded_by(&self, given: NodeList, epoch: u64) -> NodeList {
        let mut nodes = given.nodes;
        for n in &mut nodes {
            n.since = self
                .nodes
                .iter()
                .find(|old| old.id == n.id)
                .map_or(epoch, |old| old.since);
        }
        let mut left = self.left.clone();
        left.extend(
            self.nodes
                .iter()
                .filter(|old| !nodes.iter().any(|n| n.id == old.id))
                .map(|old| Left {
                    id: old.id.clone(),
                    since: old.since,
                    until: epoch,
                }),
        );
        NodeList { nodes, left }
    }

    /// How much history the list records, to settle two lists of one
    /// epoch: the one with more wins, so a node started with a plain list
    /// takes the cluster's. Then the one with fewer members: a newcomer
    /// started with the grown list at the cluster's epoch does not impose
    /// it (replayed without history it would move most slots); it waits
    /// outside the list until SETNODES makes it join. Then the greater text.
    pub fn precedence(&self) -> (u64, usize, Reverse<usize>, String) {
        let joins = self
            .nodes
            .iter()
            .fold(0u64, |sum, n| sum.saturating_add(n.since));
        (
            joins,
            self.left.len(),
            Reverse(self.nodes.len()),
            format_list(self),
        )
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

/// Parses `ID@HOST:PORT[#EPOCH],...` into nodes sorted by id (a list
/// with departures is refused: use [`parse_list`]).
pub fn parse_nodes(list: &str) -> Result<Vec<Node>, String> {
    let parsed = parse_list(list)?;
    if let Some(l) = parsed.left.first() {
        return Err(format!("cluster node '~{}': not a member", l.id));
    }
    Ok(parsed.nodes)
}

/// Parses a node list: members `ID@HOST:PORT`, each with `#EPOCH` when it
/// joined after the start, and members that left, `~ID#SINCE-UNTIL`.
pub fn parse_list(list: &str) -> Result<NodeList, String> {
    let mut out = NodeList::default();
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let expected = || format!("cluster node '{item}': expected ID@HOST:PORT");
        let epoch = |e: &str| {
            e.parse::<u64>()
                .map_err(|_| format!("cluster node '{item}': invalid epoch '{e}'"))
        };
        if let Some(gone) = item.strip_prefix('~') {
            let bad = || format!("cluster node '{item}': expected ~ID#SINCE-UNTIL");
            let (id, span) = gone.split_once('#').ok_or_else(bad)?;
            let (since, until) = span.split_once('-').ok_or_else(bad)?;
            let (since, until) = (epoch(since)?, epoch(until)?);
            if !valid_id(id) || since >= until {
                return Err(bad());
            }
            out.left.push(Left {
                id: id.to_string(),
                since,
                until,
            });
            continue;
        }
        let (item_node, since) = match item.split_once('#') {
            Some((node, e)) => (node, epoch(e)?),
            None => (item, 0),
        };
        let (id, addr) = item_node.split_once('@').ok_or_else(expected)?;
        let (host, port) = addr.rsplit_once(':').ok_or_else(expected)?;
        let port: u16 = port
            .parse()
            .ok()
            .filter(|&p| p != 0)
            .ok_or_else(|| format!("cluster node '{item}': invalid port '{port}'"))?;
        if !valid_id(id) {
            return Err(format!(
                "cluster node '{item}': the id must be 1 to 64 of [A-Za-z0-9._-]"
            ));
        }
        if host.is_empty() {
            return Err(format!("cluster node '{item}': empty host"));
        }
        if out.nodes.iter().any(|n: &Node| n.id == id) {
            return Err(format!("cluster node id '{id}' appears twice"));
        }
        let mut node = Node::new(id, host.trim_matches(|c| c == '[' || c == ']'), port);
        node.since = since;
        out.nodes.push(node);
    }
    if out.nodes.is_empty() {
        return Err("the cluster node list is empty".into());
    }
    out.nodes.sort_by(|a, b| a.id.cmp(&b.id));
    out.left
        .sort_by(|a, b| (a.until, a.since, &a.id).cmp(&(b.until, b.since, &b.id)));
    Ok(out)
}

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

/// The members as `parse_nodes` reads them.
pub fn format_nodes(nodes: &[Node]) -> String {
    nodes
        .iter()
        .map(|n| match n.since {
            0 => n.to_string(),
            since => format!("{n}#{since}"),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The list as `parse_list` reads it (what pings carry).
pub fn format_list(list: &NodeList) -> String {
    let mut out = format_nodes(&list.nodes);
    for l in &list.left {
        let _ = write!(out, ",~{}#{}-{}", l.id, l.since, l.until);
    }
    out
}

/// The least a join or a departure leaves any node with, as a share of
/// the fair share then (numerator, denominator): 9/10. A higher floor
/// balances better but cuts the newcomer's share from more nodes (more
/// ranges); docs/decisions/0026-cluster-placement-history-replayed.md has
/// the trade.
pub const FLOOR: (usize, usize) = (9, 10);

/// Stripes of the ring that repeat one layout: a node holds the same share
/// of every quarter of the slots, so its slots spread evenly over its own
/// shards (a node splits its slots over its shards in contiguous ranges).
pub const STRIPES: usize = 4;

/// Positions in one stripe.
const SPAN: usize = SLOTS / STRIPES;

/// How far each stripe's layout is turned from the one before. CRC16 moves
/// keys that differ in a last digit by multiples of 4096 slots plus a
/// little, so stripes with one layout unturned would put `key:0`..`key:9`
/// on the same node or two.
const STRIPE_TURN: usize = 1031;

/// The position of `slot` in its stripe's layout.
fn position(slot: usize) -> usize {
    (slot % SPAN + (slot / SPAN) * STRIPE_TURN) % SPAN
}

/// Slots per cell in which a failed member's slots pass to live ones.
pub const FAILOVER_CELL: u16 = 64;

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

/// The rendezvous weight of replica group `group` on the node named `id`.
pub fn weight(group: u16, id: &str) -> u64 {
    mix(id, group as u64)
}

/// The rendezvous weight of failover cell `cell` on the node named `id`.
fn failover_weight(cell: u16, id: &str) -> u64 {
    // Inputs from 2^32 up: apart from the replica order's.
    mix(id, (1 << 32) + cell as u64)
}

/// The owner of every slot: the history of the list replayed, then the
/// slots of members not `alive` passed to live ones.
///
/// 1. Joins and departures in epoch order (at one epoch, departures first,
///    then joins by id; the first member holds every position), on the
///    [`SPAN`] positions of one stripe (every one of the [`STRIPES`] has
///    this layout, turned):
///    * a newcomer takes the fair share of the nodes present with it,
///      cut from the node holding most (its largest range, from the end)
///      down to at most [`FLOOR`] of that share, then the next fullest;
///    * a leaver's ranges, largest first, are dealt in pieces to the node
///      holding least, each filled up to the fair share.
/// 2. Each slot a failed member holds goes back to its latest earlier
///    holder in the replay that is live; a slot with none (the first
///    member's own), by cells of [`FAILOVER_CELL`] slots, to the live
///    member of highest [`failover_weight`] for the cell.
///
/// A join moves only the newcomer's share to it and a departure only the
/// leaver's slots; a failure or a recovery only the failed node's slots.
/// The newest member failing (or not yet heard from) leaves the map its
/// list had before it joined, which is where its hand-off reads from.
fn place(list: &NodeList, alive: &[bool]) -> Vec<u16> {
    let nodes = &list.nodes;
    // Who holds each slot in the replay: members by index, then leavers.
    let mut owner = vec![0u16; SLOTS];
    let live: Vec<usize> = (0..nodes.len()).filter(|&i| alive[i]).collect();
    if live.is_empty() {
        return owner;
    }
    // Events as (epoch, 0: leave / 1: join, id, who).
    let members = nodes.len();
    let mut events: Vec<(u64, u8, &str, usize)> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.since, 1, n.id.as_str(), i))
        .collect();
    for (j, l) in list.left.iter().enumerate() {
        events.push((l.since, 1, &l.id, members + j));
        events.push((l.until, 0, &l.id, members + j));
    }
    events.sort_unstable();
    let mut replay = Replay {
        ranges: Vec::new(),
        load: vec![0; members + list.left.len()],
        present: Vec::new(),
        joined: vec![0; members + list.left.len()],
        joins: 0,
        head: vec![NO_EARLIER; SPAN],
        earlier: Vec::new(),
    };
    for (_, kind, _, who) in events {
        if kind == 1 {
            replay.join(who);
        } else {
            replay.leave(who);
        }
    }
    let holds = |who: usize| who < members && alive[who];
    let mut stripe = vec![0u16; SPAN];
    for &(start, len, who) in &replay.ranges {
        for (at, held) in stripe.iter_mut().enumerate().skip(start).take(len) {
            *held = if holds(who) {
                who as u16
            } else {
                replay
                    .earlier_live(at, holds)
                    .map_or(u16::MAX, |h| h as u16)
            };
        }
    }
    for (slot, o) in owner.iter_mut().enumerate() {
        *o = stripe[position(slot)];
    }
    // Slots no live member held before.
    for cell in 0..(SLOTS / FAILOVER_CELL as usize) {
        let slots = cell * FAILOVER_CELL as usize..(cell + 1) * FAILOVER_CELL as usize;
        if !owner[slots.clone()].contains(&u16::MAX) {
            continue;
        }
        let heir = live
            .iter()
            .copied()
            .max_by_key(|&i| (failover_weight(cell as u16, &nodes[i].id), usize::MAX - i))
            .expect("some member is live");
        for o in owner[slots].iter_mut().filter(|o| **o == u16::MAX) {
            *o = heir as u16;
        }
    }
    owner
}

/// The state of [`place`]'s replay.
struct Replay {
    /// `(first position, length, holder)`, in order.
    ranges: Vec<(usize, usize, usize)>,
    /// Positions each holder (member, then leaver) holds.
    load: Vec<usize>,
    /// Holders present, in the order they joined.
    present: Vec<usize>,
    /// When each holder joined, counted in joins (ties go to the earliest).
    joined: Vec<usize>,
    joins: usize,
    /// Each position's earlier holders, newest first: `head[at]` indexes
    /// `earlier`, whose entries are `(holder, index of the one before)`.
    head: Vec<u32>,
    earlier: Vec<(u16, u32)>,
}

/// The end of a slot's earlier holders.
const NO_EARLIER: u32 = u32::MAX;

impl Replay {
    fn join(&mut self, who: usize) {
        self.joined[who] = self.joins;
        self.joins += 1;
        self.present.push(who);
        if self.present.len() == 1 {
            self.ranges = vec![(0, SPAN, who)];
            self.load[who] = SPAN;
            return;
        }
        let k = self.present.len();
        let floor = SPAN * FLOOR.0 / (FLOOR.1 * k);
        let mut need = SPAN / k;
        while need > 0 {
            // The fullest present node (the earliest to join on a tie).
            let Some(&donor) = self
                .present
                .iter()
                .filter(|&&p| p != who)
                .max_by_key(|&&p| (self.load[p], usize::MAX - self.joined[p]))
            else {
                return;
            };
            let give = need.min(self.load[donor].saturating_sub(floor));
            if give == 0 {
                return;
            }
            self.pass(donor, who, give);
            need -= give;
        }
    }

    fn leave(&mut self, who: usize) {
        self.present.retain(|&p| p != who);
        let k = self.present.len();
        if k == 0 {
            return; // every slot stays with it; `place` passes them on
        }
        let fair = SPAN.div_ceil(k);
        while self.load[who] > 0 {
            // The emptiest present node (the earliest to join on a tie).
            let heir = *self
                .present
                .iter()
                .min_by_key(|&&p| (self.load[p], self.joined[p]))
                .expect("k > 0");
            let give = self.load[who].min(fair.saturating_sub(self.load[heir]).max(1));
            self.pass(who, heir, give);
        }
    }

    /// The latest holder of position `at` before its current one for
    /// which `holds` is true.
    fn earlier_live(&self, at: usize, holds: impl Fn(usize) -> bool) -> Option<usize> {
        let mut entry = self.head[at];
        while entry != NO_EARLIER {
            let (who, next) = self.earlier[entry as usize];
            if holds(who as usize) {
                return Some(who as usize);
            }
            entry = next;
        }
        None
    }

    /// Moves `count` positions from `from` to `to`, cut from the end of
    /// `from`'s largest ranges (the first of equal ones).
    fn pass(&mut self, from: usize, to: usize, mut count: usize) {
        while count > 0 {
            let Some(x) = (0..self.ranges.len())
                .filter(|&x| self.ranges[x].2 == from)
                .max_by_key(|&x| (self.ranges[x].1, usize::MAX - x))
            else {
                return;
            };
            let (start, len, _) = self.ranges[x];
            let cut = count.min(len);
            for at in start + len - cut..start + len {
                self.earlier.push((from as u16, self.head[at]));
                self.head[at] = (self.earlier.len() - 1) as u32;
            }
            if cut == len {
                self.ranges[x].2 = to;
            } else {
                self.ranges[x].1 = len - cut;
                self.ranges.insert(x + 1, (start + len - cut, cut, to));
            }
            self.load[from] -= cut;
            self.load[to] += cut;
            count -= cut;
            self.merge_around(x);
        }
    }

    /// Joins the ranges around `x` that have one holder.
    fn merge_around(&mut self, x: usize) {
        let lo = x.saturating_sub(1);
        let hi = (x + 2).min(self.ranges.len() - 1);
        for y in (lo..hi).rev() {
            if self.ranges[y].2 == self.ranges[y + 1].2 {
                self.ranges[y].1 += self.ranges[y + 1].1;
                self.ranges.remove(y + 1);
            }
        }
    }
}

/// One consistent picture of the cluster: the node list of an epoch, which
/// nodes are live, and the slot map that follows.
#[derive(Debug, Clone)]
pub struct View {
    /// Configuration epoch of the node list (CLUSTER SETNODES raises it).
    pub epoch: u64,
    /// Members, sorted by id.
    pub nodes: Vec<Node>,
    /// Members that left (the map replays their stay).
    pub left: Vec<Left>,
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
    /// Computes the slot map of `nodes` (none of them left) with the given
    /// liveness; clients reach every node at its list address.
    pub fn new(epoch: u64, nodes: Vec<Node>, alive: Vec<bool>, me: Option<usize>) -> View {
        let endpoints = nodes.iter().map(Endpoint::of).collect();
        let list = NodeList {
            nodes,
            left: Vec::new(),
        };
        View::with_list(epoch, list, alive, me, endpoints)
    }

    /// The view of a whole list, with the endpoints clients are told (one
    /// per member).
    pub fn with_list(
        epoch: u64,
        list: NodeList,
        alive: Vec<bool>,
        me: Option<usize>,
        endpoints: Vec<Endpoint>,
    ) -> View {
        let owner = place(&list, &alive);
        View {
            epoch,
            endpoints,
            nodes: list.nodes,
            left: list.left,
            alive,
            me,
            owner,
            handoff: Vec::new(),
            rejoined_at: 0,
            ranges_cache: std::sync::OnceLock::new(),
        }
    }

    /// This view with this node counted out: where its slots went while it
    /// was away (its own start, the others' partition or pause).
    pub fn without_me(&self) -> View {
        let mut alive = self.alive.clone();
        if let Some(me) = self.me {
            alive[me] = false;
        }
        View::with_list(
            self.epoch,
            self.list(),
            alive,
            self.me,
            self.endpoints.clone(),
        )
    }

    /// The node list of this view.
    pub fn list(&self) -> NodeList {
        NodeList {
            nodes: self.nodes.clone(),
            left: self.left.clone(),
        }
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

    /// `ids` as members, with the list's history: `join` (id, epoch)
    /// joined later, and `left` (id, since, until) left.
    fn history(ids: &[String], join: &[(&str, u64)], left: &[(&str, u64, u64)]) -> NodeList {
        let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        let mut nodes = nodes(&refs);
        for n in &mut nodes {
            n.since = join.iter().find(|j| j.0 == n.id).map_or(0, |j| j.1);
        }
        let left = left
            .iter()
            .map(|&(id, since, until)| Left {
                id: id.into(),
                since,
                until,
            })
            .collect();
        NodeList { nodes, left }
    }

    fn view_with(list: NodeList, alive: Vec<bool>) -> View {
        let endpoints = list.nodes.iter().map(Endpoint::of).collect();
        View::with_list(2, list, alive, Some(0), endpoints)
    }

    /// Least and most slots of a live node, as shares of the mean.
    fn spread(v: &View) -> (f64, f64) {
        let counts: Vec<usize> = v
            .slot_counts()
            .into_iter()
            .zip(&v.alive)
            .filter(|(_, a)| **a)
            .map(|(c, _)| c)
            .collect();
        let mean = SLOTS as f64 / counts.len() as f64;
        let min = *counts.iter().min().unwrap() as f64 / mean;
        let max = *counts.iter().max().unwrap() as f64 / mean;
        (min, max)
    }

    #[test]
    fn every_node_computes_the_same_balanced_map() {
        let a = view(&["n1", "n2", "n3"]);
        // Another order of the same list, seen from another node, gives the
        // same map.
        let b = View::new(1, nodes(&["n3", "n1", "n2"]), vec![true; 3], Some(2));
        assert_eq!(moved(&a, &b), 0);
        for n in [1, 2, 3, 10, 100, 300] {
            let v = view_of(&ids(n));
            assert_eq!(v.slot_counts().iter().sum::<usize>(), SLOTS);
            let (min, max) = spread(&v);
            assert!(min >= 0.85 && max <= 1.15, "{n} nodes: {min} .. {max}");
            // Keys that differ in a last digit (CRC16 sets them about 4096
            // slots apart) spread over the nodes as any keys would.
            let held = |tag: &str| {
                let mut held = vec![0; n];
                for i in 0..24 {
                    let slot = kvtier_store::slot::key_slot(format!("{tag}:{i}").as_bytes());
                    held[v.owner(slot)] += 1;
                }
                held
            };
            if n == 3 {
                for tag in ["prompt:block", "prefix", "t1", "key"] {
                    assert!(held(tag).iter().all(|&h| h >= 3), "{tag}: {:?}", held(tag));
                }
            }
            // Each node's slots split evenly over two or four shards.
            for shards in [2, 4] {
                for node in 0..n {
                    let per_shard: Vec<usize> = (0..shards)
                        .map(|k| {
                            let part = k * SLOTS / shards..(k + 1) * SLOTS / shards;
                            part.filter(|&s| v.owner(s as u16) == node).count()
                        })
                        .collect();
                    assert!(
                        per_shard.iter().all(|&c| c == per_shard[0]),
                        "{per_shard:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn slots_come_in_few_contiguous_ranges() {
        for (n, most) in [(3, 64), (10, 200), (100, 2000)] {
            let ranges = view_of(&ids(n)).ranges(0).len();
            assert!(ranges <= most, "{n} nodes: {ranges} ranges");
        }
    }

    #[test]
    fn a_join_moves_the_newcomers_share_to_it_and_nothing_else() {
        for n in [3, 10, 100] {
            let before = view_of(&ids(n));
            let newcomer = format!("n{}", n + 1);
            // Whatever its name: it joins last.
            for name in [newcomer.as_str(), "a0"] {
                let mut all = ids(n);
                all.push(name.to_string());
                let after = view_with(history(&all, &[(name, 2)], &[]), vec![true; n + 1]);
                let to_newcomer = (0..SLOTS as u16)
                    .filter(|&s| after.nodes[after.owner(s)].id == name)
                    .count();
                assert_eq!(moved(&before, &after), to_newcomer, "{n}+1");
                assert_eq!(to_newcomer, STRIPES * (SPAN / (n + 1)), "{n}+1");
                let (min, max) = spread(&after);
                assert!(min >= 0.85 && max <= 1.25, "{n}+1: {min} .. {max}");
            }
        }
    }

    #[test]
    fn a_departure_deals_the_leavers_slots_and_nothing_else() {
        for n in [3, 10, 100] {
            let before = view_of(&ids(n));
            for gone in [1, n / 2, n - 1] {
                let name = &before.nodes[gone].id;
                let rest: Vec<String> = ids(n).into_iter().filter(|id| id != name).collect();
                let list = before.list().succeeded_by(history(&rest, &[], &[]), 2);
                assert_eq!(list.left.len(), 1);
                let after = view_with(list, vec![true; n - 1]);
                let theirs = before.slot_counts()[gone];
                assert_eq!(moved(&before, &after), theirs, "{n}-1");
                let (min, max) = spread(&after);
                assert!(min >= 0.85 && max <= 1.2, "{n}-1: {min} .. {max}");
                // Then a join takes only its share.
                let mut again = after.list();
                let mut newcomer = Node::new("z9", "127.0.0.1", 9999);
                newcomer.since = 3;
                again.nodes.push(newcomer);
                let joined = view_with(again, vec![true; n]);
                let to_it = (0..SLOTS as u16)
                    .filter(|&s| joined.nodes[joined.owner(s)].id == "z9")
                    .count();
                assert_eq!(moved(&after, &joined), to_it, "{n}-1+1");
            }
        }
    }

    #[test]
    fn a_failed_node_loses_its_slots_and_nothing_else_moves() {
        for n in [2, 3, 10, 100] {
            let all = view_of(&ids(n));
            let mut alive = vec![true; n];
            alive[1] = false;
            let without = View::new(1, all.nodes.clone(), alive, Some(0));
            assert!((0..SLOTS as u16).all(|s| without.owner(s) != 1));
            assert_eq!(moved(&all, &without), all.slot_counts()[1], "{n} nodes");
        }
        // Nobody live: the first member holds every slot.
        let none = View::new(1, view(&["n1", "n2"]).nodes, vec![false; 2], None);
        assert_eq!(none.slot_counts(), vec![SLOTS, 0]);
    }

    #[test]
    fn setnodes_keeps_the_history_and_lists_round_trip() {
        let start = history(&ids(3), &[], &[]);
        let mut four = ids(4);
        four.retain(|id| id != "n2");
        let next = start.succeeded_by(history(&four, &[("n1", 7)], &[]), 5);
        // n1 keeps its start, n4 joins at 5, n2 leaves at 5.
        let since: Vec<(&str, u64)> = next
            .nodes
            .iter()
            .map(|n| (n.id.as_str(), n.since))
            .collect();
        assert_eq!(since, vec![("n1", 0), ("n3", 0), ("n4", 5)]);
        assert_eq!(
            next.left,
            vec![Left {
                id: "n2".into(),
                since: 0,
                until: 5
            }]
        );
        let text = format_list(&next);
        assert_eq!(
            text,
            "n1@127.0.0.1:7000,n3@127.0.0.1:7001,n4@127.0.0.1:7002#5,~n2#0-5"
        );
        assert_eq!(parse_list(&text).unwrap(), next);
        assert!(parse_nodes(&text).is_err(), "a departure is not a member");
        // More history takes precedence at one epoch.
        assert!(next.precedence() > history(&ids(4), &[], &[]).precedence());
        for bad in [
            "~n2#5-5,n1@h:1",
            "~n2#6-5,n1@h:1",
            "~n2,n1@h:1",
            "n1@h:1#x",
            "~n 2#0-1,n1@h:1",
        ] {
            assert!(parse_list(bad).is_err(), "{bad:?}");
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
        // An old node only loses slots: nothing to hand off.
        let mut old = View::new(1, four_nodes, vec![true; 4], Some(0));
        let before = View::new(0, nodes(&["n1", "n2", "n3"]), vec![true; 3], Some(0));
        old.carry_handoff(&before, 2_000, 60_000);
        assert!(!old.has_handoff());
        assert!((0..SLOTS as u16).all(|s| !old.owns(s) || before.owns(s)));
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
