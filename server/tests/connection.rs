//! Connection and server commands: PING, ECHO, HELLO, AUTH, QUIT, RESET,
//! SELECT, CLIENT, COMMAND, CONFIG, INFO, DBSIZE, FLUSH*, TIME, LASTSAVE,
//! WAIT, FUNCTION/SCRIPT FLUSH and SHUTDOWN. Error texts are Redis 7's.

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// HELLO's fields, whether it came as a RESP3 map or a RESP2 flat array.
fn hello_fields(reply: &Resp) -> Vec<(String, Resp)> {
    match reply {
        Resp::Map(pairs) => pairs.iter().map(|(k, v)| (k.text(), v.clone())).collect(),
        Resp::Array(Some(flat)) => flat
            .chunks(2)
            .map(|p| (p[0].text(), p[1].clone()))
            .collect(),
        other => panic!("HELLO reply {other:?}"),
    }
}

#[test]
fn ping_echo_select_unknown() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    assert_eq!(c.run("PING"), status("PONG"));
    assert_eq!(c.run("PING hello"), bulk("hello"));
    assert_eq!(c.run("PING a b"), arity("ping"));
    assert_eq!(c.run("ECHO hi"), bulk("hi"));
    assert_eq!(c.cmd(&[b"ECHO", b"\x00\r\n"]), bulk(b"\x00\r\n"));
    assert_eq!(c.run("ECHO"), arity("echo"));
    assert_eq!(c.run("ECHO a b"), arity("echo"));
    assert_eq!(c.run("SELECT 0"), ok());
    for db in ["1", "16", "-1"] {
        assert_eq!(
            c.run(&format!("SELECT {db}")),
            err("ERR DB index is out of range")
        );
    }
    assert_eq!(
        c.run("SELECT abc"),
        err("ERR value is not an integer or out of range")
    );
    assert_eq!(c.run("SELECT"), arity("select"));
    assert_eq!(
        c.run("foo a b"),
        err("ERR unknown command 'foo', with args beginning with: 'a' 'b' ")
    );
    assert_eq!(
        c.run("foo"),
        err("ERR unknown command 'foo', with args beginning with: ")
    );
    assert_eq!(c.run("PING"), status("PONG"), "still open after errors");
}

#[test]
fn hello_protocols_and_errors() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    let id = c.run("CLIENT ID").int();
    let hello2 = hello_fields(&c.run("HELLO 2"));
    let names: Vec<&str> = hello2.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        names,
        ["server", "version", "proto", "id", "mode", "role", "modules"]
    );
    assert_eq!(hello2[0].1, bulk("redis"));
    assert!(hello2[1].1.text().starts_with("7."));
    assert_eq!(hello2[2].1, int(2));
    assert_eq!(hello2[3].1, int(id));
    assert_eq!(hello2[4].1, bulk("standalone"));
    assert_eq!(hello2[5].1, bulk("master"));
    assert_eq!(hello2[6].1, array(vec![]));
    // RESP3 from here on: maps and nulls.
    let hello3 = c.run("HELLO 3 SETNAME myname");
    assert!(matches!(hello3, Resp::Map(_)), "{hello3:?}");
    assert_eq!(hello_fields(&hello3)[2].1, int(3));
    assert_eq!(c.run("CLIENT GETNAME"), bulk("myname"));
    assert_eq!(c.run("GET nokey"), Resp::Null);
    assert!(matches!(c.run("CONFIG GET maxmemory"), Resp::Map(_)));
    assert!(
        matches!(c.run("HELLO"), Resp::Map(_)),
        "HELLO alone keeps 3"
    );
    // Back to RESP2.
    assert!(matches!(c.run("HELLO 2"), Resp::Array(_)));
    assert_eq!(c.run("GET nokey"), nil());

    let noproto = err("NOPROTO unsupported protocol version");
    assert_eq!(c.run("HELLO 4"), noproto);
    assert_eq!(c.run("HELLO 1"), noproto);
    assert_eq!(
        c.run("HELLO abc"),
        err("ERR Protocol version is not an integer or out of range")
    );
    for (line, opt) in [
        ("HELLO 3 foo", "foo"),
        ("HELLO 3 AUTH", "AUTH"),
        ("HELLO 3 AUTH default", "AUTH"),
        ("HELLO 2 SETNAME", "SETNAME"),
    ] {
        assert_eq!(
            c.run(line),
            err(&format!("ERR Syntax error in HELLO option '{opt}'")),
            "{line}"
        );
    }
    assert_eq!(
        c.cmd(&[b"HELLO", b"2", b"SETNAME", b"a b"]),
        err("ERR Client names cannot contain spaces, newlines or special characters.")
    );
    // Without requirepass the default user takes any password.
    assert!(matches!(
        c.run("HELLO 2 AUTH default anything"),
        Resp::Array(_)
    ));
    assert_eq!(
        c.run("HELLO 2 AUTH bob pass"),
        err("WRONGPASS invalid username-password pair or user is disabled.")
    );
    assert_eq!(
        c.run("AUTH pass"),
        err("ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?")
    );
    assert_eq!(c.run("AUTH default pass"), ok());
    assert_eq!(c.run("AUTH a b c"), err("ERR syntax error"));
    assert_eq!(c.run("PING"), status("PONG"));
}

