//! The wire, over raw sockets: inline commands with redis-cli/telnet
//! quoting, big pipelines in one write, and malformed input. After a
//! protocol error the server answers with Redis's exact error and closes
//! that connection; other clients keep being served. An unterminated
//! request gets no reply and does not block anyone.

mod common;

use std::time::Duration;

use common::*;

#[test]
fn inline_commands_and_quoting() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    c.send(b"PING\r\n");
    assert_eq!(c.read(), status("PONG"));
    c.send(b"PING\n");
    assert_eq!(c.read(), status("PONG"), "a bare LF ends a line too");
    c.send(b"\r\n\r\n  ping  \r\n");
    assert_eq!(c.read(), status("PONG"), "empty lines are skipped");
    c.send(b"set \"a b\" 'c d'\r\nget \"a b\"\r\n");
    assert_eq!(c.read(), ok());
    assert_eq!(c.read(), bulk("c d"));
    c.send(b"echo \"\\x41\\n\\t\\\"q\\\"\"\r\n");
    assert_eq!(c.read(), bulk("A\n\t\"q\""));
    c.send(b"echo 'it\\'s'\r\n");
    assert_eq!(c.read(), bulk("it's"));
    c.send(b"echo \"\"\r\n");
    assert_eq!(c.read(), bulk(""));
    c.send(b"set k   v1\r\nGET k\r\n");
    assert_eq!(c.read(), ok());
    assert_eq!(c.read(), bulk("v1"));
    c.send(b"foo 'a b' c\r\n");
    assert_eq!(
        c.read(),
        err("ERR unknown command 'foo', with args beginning with: 'a b' 'c' ")
    );
    // Inline and RESP requests mixed in one write.
    let mut mixed = b"SET mix 1\r\n".to_vec();
    mixed.extend(encode(&[b"INCR", b"mix"]));
    mixed.extend(b"INCR mix\r\n");
    c.send(&mixed);
    assert_eq!(c.read(), ok());
    assert_eq!(c.read(), int(2));
    assert_eq!(c.read(), int(3));
    // Lines that start like RESP replies are just unknown inline commands.
    c.send(b"$5\r\n:5\r\n+PING\r\n");
    assert_eq!(
        c.read(),
        err("ERR unknown command '$5', with args beginning with: ")
    );
    assert_eq!(
        c.read(),
        err("ERR unknown command ':5', with args beginning with: ")
    );
    assert_eq!(
        c.read(),
        err("ERR unknown command '+PING', with args beginning with: ")
    );
    // Empty and negative multibulk counts are ignored.
    c.send(b"*0\r\n*-1\r\n*1\r\n$4\r\nPING\r\n");
    assert_eq!(c.read(), status("PONG"));
}

#[test]
fn unknown_command_args_are_cut_at_128_bytes() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    let (a, b) = ("a".repeat(100), "b".repeat(100));
    assert_eq!(
        c.run(&format!("foo {a} {b} c")),
        err(&format!(
            "ERR unknown command 'foo', with args beginning with: '{a}' '{}' ",
            "b".repeat(25)
        ))
    );
    let long = "a".repeat(200);
    assert_eq!(
        c.run(&format!("foo {long} b")),
        err(&format!(
            "ERR unknown command 'foo', with args beginning with: '{}' ",
            "a".repeat(128)
        ))
    );
}

#[test]
fn pipeline_of_thousands_in_one_write() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    let n = 5000;
    let mut out = Vec::new();
    for i in 0..n {
        out.extend(encode(&[
            b"SET",
            format!("p:{i}").as_bytes(),
            format!("value-{i}").as_bytes(),
        ]));
    }
    for i in 0..n {
        out.extend(encode(&[b"GET", format!("p:{i}").as_bytes()]));
        if i % 1000 == 0 {
            out.extend(b"PING\r\n");
        }
    }
    out.extend(encode(&[b"DBSIZE"]));
    c.send(&out);
    for i in 0..n {
        assert_eq!(c.read(), ok(), "SET #{i}");
    }
    for i in 0..n {
        assert_eq!(c.read(), bulk(format!("value-{i}")), "GET #{i}");
        if i % 1000 == 0 {
            assert_eq!(c.read(), status("PONG"));
        }
    }
    assert_eq!(c.read(), int(n as i64));
    // INCRs of one key, pipelined across the batch limit, stay in order.
    let mut out = Vec::new();
    for _ in 0..3000 {
        out.extend(encode(&[b"INCR", b"counter"]));
    }
    c.send(&out);
    for i in 1..=3000 {
        assert_eq!(c.read(), int(i));
    }
}

