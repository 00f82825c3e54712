//! The registry: every family's commands in one table (the top of the
//! command layer: it names the families, none of them names it). The
//! connection looks commands up here and hands each [`Client`] the table,
//! so the families that list or look up commands (COMMAND, ACL DRYRUN,
//! CLUSTER HANDOFF) read it from there.

use std::sync::OnceLock;

use super::CommandTable;
use super::{
    acl, bitmap, block, client, cluster, connection, keyspace, server, string, transaction,
};

/// The process-wide command table.
pub fn table() -> &'static CommandTable {
    static TABLE: OnceLock<CommandTable> = OnceLock::new();
    TABLE.get_or_init(|| {
        let families = [
            string::COMMANDS,
            bitmap::COMMANDS,
            block::COMMANDS,
            keyspace::COMMANDS,
            connection::COMMANDS,
            client::COMMANDS,
            acl::COMMANDS,
            cluster::COMMANDS,
            server::COMMANDS,
            transaction::COMMANDS,
        ];
        CommandTable::new(families.iter().flat_map(|f| f.iter()).collect())
    })
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::commands::{docs, Args, Found, Handler};
    use crate::shard::slot::key_slot;

    #[test]
    fn table_is_consistent() {
        let t = table();
        for c in &t.all {
            assert_eq!(c.name, c.name.to_ascii_lowercase(), "{}", c.name);
            assert!(c.arity != 0, "{}", c.name);
            if matches!(c.handler, Handler::Key(_)) {
                assert!(c.keys.first > 0, "{} routes by key but has none", c.name);
            }
            if matches!(c.handler, Handler::Parent) {
                assert!(!c.subcommands.is_empty(), "{}", c.name);
            }
            for s in c.subcommands {
                assert!(s.name.starts_with(&format!("{}|", c.name)), "{}", s.name);
            }
            docs::parse_syntax(c.syntax).unwrap_or_else(|e| panic!("{}: {e}", c.name));
        }
        assert!(t.get(b"GET").is_some());
        assert!(t.get(b"gEt").is_some());
        assert!(t.get(b"nope").is_none());
    }

    #[test]
    fn key_indexes_follow_spec() {
        let t = table();
        let args =
            |s: &str| -> Vec<Bytes> { s.split(' ').map(|w| Bytes::from(w.to_string())).collect() };
        let keys = |cmd: &str| {
            t.get(cmd.split(' ').next().unwrap().as_bytes())
                .unwrap()
                .key_indexes(&args(cmd))
        };
        assert_eq!(keys("mset a 1 b 2"), Some(vec![1, 3]));
        assert_eq!(keys("del a b c"), Some(vec![1, 2, 3]));
        assert_eq!(keys("get a"), Some(vec![1]));
        assert_eq!(keys("ping"), Some(Vec::new()));
        assert_eq!(keys("mgetprefix 2 a b maxbytes 9"), Some(vec![2, 3]));
        assert_eq!(keys("msetblock 2 a 1 b 2 chain"), Some(vec![2, 4]));
        assert_eq!(keys("mgetprefix 3 a b"), None);
        assert_eq!(keys("msetblock 3 a 1 b 2"), None);
        assert_eq!(keys("prefixlen 0 a"), None);
        assert_eq!(keys("mexists x a"), None);
    }

    #[test]
    fn args_carry_the_slots_of_their_keys() {
        let t = table();
        let list =
            |s: &str| -> Vec<Bytes> { s.split(' ').map(|w| Bytes::from(w.to_string())).collect() };
        for cmd in [
            "get k1",
            "mset a 1 b 2",
            "mgetprefix 2 x y maxbytes 9",
            "ping",
        ] {
            let spec = t.get(cmd.split(' ').next().unwrap().as_bytes()).unwrap();
            let args = Args::of(spec, list(cmd));
            for i in 1..args.len() {
                assert_eq!(args.slot(i), key_slot(&args[i]), "{cmd}: argument {i}");
            }
        }
        let spec = t.get(b"get").unwrap();
        assert!(matches!(
            Args::of(spec, list("get k1")).keys.0,
            Found::One([(1, _)])
        ));
        let spec = t.get(b"mget").unwrap();
        let args = Args::of(spec, list("mget a b"));
        assert!(matches!(args.keys.0, Found::Each { .. }));
        let keys: Vec<usize> = args.keys.iter().map(|&(i, _)| i).collect();
        assert_eq!(keys, [1, 2]);
    }
}