#[test]
fn auth_with_requirepass() {
    let server = Server::start(&["--requirepass", "s3cret"]);
    let mut c = server.raw();
    let noauth = err("NOAUTH Authentication required.");
    assert_eq!(c.run("PING"), noauth);
    assert_eq!(c.run("GET a"), noauth);
    assert_eq!(c.run("SET a b"), noauth);
    assert_eq!(c.run("CLIENT ID x"), arity("client|id"), "arity first");
    assert_eq!(
        c.run("nosuch a"),
        err("ERR unknown command 'nosuch', with args beginning with: 'a' ")
    );
    assert_eq!(
        c.run("HELLO 3"),
        err("NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time")
    );
    let wrongpass = err("WRONGPASS invalid username-password pair or user is disabled.");
    assert_eq!(c.run("AUTH wrong"), wrongpass);
    assert_eq!(c.run("AUTH default wrong"), wrongpass);
    assert_eq!(c.run("AUTH bob s3cret"), wrongpass);
    assert_eq!(c.run("HELLO 3 AUTH default wrong"), wrongpass);
    assert_eq!(c.run("AUTH"), arity("auth"));
    assert_eq!(c.run("PING"), noauth, "still not authenticated");
    assert_eq!(c.run("AUTH s3cret"), ok());
    assert_eq!(c.run("SET a b"), ok());
    assert_eq!(c.run("GET a"), bulk("b"));
    // RESET drops the authentication.
    assert_eq!(c.run("RESET"), status("RESET"));
    assert_eq!(c.run("GET a"), noauth);
    assert_eq!(c.run("AUTH default s3cret"), ok());
    assert_eq!(c.run("GET a"), bulk("b"));

    // HELLO with AUTH authenticates and switches protocol in one step.
    let mut d = server.raw();
    let hello = d.run("HELLO 3 AUTH default s3cret SETNAME svc");
    assert!(matches!(hello, Resp::Map(_)), "{hello:?}");
    assert_eq!(d.run("GET a"), bulk("b"));
    assert_eq!(d.run("CLIENT GETNAME"), bulk("svc"));

    // Unauthenticated clients may not send big requests (Redis's limits).
    let mut e = server.raw();
    e.send(b"*11\r\n");
    assert_eq!(
        e.read(),
        err("ERR Protocol error: unauthenticated multibulk length")
    );
    e.assert_closed();
    let mut f = server.raw();
    f.send(b"*2\r\n$4\r\nAUTH\r\n$16385\r\n");
    assert_eq!(
        f.read(),
        err("ERR Protocol error: unauthenticated bulk length")
    );
    f.assert_closed();

    // The redis crate authenticates from the URL.
    let url = format!("redis://:s3cret@127.0.0.1:{}/", server.port);
    let mut con = connect_redis(&url);
    let v: String = redis::cmd("GET").arg("a").query(&mut con).unwrap();
    assert_eq!(v, "b");
    let url = format!("redis://:s3cret@127.0.0.1:{}/?protocol=resp3", server.port);
    let mut con = connect_redis(&url);
    let v: String = redis::cmd("GET").arg("a").query(&mut con).unwrap();
    assert_eq!(v, "b");
    let bad = redis::Client::open(format!("redis://:nope@127.0.0.1:{}/", server.port))
        .unwrap()
        .get_connection_with_timeout(Duration::from_secs(10));
    assert!(bad.is_err(), "a wrong password fails to connect");
}

