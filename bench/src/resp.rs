//! A small RESP client built for measuring, not for convenience: commands
//! are queued and written with one vectored write (big values by reference,
//! never copied into a buffer), and a big bulk reply is read straight into a
//! buffer of its exact size. Encoding and parsing are kvtier-protocol's
//! (`ReplyBuf::push_command`, `ReplyParser`), the same code the server's
//! peer links use. The same client talks to kvtier and to redis-server, so
//! both are measured alike.

use std::io;

use bytes::{Bytes, BytesMut};
use kvtier_protocol::{Reply, ReplyBuf, ReplyParser};
use tokio::net::TcpStream;

/// One connection.
pub struct Client {
    stream: TcpStream,
    rbuf: BytesMut,
    out: ReplyBuf,
    parser: ReplyParser<Reply>,
}

impl Client {
    /// Connects (TCP_NODELAY on).
    pub async fn connect(addr: &str) -> io::Result<Client> {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|e| io::Error::new(e.kind(), format!("cannot connect to {addr}: {e}")))?;
        stream.set_nodelay(true)?;
        Ok(Client {
            stream,
            rbuf: BytesMut::with_capacity(64 * 1024),
            out: ReplyBuf::new(),
            parser: ReplyParser::new(),
        })
    }

    /// Queues a command (not sent until [`Client::flush`]).
    pub fn send(&mut self, args: &[Bytes]) {
        self.out.push_command(args);
    }

    /// Writes everything queued.
    pub async fn flush(&mut self) -> io::Result<()> {
        self.out.write_to(&mut self.stream).await
    }

    /// Sends one command and reads its reply.
    pub async fn call(&mut self, args: &[Bytes]) -> io::Result<Reply> {
        self.send(args);
        self.flush().await?;
        self.recv().await
    }

    /// Gives the buffers of a reply back once the caller is done with it
    /// (verified it), so later big replies reuse them instead of allocating.
    /// Buffers still referenced elsewhere are simply dropped.
    pub fn recycle(&mut self, v: Reply) {
        match v {
            Reply::Bulk(b) => self.recycle_bytes(b),
            Reply::Array(items) => {
                for item in items {
                    self.recycle(item);
                }
            }
            _ => {}
        }
    }

    /// [`Client::recycle`] for one bulk value.
    pub fn recycle_bytes(&mut self, b: Bytes) {
        self.parser.recycle(b);
    }

    /// Reads one reply.
    pub async fn recv(&mut self) -> io::Result<Reply> {
        self.parser
            .read_from(&mut self.stream, &mut self.rbuf)
            .await
    }
}

/// Builds an argument list from anything byte-like.
pub fn args<I, T>(items: I) -> Vec<Bytes>
where
    I: IntoIterator<Item = T>,
    T: Into<Bytes>,
{
    items.into_iter().map(Into::into).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A server that reads a request of `expect` bytes, then answers it with
    /// `reply` a few bytes at a time, and returns what it read.
    async fn canned(expect: usize, reply: Vec<u8>) -> (String, tokio::task::JoinHandle<Vec<u8>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let task = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut got = vec![0u8; expect];
            s.read_exact(&mut got).await.unwrap();
            // Trickle the reply to exercise partial reads.
            for chunk in reply.chunks(7) {
                s.write_all(chunk).await.unwrap();
                s.flush().await.unwrap();
            }
            got
        });
        (addr, task)
    }

    #[tokio::test]
    async fn parses_every_reply_kind_split_across_reads() {
        let big = vec![b'x'; kvtier_protocol::reply_parser::BIG_BULK_REPLY + 5];
        let big_len = big.len();
        let mut reply = b"*7\r\n+OK\r\n-ERR no\r\n:-42\r\n$-1\r\n$3\r\nabc\r\n*0\r\n".to_vec();
        reply.extend_from_slice(format!("${}\r\n", big.len()).as_bytes());
        reply.extend_from_slice(&big);
        reply.extend_from_slice(b"\r\n");
        let big_arg = 16 * 1024;
        let mut want = format!("*2\r\n$3\r\nGET\r\n${big_arg}\r\n").into_bytes();
        want.extend(std::iter::repeat_n(b'k', big_arg));
        want.extend_from_slice(b"\r\n");
        let (addr, server) = canned(want.len(), reply).await;
        let mut c = Client::connect(&addr).await.unwrap();
        let v = c
            .call(&[Bytes::from("GET"), Bytes::from(vec![b'k'; big_arg])])
            .await
            .unwrap();
        let items = v.into_array().unwrap();
        assert_eq!(items[0], Reply::status("OK"));
        assert_eq!(items[1], Reply::error("ERR no"));
        assert_eq!(items[2], Reply::Int(-42));
        assert_eq!(items[3], Reply::Nil);
        assert_eq!(items[4], Reply::Bulk(Bytes::from("abc")));
        assert_eq!(items[5], Reply::Array(Vec::new()));
        assert_eq!(items[6], Reply::Bulk(Bytes::from(big)));
        assert_eq!(server.await.unwrap(), want);
        // The big value's buffer comes back for reuse once nothing else holds it.
        let at = if let Reply::Bulk(b) = &items[6] {
            b.as_ptr()
        } else {
            unreachable!()
        };
        c.recycle(Reply::Array(items));
        let mut reuse = BytesMut::from(format!("${}\r\n", big_len).as_bytes());
        assert_eq!(c.parser.parse(&mut reuse).unwrap(), None);
        let own = c.parser.big_bulk_buffer().expect("a big payload");
        assert_eq!(own.get_ref().as_ptr(), at);
    }
}
