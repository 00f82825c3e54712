//! Process and connection limits: SIGTERM stops the server cleanly,
//! `--maxclients` refuses extra connections with Redis's error, and
//! `--timeout` closes idle clients.

mod common;

use std::time::Duration;

use common::*;

#[test]
fn sigterm_stops_gracefully() {
    let mut server = Server::start(&[]);
    let mut c = server.raw();
    assert_eq!(c.run("SET k v"), ok());
    // SAFETY: sends a signal to the child process this test started.
    let sent = unsafe { libc::kill(server.pid() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(sent, 0);
    let status = server
        .wait_exit(Duration::from_secs(20))
        .expect("exits after SIGTERM");
    assert!(status.success(), "{status:?}");
    c.assert_closed();
}

#[test]
fn maxclients_refuses_extra_connections() {
    let server = Server::start(&["--maxclients", "2"]);
    let mut a = server.raw();
    let mut b = server.raw();
    assert_eq!(a.run("PING"), status("PONG"));
    assert_eq!(b.run("PING"), status("PONG"));
    let mut c = server.raw();
    assert_eq!(c.read(), err("ERR max number of clients reached"));
    c.assert_closed();
    let info = a.run("INFO stats").text();
    assert_eq!(info_num(&info, "rejected_connections"), 1);
    drop(b);
    // The slot frees once the server has seen the close.
    assert!(eventually(Duration::from_secs(10), || {
        let mut d = server.raw();
        d.send(b"PING\r\n");
        d.read() == status("PONG")
    }));
}

#[test]
fn idle_clients_are_closed_after_timeout() {
    let server = Server::start(&["--timeout", "1"]);
    let mut idle = server.raw();
    assert_eq!(idle.run("PING"), status("PONG"));
    std::thread::sleep(Duration::from_millis(1500));
    idle.assert_closed();
    let mut c = server.raw();
    assert_eq!(c.run("CONFIG SET timeout 0"), ok());
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(c.run("PING"), status("PONG"));
}