#[test]
fn quit_and_reset() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    assert_eq!(c.run("SET k v"), ok());
    // Pipelined after QUIT: never executed.
    c.send(&[encode(&[b"QUIT"]), encode(&[b"SET", b"k", b"changed"])].concat());
    assert_eq!(c.read(), ok());
    c.assert_closed();
    let mut d = server.raw();
    assert_eq!(d.run("GET k"), bulk("v"));

    assert_eq!(d.run("CLIENT SETNAME before"), ok());
    assert_eq!(d.run("CLIENT NO-EVICT on"), ok());
    assert!(matches!(d.run("HELLO 3"), Resp::Map(_)));
    assert_eq!(d.run("RESET"), status("RESET"));
    assert_eq!(d.run("CLIENT GETNAME"), nil(), "RESET: name cleared, RESP2");
    let info = d.run("CLIENT INFO").text();
    assert!(info.contains(" resp=2 "), "{info}");
    assert!(info.contains(" flags=N "), "{info}");
    assert_eq!(d.run("PING"), status("PONG"));
}

#[test]
fn client_subcommands() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    let mut other = server.raw();
    let id = c.run("CLIENT ID").int();
    let other_id = other.run("CLIENT ID").int();
    assert!(id > 0 && other_id > 0 && id != other_id);
    assert_eq!(c.run("CLIENT GETNAME"), nil());
    assert_eq!(c.run("CLIENT SETNAME conn-a"), ok());
    assert_eq!(c.run("CLIENT GETNAME"), bulk("conn-a"));
    assert_eq!(c.cmd(&[b"CLIENT", b"SETNAME", b""]), ok());
    assert_eq!(c.run("CLIENT GETNAME"), nil(), "an empty name clears it");
    let bad_name = err("ERR Client names cannot contain spaces, newlines or special characters.");
    assert_eq!(c.cmd(&[b"CLIENT", b"SETNAME", b"a b"]), bad_name);
    assert_eq!(c.cmd(&[b"CLIENT", b"SETNAME", b"a\nb"]), bad_name);
    assert_eq!(c.run("CLIENT SETNAME"), arity("client|setname"));
    assert_eq!(c.run("CLIENT SETNAME conn-a"), ok());
    assert_eq!(c.run("CLIENT SETINFO LIB-NAME mylib"), ok());
    assert_eq!(c.run("CLIENT SETINFO lib-ver 1.2.3"), ok());
    assert_eq!(
        c.cmd(&[b"CLIENT", b"SETINFO", b"LIB-NAME", b"a b"]),
        err("ERR lib-name cannot contain spaces, newlines or special characters.")
    );
    assert_eq!(
        c.run("CLIENT SETINFO foo bar"),
        err("ERR Unrecognized option 'foo'")
    );
    assert_eq!(c.run("CLIENT SETINFO LIB-NAME"), arity("client|setinfo"));
    assert_eq!(c.run("CLIENT NO-EVICT on"), ok());
    assert_eq!(c.run("CLIENT NO-TOUCH on"), ok());
    let info = c.run("CLIENT INFO").text();
    for part in [
        &format!("id={id} ") as &str,
        " name=conn-a ",
        " lib-name=mylib",
        " lib-ver=1.2.3",
        " cmd=client|info ",
        " resp=2 ",
        " db=0 ",
    ] {
        assert!(info.contains(part), "{part:?} in {info:?}");
    }
    let flags = info_field(&info.replace(' ', "\n").replace('=', ":"), "flags").unwrap();
    assert!(flags.contains('e') && flags.contains('T'), "{flags}");
    assert_eq!(c.run("CLIENT NO-EVICT off"), ok());
    assert_eq!(c.run("CLIENT NO-TOUCH off"), ok());
    assert_eq!(c.run("CLIENT NO-EVICT maybe"), err("ERR syntax error"));
    assert_eq!(c.run("CLIENT NO-TOUCH maybe"), err("ERR syntax error"));

    let list = c.run("CLIENT LIST").text();
    assert_eq!(list.lines().count(), 2, "{list}");
    assert!(list.contains(&format!("id={id} ")) && list.contains(&format!("id={other_id} ")));
    let only = c.run(&format!("CLIENT LIST ID {other_id}")).text();
    assert_eq!(only.lines().count(), 1);
    assert!(only.starts_with(&format!("id={other_id} ")));
    assert_eq!(c.run("CLIENT LIST TYPE normal").text().lines().count(), 2);
    assert_eq!(c.run("CLIENT LIST TYPE pubsub"), bulk(""));
    assert_eq!(
        c.run("CLIENT LIST TYPE foo"),
        err("ERR Unknown client type 'foo'")
    );
    assert_eq!(c.run("CLIENT LIST ID abc"), err("ERR Invalid client ID"));
    assert_eq!(c.run("CLIENT LIST foo"), err("ERR syntax error"));

    // CLIENT KILL and its errors.
    assert_eq!(c.run("CLIENT KILL 1.2.3.4:5"), err("ERR No such client"));
    let positive = err("ERR client-id should be greater than 0");
    assert_eq!(c.run("CLIENT KILL ID abc"), positive);
    assert_eq!(c.run("CLIENT KILL ID 0"), positive);
    assert_eq!(c.run("CLIENT KILL ID 999999"), int(0));
    assert_eq!(c.run("CLIENT KILL foo bar"), err("ERR syntax error"));
    assert_eq!(
        c.run("CLIENT KILL TYPE foo"),
        err("ERR Unknown client type 'foo'")
    );
    assert_eq!(c.run("CLIENT KILL USER bob"), err("ERR No such user 'bob'"));
    assert_eq!(c.run("CLIENT KILL SKIPME maybe"), err("ERR syntax error"));
    assert_eq!(c.run(&format!("CLIENT KILL ID {other_id}")), int(1));
    other.assert_closed();
    assert_eq!(c.run("CLIENT LIST").text().lines().count(), 1);
    // Old form: by address.
    let mut third = server.raw();
    // Registered once it has been served (the accept may lag the connect).
    assert_eq!(third.run("PING"), status("PONG"));
    let addr = third.stream.local_addr().unwrap().to_string();
    assert_eq!(c.run(&format!("CLIENT KILL {addr}")), ok());
    third.assert_closed();
    // SKIPME yes (the default) spares the caller.
    assert_eq!(c.run(&format!("CLIENT KILL ID {id}")), int(0));
    assert_eq!(
        c.run(
            "CLIENT KILL ID {id} SKIPME no"
                .replace("{id}", &id.to_string())
                .as_str()
        ),
        int(1)
    );
    c.assert_closed();

    // Unknown subcommands: an error reply, the connection stays open.
    let mut d = server.raw();
    assert_eq!(
        d.run("CLIENT foo"),
        err("ERR unknown subcommand 'foo'. Try CLIENT HELP.")
    );
    assert_eq!(
        d.run("CLIENT foo bar"),
        err("ERR unknown subcommand 'foo'. Try CLIENT HELP.")
    );
    assert_eq!(d.run("CLIENT"), arity("client"));
    assert_eq!(d.run("CLIENT ID x"), arity("client|id"));
    let help = d.run("CLIENT HELP").items();
    assert!(help[0].text().starts_with("CLIENT <subcommand>"));
    assert_eq!(d.run("PING"), status("PONG"));
}

