//! The command layer: arbitrary bytes sent to a kvtier server running in
//! this process (two shards, a small memory budget, short blocking
//! commands). After each input the server must still answer PING on a
//! fresh connection within the time limit: a panic anywhere aborts the
//! process (a finding), and a shard that hangs or stops serving fails the
//! check. Inputs that would stop or reconfigure the server (SHUTDOWN,
//! CONFIG, CLIENT, DEBUG, MONITOR, FLUSHALL ASYNC...) are skipped.
#![no_main]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::OnceLock;
use std::time::Duration;

use kvtier_server::config::Config;
use kvtier_server::server::Server;
use libfuzzer_sys::fuzz_target;

fn server() -> SocketAddr {
    static ADDR: OnceLock<SocketAddr> = OnceLock::new();
    *ADDR.get_or_init(|| {
        let args = [
            "kvtier-server",
            "--port",
            "0",
            "--threads",
            "2",
            "--maxmemory",
            "64mb",
            "--metrics-addr",
            "none",
            "--max-block-ms",
            "20",
            "--timeout",
            "2",
        ];
        let config = Config::load_from(args.iter().map(|s| s.to_string()).collect()).unwrap();
        let server = Server::start(&config).expect("the server starts");
        let addr = server.local_addr();
        // Kept running for the whole fuzzing session.
        std::mem::forget(server);
        addr
    })
}

fn skipped(data: &[u8]) -> bool {
    let lower = data.to_ascii_lowercase();
    [
        "shutdown",
        "config",
        "client",
        "debug",
        "monitor",
        "subscribe",
        "wait",
        "hello",
        "auth",
        "quit",
    ]
    .iter()
    .any(|w| lower.windows(w.len()).any(|x| x == w.as_bytes()))
}

fuzz_target!(|data: &[u8]| {
    if skipped(data) {
        return;
    }
    let addr = server();
    if let Ok(mut conn) = TcpStream::connect(addr) {
        let _ = conn.set_read_timeout(Some(Duration::from_millis(200)));
        let _ = conn.set_write_timeout(Some(Duration::from_secs(1)));
        let _ = conn.write_all(data);
        let _ = conn.shutdown(std::net::Shutdown::Write);
        let mut sink = [0u8; 64 * 1024];
        while let Ok(n) = conn.read(&mut sink) {
            if n == 0 {
                break;
            }
        }
    }
    // Still serving.
    let mut check = TcpStream::connect(addr).expect("the server accepts connections");
    check
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    check.write_all(b"PING\r\n").unwrap();
    let mut reply = [0u8; 7];
    check
        .read_exact(&mut reply)
        .expect("the server answers PING");
    assert_eq!(&reply, b"+PONG\r\n");
});
