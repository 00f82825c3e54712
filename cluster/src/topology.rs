//! Slot placement: rendezvous (highest random weight) hashing of the 16384
//! hash slots over the cluster's nodes.
//!
//! Every node computes the same map from the same node list, with no
//! coordination: slot `s` belongs to the live node with the highest
//! `weight(s, id)`. Adding a node moves exactly the slots where the newcomer
//! scores highest (about 1/N of them); removing one moves only its own slots,
//! each to the node that scored second for it. The same order (highest
//! first) names a slot's replicas: the next nodes after the owner.

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

/// The rendezvous weight of `slot` on the node named `id`: a fixed function
/// (FNV-1a of the id, mixed with the slot by SplitMix64's finaliser), the
/// same on every node, platform and version.
pub fn weight(slot: u16, id: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in id.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let mut z = h ^ (slot as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
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
    /// Owner (index into `nodes`) of every slot.
    owner: Vec<u16>,
    /// [`View::ranges`] computed once (clients ask for CLUSTER SLOTS often).
    ranges_cache: std::sync::OnceLock<(usize, Ranges)>,
}

/// Slot ranges with their holders, owner first.
pub type Ranges = Vec<(u16, u16, Vec<usize>)>;

impl View {
    /// Computes the slot map of `nodes` with the given liveness.
    pub fn new(epoch: u64, nodes: Vec<Node>, alive: Vec<bool>, me: Option<usize>) -> View {
        let mut view = View {
            epoch,
            nodes,
            alive,
            me,
            owner: Vec::new(),
            ranges_cache: std::sync::OnceLock::new(),
        };
        view.owner = (0..SLOTS as u16)
            .map(|slot| view.order(slot).first().copied().unwrap_or(0) as u16)
            .collect();
        view
    }

    /// The node owning `slot`.
    pub fn owner(&self, slot: u16) -> usize {
        self.owner[slot as usize] as usize
    }

    /// Whether this node owns `slot`.
    pub fn owns(&self, slot: u16) -> bool {
        self.me == Some(self.owner(slot))
    }

    /// Live nodes in `slot`'s rendezvous order: owner first, then its
    /// replicas.
    pub fn order(&self, slot: u16) -> Vec<usize> {
        let mut live: Vec<(u64, usize)> = (0..self.nodes.len())
            .filter(|&i| self.alive[i])
            .map(|i| (weight(slot, &self.nodes[i].id), i))
            .collect();
        live.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        live.into_iter().map(|(_, i)| i).collect()
    }

    /// The `count` nodes after the owner in `slot`'s order.
    pub fn replicas(&self, slot: u16, count: usize) -> Vec<usize> {
        self.order(slot).into_iter().skip(1).take(count).collect()
    }

    /// Runs of consecutive slots with the same owner and replicas:
    /// `(first, last, [owner, replicas...])`, as CLUSTER SLOTS lists them.
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
        for slot in 0..SLOTS as u16 {
            let mut holders = self.order(slot);
            holders.truncate(1 + replicas);
            match out.last_mut() {
                Some((_, last, h)) if *h == holders && *last + 1 == slot => *last = slot,
                _ => out.push((slot, slot, holders)),
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

    #[test]
    fn every_node_computes_the_same_balanced_map() {
        let a = view(&["n1", "n2", "n3"]);
        // Another order of the same list gives the same map.
        let b = View::new(1, nodes(&["n3", "n1", "n2"]), vec![true; 3], Some(2));
        assert!((0..SLOTS as u16).all(|s| a.nodes[a.owner(s)].id == b.nodes[b.owner(s)].id));
        for count in a.slot_counts() {
            // 16384 / 3 = 5461; rendezvous hashing is within a few percent.
            assert!((4900..6000).contains(&count), "{count}");
        }
    }

    #[test]
    fn adding_a_node_moves_only_the_slots_it_gains() {
        let three = view(&["n1", "n2", "n3"]);
        let four = view(&["n1", "n2", "n3", "n4"]);
        let mut moved = 0;
        for s in 0..SLOTS as u16 {
            let before = &three.nodes[three.owner(s)].id;
            let after = &four.nodes[four.owner(s)].id;
            if before != after {
                assert_eq!(after, "n4", "slot {s} moved between old nodes");
                moved += 1;
            }
        }
        assert!((3500..4700).contains(&moved), "{moved} slots moved");
    }

    #[test]
    fn a_failed_node_passes_its_slots_to_the_next_in_order() {
        let all = view(&["n1", "n2", "n3"]);
        let mut alive = vec![true; 3];
        alive[1] = false;
        let without = View::new(1, all.nodes.clone(), alive, Some(0));
        for s in 0..SLOTS as u16 {
            let order = all.order(s);
            let expect = if order[0] == 1 { order[1] } else { order[0] };
            assert_eq!(without.owner(s), expect);
            assert_ne!(without.owner(s), 1);
        }
        assert_eq!(all.replicas(7, 2).len(), 2);
        assert!(!all.replicas(7, 2).contains(&all.owner(7)));
    }

    #[test]
    fn ranges_cover_every_slot_once() {
        let v = view(&["n1", "n2", "n3"]);
        let ranges = v.ranges(1);
        let mut next = 0u32;
        for (first, last, holders) in &ranges {
            assert_eq!(*first as u32, next);
            assert!(last >= first);
            assert_eq!(holders[0], v.owner(*first));
            assert_eq!(holders.len(), 2);
            next = *last as u32 + 1;
        }
        assert_eq!(next, SLOTS as u32);
    }
}