#[test]
fn command_introspection() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    let count = c.run("COMMAND COUNT").int();
    let all = c.run("COMMAND").items();
    assert_eq!(all.len() as i64, count);
    let names: Vec<String> = c
        .run("COMMAND LIST")
        .items()
        .iter()
        .map(Resp::text)
        .collect();
    assert_eq!(names.len() as i64, count);
    for want in ["get", "set", "mget", "client", "config", "scan", "hello"] {
        assert!(names.iter().any(|n| n == want), "{want} in COMMAND LIST");
    }
    let pattern: Vec<String> = c
        .run("COMMAND LIST FILTERBY PATTERN get*")
        .items()
        .iter()
        .map(Resp::text)
        .collect();
    for want in ["get", "getdel", "getex", "getrange", "getset"] {
        assert!(pattern.iter().any(|n| n == want), "{want} in {pattern:?}");
    }
    assert!(pattern.iter().all(|n| n.starts_with("get")));
    assert_eq!(c.run("COMMAND LIST FILTERBY PATTERN xyz*"), array(vec![]));
    assert_eq!(c.run("COMMAND LIST foo"), err("ERR syntax error"));

    // COMMAND INFO: name, arity, flags, first key, last key, step, ...
    let info = c.run("COMMAND INFO get set nocmd").items();
    assert_eq!(info.len(), 3);
    let get = info[0].items();
    assert_eq!(get[0], bulk("get"));
    assert_eq!(get[1], int(2));
    let flags: Vec<String> = get[2].items().iter().map(Resp::text).collect();
    assert!(flags.contains(&"readonly".to_string()), "{flags:?}");
    assert_eq!(&get[3..6], &[int(1), int(1), int(1)]);
    let set = info[1].items();
    assert_eq!(set[1], int(-3));
    assert!(set[2].items().contains(&status("write")));
    assert_eq!(info[2], Resp::Array(None));

    // COMMAND DOCS: a map from name to its docs (flat array in RESP2).
    let docs = c.run("COMMAND DOCS get").items();
    assert_eq!(docs[0], bulk("get"));
    let fields = docs[1].items();
    let summary = fields
        .chunks(2)
        .find(|p| p[0] == bulk("summary"))
        .expect("summary");
    assert!(!summary[1].text().is_empty());
    assert!(fields
        .chunks(2)
        .any(|p| p[0] == bulk("group") && p[1] == bulk("string")));
    assert_eq!(c.run("COMMAND DOCS nocmd"), array(vec![]));
    assert_eq!(
        c.run("COMMAND DOCS").items().len() as i64,
        count * 2,
        "every command documented"
    );

    // Key-spec flags: access type in capitals, operation in lower case.
    let spec = get[8].items()[0].items();
    let flags = spec
        .chunks(2)
        .find(|p| p[0] == bulk("flags"))
        .expect("key spec flags")[1]
        .clone();
    assert_eq!(flags, array(vec![status("RO"), status("access")]));
    assert_eq!(
        c.run("COMMAND GETKEYSANDFLAGS get a"),
        array(vec![array(vec![
            bulk("a"),
            array(vec![status("RO"), status("access")])
        ])])
    );
    assert_eq!(c.run("COMMAND GETKEYS get a"), bulks(&["a"]));
    assert_eq!(c.run("COMMAND GETKEYS mset a 1 b 2"), bulks(&["a", "b"]));
    assert_eq!(c.run("COMMAND GETKEYS del a b c"), bulks(&["a", "b", "c"]));
    assert_eq!(
        c.run("COMMAND GETKEYS nocmd a"),
        err("ERR Invalid command specified")
    );
    assert_eq!(
        c.run("COMMAND GETKEYS set a"),
        err("ERR Invalid number of arguments specified for command")
    );
    assert_eq!(c.run("COMMAND GETKEYS"), arity("command|getkeys"));
    assert_eq!(
        c.run("COMMAND foo"),
        err("ERR unknown subcommand 'foo'. Try COMMAND HELP.")
    );
}

