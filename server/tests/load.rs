//! Load: many connections pipelining at once, keys spread over every shard,
//! random values, every reply checked. Counts are fixed; nothing asserts
//! speed.

mod common;

use std::thread;
use std::time::Duration;

use common::*;

const CONNECTIONS: usize = 100;
const ROUNDS: usize = 5;
const PER_PIPELINE: usize = 200;

/// A small deterministic generator, so a failure can be replayed.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }
}

#[test]
fn hundred_connections_pipelining_set_get() {
    let server = Server::start(&[]);
    let runtime = runtime(true);
    runtime.block_on(async {
        let mut tasks = Vec::new();
        for conn in 0..CONNECTIONS {
            let url = server.url();
            tasks.push(tokio::spawn(async move {
                let mut con = connect_async(&url).await;
                let mut rng = XorShift(0x5eed ^ ((conn as u64 + 1) << 20));
                for round in 0..ROUNDS {
                    let keys: Vec<String> = (0..PER_PIPELINE)
                        .map(|i| format!("load:{conn}:{i}"))
                        .collect();
                    let values: Vec<Vec<u8>> = (0..PER_PIPELINE)
                        .map(|_| {
                            let len = (rng.next() % 2048) as usize;
                            rng.bytes(len)
                        })
                        .collect();
                    let mut pipe = redis::pipe();
                    for (k, v) in keys.iter().zip(&values) {
                        pipe.set(k, &v[..]).ignore();
                    }
                    for k in &keys {
                        pipe.get(k);
                    }
                    let got: Vec<Vec<u8>> = pipe.query_async(&mut con).await.unwrap();
                    assert_eq!(got.len(), PER_PIPELINE);
                    for (i, (g, v)) in got.iter().zip(&values).enumerate() {
                        assert!(g == v, "conn {conn} round {round} key {i}: wrong value");
                    }
                }
            }));
        }
        let all = futures_join(tasks);
        tokio::time::timeout(Duration::from_secs(240), all)
            .await
            .expect("load finished in time");
    });
    let mut c = server.raw();
    assert_eq!(c.run("DBSIZE"), int((CONNECTIONS * PER_PIPELINE) as i64));
    let stats = c.run("INFO stats").text();
    assert!(
        info_num(&stats, "total_commands_processed")
            >= (CONNECTIONS * ROUNDS * PER_PIPELINE * 2) as u64
    );
    let shards = c.run("INFO shards").text();
    for s in 0..SHARDS {
        let line = info_field(&shards, &format!("shard{s}")).expect("shard line");
        assert!(
            !line.starts_with("keys=0,"),
            "every shard holds keys: {line}"
        );
    }
}

/// Awaits every task, propagating a panic from any of them.
async fn futures_join(tasks: Vec<tokio::task::JoinHandle<()>>) {
    for t in tasks {
        if let Err(e) = t.await {
            std::panic::resume_unwind(e.into_panic());
        }
    }
}

/// Raw-socket clients mixing MSET/MGET, INCR and DEL across shards in big
/// single-write pipelines, checked reply by reply.
#[test]
fn raw_pipelines_with_multi_key_commands() {
    let server = Server::start(&[]);
    let port = server.port;
    let threads: Vec<_> = (0..16)
        .map(|t| {
            thread::spawn(move || {
                let mut c = RawConn::connect(port);
                let mut rng = XorShift(0xfeed + t as u64);
                for round in 0..20 {
                    let keys: Vec<String> = (0..8).map(|i| format!("raw:{t}:{i}")).collect();
                    let values: Vec<Vec<u8>> = (0..8)
                        .map(|_| {
                            let len = (rng.next() % 300) as usize;
                            rng.bytes(len)
                        })
                        .collect();
                    let mut out = Vec::new();
                    let mut mset: Vec<&[u8]> = vec![b"MSET"];
                    for (k, v) in keys.iter().zip(&values) {
                        mset.push(k.as_bytes());
                        mset.push(v);
                    }
                    out.extend(encode(&mset));
                    let mut mget: Vec<&[u8]> = vec![b"MGET"];
                    mget.extend(keys.iter().map(|k| k.as_bytes()));
                    out.extend(encode(&mget));
                    let counter = format!("raw:{t}:counter");
                    for _ in 0..50 {
                        out.extend(encode(&[b"INCR", counter.as_bytes()]));
                    }
                    let mut del: Vec<&[u8]> = vec![b"DEL"];
                    del.extend(keys[..4].iter().map(|k| k.as_bytes()));
                    out.extend(encode(&del));
                    out.extend(encode(&mget));
                    c.send(&out);
                    assert_eq!(c.read(), ok());
                    assert_eq!(c.read(), array(values.iter().map(bulk).collect()));
                    for i in 1..=50 {
                        assert_eq!(c.read(), int(round * 50 + i));
                    }
                    assert_eq!(c.read(), int(4));
                    let mut want: Vec<Resp> = (0..4).map(|_| nil()).collect();
                    want.extend(values[4..].iter().map(bulk));
                    assert_eq!(c.read(), array(want));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("client thread");
    }
}