/// Sends `input` on a fresh connection and expects `error` and a close,
/// while a bystander connection keeps working.
fn assert_protocol_error(server: &Server, input: &[u8], error: &str) {
    let mut bystander = server.raw();
    let mut c = server.raw();
    c.send(input);
    assert_eq!(
        c.read(),
        err(error),
        "input {:?}",
        String::from_utf8_lossy(input)
    );
    c.assert_closed();
    assert_eq!(bystander.run("PING"), status("PONG"));
    assert_eq!(bystander.run("SET after-error ok"), ok());
}

#[test]
fn malformed_requests_get_redis_errors_and_close() {
    let server = Server::start(&[]);
    let bulk_len = "ERR Protocol error: invalid bulk length";
    let multibulk_len = "ERR Protocol error: invalid multibulk length";
    for (input, error) in [
        (&b"*1\r\n$-5\r\n"[..], bulk_len),
        (b"*1\r\n$-1\r\n", bulk_len),
        (b"*1\r\n$abc\r\n", bulk_len),
        (b"*1\r\n$ 4\r\nPING\r\n", bulk_len),
        (b"*1\r\n$+4\r\nPING\r\n", bulk_len),
        (b"*1\r\n$04\r\nPING\r\n", bulk_len),
        (
            b"*2\r\n$999999999999\r\n",
            "ERR Protocol error: invalid bulk length (999999999999 bytes, over \
             proto-max-bulk-len 536870912)",
        ),
        (b"*2\r\n$99999999999999999999999\r\n", bulk_len),
        (
            b"*2\r\n$536870913\r\n",
            "ERR Protocol error: invalid bulk length (536870913 bytes, over \
             proto-max-bulk-len 536870912)",
        ),
        (b"*abc\r\n", multibulk_len),
        (b"*01\r\n$4\r\nPING\r\n", multibulk_len),
        (b"*2147483648\r\n", multibulk_len),
        (b"*99999999999999999999\r\n", multibulk_len),
        (b"*1\r\nx\r\n", "ERR Protocol error: expected '$', got 'x'"),
        (b"*1\r\n:5\r\n", "ERR Protocol error: expected '$', got ':'"),
        (
            b"*2\r\n$3\r\nGET\r\n*1\r\n",
            "ERR Protocol error: expected '$', got '*'",
        ),
        (
            b"SET \"unterminated\r\n",
            "ERR Protocol error: unbalanced quotes in request",
        ),
        (
            b"SET 'a'b\r\n",
            "ERR Protocol error: unbalanced quotes in request",
        ),
        (
            b"SET \"a\"b c\r\n",
            "ERR Protocol error: unbalanced quotes in request",
        ),
    ] {
        assert_protocol_error(&server, input, error);
    }
    let long_inline = vec![b'x'; 70_000];
    assert_protocol_error(
        &server,
        &long_inline,
        "ERR Protocol error: too big inline request",
    );
}

#[test]
fn replies_before_a_protocol_error_are_delivered_and_nothing_after_runs() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    let mut input = encode(&[b"SET", b"before", b"1"]);
    input.extend(b"PING\r\n*1\r\n$-5\r\n");
    input.extend(encode(&[b"SET", b"after", b"1"]));
    c.send(&input);
    assert_eq!(c.read(), ok());
    assert_eq!(c.read(), status("PONG"));
    assert_eq!(c.read(), err("ERR Protocol error: invalid bulk length"));
    c.assert_closed();
    let mut d = server.raw();
    assert_eq!(d.run("EXISTS before"), int(1));
    assert_eq!(d.run("EXISTS after"), int(0));
}