#[test]
fn config_get_set_resetstat() {
    let server = Server::start(&["--maxmemory", "64mb"]);
    let mut c = server.raw();
    let all = c.run("CONFIG GET *").items();
    assert!(all.len() >= 20 && all.len().is_multiple_of(2), "{all:?}");
    let pairs: Vec<(String, String)> = all.chunks(2).map(|p| (p[0].text(), p[1].text())).collect();
    let get = |name: &str| {
        pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(get("maxmemory").as_deref(), Some("67108864"));
    assert_eq!(get("maxmemory-policy").as_deref(), Some("prefix"));
    assert_eq!(get("port"), Some(server.port.to_string()));
    assert_eq!(get("databases").as_deref(), Some("1"));
    assert!(get("proto-max-bulk-len").is_some());

    assert_eq!(
        c.run("CONFIG GET maxmemory"),
        bulks(&["maxmemory", "67108864"])
    );
    let mm = c.run("CONFIG GET maxmemory*").items();
    assert_eq!(
        mm.len(),
        8,
        "maxmemory, -clients, -policy, -samples: {mm:?}"
    );
    assert_eq!(c.run("CONFIG GET nosuch"), array(vec![]));
    assert_eq!(c.run("CONFIG GET"), arity("config|get"));

    assert_eq!(c.run("CONFIG SET maxmemory 10mb"), ok());
    assert_eq!(
        c.run("CONFIG GET maxmemory"),
        bulks(&["maxmemory", "10485760"])
    );
    assert_eq!(
        c.run("CONFIG SET maxmemory-policy allkeys-lru maxmemory-samples 7"),
        ok()
    );
    assert_eq!(
        c.run("CONFIG GET maxmemory-policy"),
        bulks(&["maxmemory-policy", "allkeys-lru"])
    );
    let info = c.run("INFO memory").text();
    assert_eq!(
        info_field(&info, "maxmemory_policy").as_deref(),
        Some("allkeys-lru")
    );
    assert_eq!(info_num(&info, "maxmemory"), 10485760);
    assert_eq!(c.run("CONFIG SET maxmemory"), arity("config|set"));
    assert_eq!(
        c.run("CONFIG SET maxmemory abc"),
        err("ERR CONFIG SET failed (possibly related to argument 'maxmemory') - argument must be a memory value")
    );
    assert_eq!(
        c.run("CONFIG SET nosuch 1"),
        err("ERR Unknown option or number of arguments for CONFIG SET - 'nosuch'")
    );
    assert_eq!(
        c.run("CONFIG SET maxmemory 0 maxmemory 0"),
        err("ERR CONFIG SET failed (possibly related to argument 'maxmemory') - duplicate parameter")
    );
    assert_eq!(
        c.run("CONFIG SET maxmemory-policy foo"),
        err("ERR CONFIG SET failed (possibly related to argument 'maxmemory-policy') - argument(s) must be one of the following: volatile-lru, volatile-lfu, volatile-random, volatile-ttl, allkeys-lru, allkeys-lfu, allkeys-random, noeviction, prefix")
    );
    // A failed multi-parameter SET applies nothing.
    assert!(c
        .run("CONFIG SET maxmemory 20mb maxmemory-policy foo")
        .is_error());
    assert_eq!(
        c.run("CONFIG GET maxmemory"),
        bulks(&["maxmemory", "10485760"])
    );
    assert_eq!(c.cmd(&[b"CONFIG", b"SET", b"save", b""]), ok());
    assert_eq!(
        c.run("CONFIG foo"),
        err("ERR unknown subcommand 'foo'. Try CONFIG HELP.")
    );

    for i in 0..10 {
        assert_eq!(c.run(&format!("SET k{i} v")), ok());
    }
    assert_eq!(c.run("GET nokey"), nil());
    let stats = c.run("INFO stats").text();
    assert!(info_num(&stats, "total_commands_processed") >= 10);
    assert!(info_num(&stats, "keyspace_misses") >= 1);
    assert_eq!(c.run("CONFIG RESETSTAT"), ok());
    let stats = c.run("INFO stats").text();
    assert!(info_num(&stats, "total_commands_processed") <= 2, "{stats}");
    assert_eq!(info_num(&stats, "keyspace_misses"), 0);
    assert_eq!(c.run("DBSIZE"), int(10), "RESETSTAT keeps the data");
}

#[test]
fn info_sections() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    let keys = one_key_per_shard("info");
    for k in &keys[..2] {
        assert_eq!(c.run(&format!("SET {k} v")), ok());
    }
    for k in &keys[2..] {
        assert_eq!(c.run(&format!("SET {k} v EX 1000")), ok());
    }
    assert_eq!(c.run("GET nokey"), nil());
    assert_eq!(c.run("GET nokey a"), arity("get"));

    let all = c.run("INFO").text();
    for section in [
        "# Server",
        "# Clients",
        "# Memory",
        "# Persistence",
        "# Stats",
        "# Replication",
        "# CPU",
        "# Keyspace",
    ] {
        assert!(all.contains(section), "{section} in default INFO");
    }
    assert!(!all.contains("# Commandstats"), "not a default section");
    assert!(all.contains("\r\n"), "INFO lines end with CRLF");

    let server_info = c.run("INFO server").text();
    assert!(server_info.starts_with("# Server\r\n"));
    assert!(!server_info.contains("# Clients"));
    assert_eq!(info_num(&server_info, "tcp_port"), server.port as u64);
    assert_eq!(info_num(&server_info, "process_id"), server.pid() as u64);
    assert!(info_field(&server_info, "redis_version")
        .unwrap()
        .starts_with("7."));
    assert_eq!(
        info_field(&server_info, "redis_mode").as_deref(),
        Some("standalone")
    );

    let mut other = server.raw();
    assert_eq!(other.run("PING"), status("PONG"));
    let clients = c.run("INFO clients").text();
    assert_eq!(info_num(&clients, "connected_clients"), 2);

    let memory = c.run("INFO memory").text();
    assert!(info_num(&memory, "used_memory") > 0);
    assert!(info_field(&memory, "used_memory_human").is_some());
    // Sized from the machine by default (--maxmemory auto).
    assert!(info_num(&memory, "maxmemory") > 0);
    assert_eq!(
        info_field(&memory, "maxmemory_policy").as_deref(),
        Some("prefix")
    );

    let stats = c.run("INFO stats").text();
    assert!(info_num(&stats, "total_connections_received") >= 2);
    assert!(info_num(&stats, "total_commands_processed") >= 5);
    assert!(info_num(&stats, "keyspace_misses") >= 1);
    assert!(info_num(&stats, "total_error_replies") >= 1);
    assert_eq!(info_num(&stats, "evicted_keys"), 0);

    let keyspace = c.run("INFO keyspace").text();
    let db0 = info_field(&keyspace, "db0").expect("db0 line");
    let parts: Vec<(&str, u64)> = db0
        .split(',')
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap();
            (k, v.parse().unwrap())
        })
        .collect();
    assert_eq!(parts[0], ("keys", 4));
    assert_eq!(parts[1], ("expires", 2));
    assert_eq!(parts[2].0, "avg_ttl");
    assert!((990_000..=1_000_000).contains(&parts[2].1), "{db0}");

    let cmdstats = c.run("INFO commandstats").text();
    assert!(cmdstats.starts_with("# Commandstats\r\n"));
    let set = info_field(&cmdstats, "cmdstat_set").expect("cmdstat_set");
    assert!(set.starts_with("calls=4,usec="), "{set}");
    assert!(set.contains(",rejected_calls=0,failed_calls=0"), "{set}");
    let get = info_field(&cmdstats, "cmdstat_get").expect("cmdstat_get");
    assert!(get.starts_with("calls=1,"), "{get}");
    assert!(get.contains("rejected_calls=1"), "{get}");

    let both = c.run("INFO server keyspace").text();
    assert!(both.contains("# Server") && both.contains("# Keyspace"));
    assert!(!both.contains("# Memory"));
    assert_eq!(c.run("INFO nosuchsection"), bulk(""));
    let everything = c.run("INFO everything").text();
    assert!(everything.contains("# Commandstats") && everything.contains("# Keyspace"));

    assert_eq!(c.run("FLUSHALL"), ok());
    let keyspace = c.run("INFO keyspace").text();
    assert_eq!(info_field(&keyspace, "db0"), None, "no db0 line when empty");
}

#[test]
fn dbsize_flush_time_lastsave_wait_scripts() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    let fill = |c: &mut RawConn| {
        for s in 0..SHARDS {
            for k in keys_on_shard("f", s, 5) {
                assert_eq!(c.run(&format!("SET {k} v")), ok());
            }
        }
    };
    assert_eq!(c.run("DBSIZE"), int(0));
    fill(&mut c);
    assert_eq!(c.run("DBSIZE"), int(20));
    assert_eq!(c.run("DBSIZE x"), arity("dbsize"));
    assert_eq!(c.run("FLUSHDB"), ok());
    assert_eq!(c.run("DBSIZE"), int(0));
    for flush in [
        "FLUSHDB ASYNC",
        "FLUSHDB sync",
        "FLUSHALL",
        "FLUSHALL ASYNC",
        "FLUSHALL SYNC",
    ] {
        fill(&mut c);
        assert_eq!(c.run(flush), ok(), "{flush}");
        assert_eq!(c.run("DBSIZE"), int(0), "{flush}");
        assert_eq!(c.run("RANDOMKEY"), nil(), "{flush}");
    }
    for bad in ["FLUSHDB foo", "FLUSHALL foo", "FLUSHALL ASYNC SYNC"] {
        assert_eq!(c.run(bad), err("ERR syntax error"), "{bad}");
    }

    let time = c.run("TIME").items();
    let secs: i64 = time[0].text().parse().unwrap();
    let micros: i64 = time[1].text().parse().unwrap();
    assert!((secs - unix_now()).abs() <= 5);
    assert!((0..1_000_000).contains(&micros));
    assert_eq!(c.run("TIME x"), arity("time"));
    let lastsave = c.run("LASTSAVE").int();
    assert!(lastsave <= unix_now() && lastsave > unix_now() - 3600);
    assert_eq!(c.run("LASTSAVE x"), arity("lastsave"));

    assert_eq!(c.run("WAIT 0 0"), int(0));
    assert_eq!(c.run("WAIT 1 10"), int(0), "no replicas: at once");
    assert_eq!(
        c.run("WAIT a 0"),
        err("ERR value is not an integer or out of range")
    );
    assert_eq!(
        c.run("WAIT 0 a"),
        err("ERR timeout is not an integer or out of range")
    );
    assert_eq!(c.run("WAIT 0 -1"), err("ERR timeout is negative"));
    assert_eq!(c.run("WAIT 0"), arity("wait"));

    for ok_line in [
        "FUNCTION FLUSH",
        "FUNCTION FLUSH ASYNC",
        "FUNCTION FLUSH sync",
        "SCRIPT FLUSH",
        "SCRIPT FLUSH ASYNC",
    ] {
        assert_eq!(c.run(ok_line), ok(), "{ok_line}");
    }
    assert_eq!(
        c.run("FUNCTION FLUSH foo"),
        err("ERR FUNCTION FLUSH only supports SYNC|ASYNC option")
    );
    assert_eq!(
        c.run("SCRIPT FLUSH foo"),
        err("ERR SCRIPT FLUSH only support SYNC|ASYNC option")
    );
    assert_eq!(
        c.run("SCRIPT foo"),
        err("ERR unknown subcommand 'foo'. Try SCRIPT HELP.")
    );
}