#[test]
fn unterminated_requests_wait_without_blocking_others() {
    let server = Server::start(&[]);
    let mut partial = Vec::new();
    for input in [
        &b"*2\r\n$3\r\nGET\r\n"[..],
        b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$100000\r\nabc",
        b"*1\r",
        b"*2147483647\r\n",
        b"*1048577\r\n",
        b"PING",
        b"*1\r\n$4\r\nPI",
    ] {
        let mut c = server.raw();
        c.send(input);
        partial.push(c);
    }
    let mut other = server.raw();
    assert_eq!(other.run("SET k v"), ok());
    assert_eq!(other.run("GET k"), bulk("v"));
    for c in &mut partial {
        c.assert_silent(Duration::from_millis(200));
    }
    // Completing the requests gets their replies.
    partial[0].send(b"$1\r\nk\r\n");
    assert_eq!(partial[0].read(), bulk("v"));
    let rest = vec![b'x'; 100_000 - 3];
    partial[1].send(&rest);
    partial[1].send(b"\r\n");
    assert_eq!(partial[1].read(), ok());
    assert_eq!(other.run("STRLEN k"), int(100_000));
    partial[5].send(b"\r\n");
    assert_eq!(partial[5].read(), status("PONG"));
    partial[6].send(b"NG\r\n");
    assert_eq!(partial[6].read(), status("PONG"));
    // Closing a half-sent request is harmless.
    drop(partial);
    assert_eq!(other.run("PING"), status("PONG"));
}

#[test]
fn trickled_bytes_are_reassembled() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    let mut input = encode(&[b"SET", b"slow", b"hello world"]);
    input.extend(encode(&[b"GET", b"slow"]));
    input.extend(b"ECHO \"a b\"\r\n");
    for byte in &input {
        c.send(std::slice::from_ref(byte));
    }
    assert_eq!(c.read(), ok());
    assert_eq!(c.read(), bulk("hello world"));
    assert_eq!(c.read(), bulk("a b"));
}

#[test]
fn proto_max_bulk_len_is_enforced() {
    let server = Server::start(&["--proto-max-bulk-len", "1mb"]);
    let mut c = server.raw();
    let max = vec![b'x'; 1 << 20];
    assert_eq!(c.cmd(&[b"SET", b"k", &max]), ok());
    assert_eq!(c.run("STRLEN k"), int(1 << 20));
    assert_eq!(
        c.run("APPEND k x"),
        err("ERR string exceeds maximum allowed size (proto-max-bulk-len)")
    );
    assert_eq!(
        c.run("SETRANGE k 1048576 x"),
        err("ERR string exceeds maximum allowed size (proto-max-bulk-len)")
    );
    assert_protocol_error(
        &server,
        b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1048577\r\n",
        "ERR Protocol error: invalid bulk length (1048577 bytes, over proto-max-bulk-len 1048576)",
    );
    // A whole over-long request in one write fails the same way.
    let over = vec![b'x'; (1 << 20) + 1];
    assert_protocol_error(
        &server,
        &encode(&[b"SET", b"k", &over]),
        "ERR Protocol error: invalid bulk length (1048577 bytes, over proto-max-bulk-len 1048576)",
    );
    // Raised at run time, it applies to new requests.
    assert_eq!(c.run("CONFIG SET proto-max-bulk-len 2mb"), ok());
    assert_eq!(c.cmd(&[b"SET", b"k", &over]), ok());
    assert_eq!(c.run("STRLEN k"), int((1 << 20) + 1));
}

#[test]
fn resp3_replies_on_the_wire() {
    let server = Server::start(&[]);
    let mut c = server.raw();
    assert!(matches!(c.run("HELLO 3"), Resp::Map(_)));
    assert_eq!(c.run("GET nokey"), Resp::Null);
    assert_eq!(c.run("SET k v"), ok());
    let Resp::Map(pairs) = c.run("CONFIG GET maxmemory-policy") else {
        panic!("CONFIG GET is a map in RESP3")
    };
    assert_eq!(pairs, vec![(bulk("maxmemory-policy"), bulk("prefix"))]);
    let Resp::Verbatim(format, text) = c.run("INFO server") else {
        panic!("INFO is verbatim text in RESP3")
    };
    assert_eq!(format, "txt");
    assert!(text.starts_with(b"# Server"));
    assert_eq!(c.run("MGET k nokey"), array(vec![bulk("v"), Resp::Null]));
    assert!(matches!(c.run("LCS k k IDX"), Resp::Map(_)));
}