#[test]
fn shutdown_exits_the_process() {
    let mut server = Server::start(&[]);
    let mut c = server.raw();
    let mut bystander = server.raw();
    assert_eq!(c.run("SHUTDOWN foo"), err("ERR syntax error"));
    assert_eq!(c.run("SHUTDOWN ABORT"), err("ERR No shutdown in progress."));
    assert_eq!(bystander.run("PING"), status("PONG"));
    // Redis closes the connection without a reply.
    c.send(&encode(&[b"SHUTDOWN", b"NOSAVE"]));
    c.assert_closed();
    bystander.assert_closed();
    let status = server
        .wait_exit(Duration::from_secs(20))
        .expect("the server exits after SHUTDOWN");
    assert!(status.success(), "exit status {status:?}");
    assert!(std::net::TcpStream::connect(("127.0.0.1", server.port)).is_err());
}

/// The clients each shard serves, from INFO shards.
fn clients_by_shard(c: &mut RawConn) -> Vec<usize> {
    c.run("INFO shards")
        .text()
        .lines()
        .filter(|l| l.starts_with("shard"))
        .map(|l| {
            let at = l.find("clients=").expect("clients=") + "clients=".len();
            l[at..].split(',').next().unwrap().parse().unwrap()
        })
        .collect()
}

#[test]
fn connections_are_spread_evenly_over_the_shards() {
    let server = Server::start(&[]);
    // 4 shards, 12 + 1 connections: the kernel's SO_REUSEPORT hash alone
    // would rarely deal 3 or 4 to every shard; placement by count does.
    let mut conns: Vec<RawConn> = (0..12).map(|_| server.raw()).collect();
    for (i, c) in conns.iter_mut().enumerate() {
        // Every connection serves keys of every shard, whoever accepted it.
        for key in one_key_per_shard(&format!("spread{i}")) {
            assert_eq!(c.cmd(&[b"SET", key.as_bytes(), b"v"]), ok());
            assert_eq!(c.cmd(&[b"GET", key.as_bytes()]), bulk("v"));
        }
    }
    let mut probe = server.raw();
    let counts = clients_by_shard(&mut probe);
    assert_eq!(counts.len(), SHARDS, "{counts:?}");
    assert_eq!(counts.iter().sum::<usize>(), 13, "{counts:?}");
    assert!(counts.iter().all(|&n| n == 3 || n == 4), "{counts:?}");
    // Closed connections free their places: the next ones fill them.
    conns.truncate(0);
    assert!(eventually(Duration::from_secs(5), || clients_by_shard(
        &mut probe
    )
    .iter()
    .sum::<usize>()
        == 1));
    let _more: Vec<RawConn> = (0..7)
        .map(|_| {
            let mut c = server.raw();
            assert_eq!(c.run("PING"), status("PONG"));
            c
        })
        .collect();
    let counts = clients_by_shard(&mut probe);
    assert!(counts.iter().all(|&n| n == 2), "{counts:?}");
}
