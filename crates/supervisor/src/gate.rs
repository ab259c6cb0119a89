//! The supervisor's TCP gate: how a supervisor is reached where no unix socket can be
//! shared with the server (a Kubernetes pod, reached through the API server's
//! port-forward).
//!
//! The supervisor listens on a loopback TCP port inside the sandbox's own network
//! namespace. Every process of the sandbox can connect to that port, so a connection is
//! served only after it proves it comes from the server: its first [`KEY_LEN`] bytes must
//! be the sandbox's channel key (compared in constant time), which the server generated
//! at provision and handed to the supervisor alone (an environment variable of its
//! process, which commands never inherit and, the supervisor being non-dumpable, cannot
//! read from `/proc/1/environ`). A wrong or missing key closes the connection without a
//! byte in answer. After the key, the connection carries [`crate::protocol`] unchanged:
//! the gate relays it to the same connection handler a unix socket uses, so every
//! operation the supervisor serves passes through.

use std::net::SocketAddr;
use std::time::Duration;

use subtle::ConstantTimeEq as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixStream};

/// The length of a channel key on the wire: 64 lowercase hex digits (32 random bytes).
pub const KEY_LEN: usize = 64;

/// The environment variable the supervisor's process reads its channel key from.
pub const KEY_VARIABLE: &str = "SANDLANE_CHANNEL_KEY";

/// How long a new connection may take to present its key.
const KEY_TIMEOUT: Duration = Duration::from_secs(10);

/// A sandbox's channel key. Its `Debug` redacts it.
#[derive(Clone, PartialEq, Eq)]
pub struct ChannelKey([u8; KEY_LEN]);

impl std::fmt::Debug for ChannelKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ChannelKey(<redacted>)")
    }
}

/// Why a channel key was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a channel key is {KEY_LEN} lowercase hex digits (got {0} characters that are not)")]
pub struct BadKey(pub usize);

impl ChannelKey {
    /// A fresh random key.
    ///
    /// # Errors
    /// When the system's entropy source fails.
    pub fn generate() -> Result<Self, getrandom::Error> {
        let mut raw = [0u8; KEY_LEN / 2];
        getrandom::fill(&mut raw)?;
        let mut key = [0u8; KEY_LEN];
        for (i, b) in raw.iter().enumerate() {
            key[2 * i] = HEX[usize::from(b >> 4)];
            key[2 * i + 1] = HEX[usize::from(b & 0xf)];
        }
        Ok(Self(key))
    }

    /// The key in `text` (surrounding whitespace ignored).
    ///
    /// # Errors
    /// [`BadKey`] unless it is exactly [`KEY_LEN`] lowercase hex digits.
    pub fn parse(text: &str) -> Result<Self, BadKey> {
        let text = text.trim();
        let bytes = text.as_bytes();
        if bytes.len() != KEY_LEN || !bytes.iter().all(|b| HEX.contains(b)) {
            return Err(BadKey(bytes.len()));
        }
        let mut key = [0u8; KEY_LEN];
        key.copy_from_slice(bytes);
        Ok(Self(key))
    }

    /// The key's text (for the Secret that carries it to the supervisor).
    pub fn expose(&self) -> &str {
        // Only hex digits are ever stored.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }

    /// The bytes a client sends first.
    pub fn preamble(&self) -> &[u8; KEY_LEN] {
        &self.0
    }

    fn matches(&self, presented: &[u8; KEY_LEN]) -> bool {
        self.0.ct_eq(presented).into()
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Binds the gate's listening socket.
///
/// # Errors
/// A message naming the address.
pub fn bind(addr: SocketAddr) -> Result<TcpListener, String> {
    let std_listener =
        std::net::TcpListener::bind(addr).map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    std_listener.set_nonblocking(true).map_err(|e| format!("listening socket {addr}: {e}"))?;
    TcpListener::from_std(std_listener).map_err(|e| format!("listening socket {addr}: {e}"))
}

/// Checks a new connection's key; on success returns the end of a unix socket pair that
/// the supervisor serves as it serves a unix-socket connection, and relays between it and
/// the TCP connection in the background until either side ends. `None`: refused (the
/// TCP connection is closed).
pub async fn admit(mut tcp: TcpStream, key: &ChannelKey) -> Option<UnixStream> {
    let _ = tcp.set_nodelay(true);
    let mut presented = [0u8; KEY_LEN];
    match tokio::time::timeout(KEY_TIMEOUT, tcp.read_exact(&mut presented)).await {
        Ok(Ok(_)) if key.matches(&presented) => {}
        _ => return None,
    }
    let (served, relay) = UnixStream::pair().ok()?;
    tokio::spawn(relay_until_closed(tcp, relay));
    Some(served)
}

/// How long a connection the supervisor has closed waits for the server to close it
/// (see [`relay_until_closed`]).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Copies both ways. The server closing its side ends the input of the operation (the
/// supervisor sees the end and ends it). The supervisor closing its side (its answer is
/// complete) does not close the TCP connection at once: the server, which reads the
/// answer and then closes, is the side that ends the connection, and until then what it
/// still sends is read and dropped (for at most [`DRAIN_TIMEOUT`]). A supervisor may
/// answer before it has read everything the server sends (an upload it refused at
/// once); closing then would reset the connection, or end the port-forward while the
/// server's client still writes into it, and either can lose the answer on its way
/// through the kubelet and the API server.
async fn relay_until_closed(tcp: TcpStream, inner: UnixStream) {
    let (mut tcp_rx, mut tcp_tx) = tcp.into_split();
    let (mut inner_rx, mut inner_tx) = inner.into_split();
    {
        let outbound = tokio::io::copy(&mut inner_rx, &mut tcp_tx);
        tokio::pin!(outbound);
        let inbound = async {
            // Ends at the server's end, or when the supervisor stops reading.
            let _ = tokio::io::copy(&mut tcp_rx, &mut inner_tx).await;
            let _ = inner_tx.shutdown().await;
        };
        tokio::select! {
            _ = &mut outbound => {}
            () = inbound => {
                let _ = outbound.await;
            }
        }
    }
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, tokio::io::copy(&mut tcp_rx, &mut tokio::io::sink())).await;
    let _ = tcp_tx.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_hex_and_redacted() {
        let key = ChannelKey::generate().unwrap();
        assert_eq!(key.expose().len(), KEY_LEN);
        assert_eq!(ChannelKey::parse(key.expose()).unwrap(), key);
        assert_eq!(ChannelKey::parse(&format!(" {}\n", key.expose())).unwrap(), key);
        assert!(!format!("{key:?}").contains(key.expose()));
        assert_ne!(ChannelKey::generate().unwrap(), key);
        assert_eq!(ChannelKey::parse("abc"), Err(BadKey(3)));
        assert!(ChannelKey::parse(&"G".repeat(KEY_LEN)).is_err());
        assert!(ChannelKey::parse(&"A".repeat(KEY_LEN)).is_err(), "uppercase is not the key's text");
    }

    #[tokio::test]
    async fn only_the_key_opens_the_gate() {
        let listener = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        let key = ChannelKey::generate().unwrap();
        let other = ChannelKey::generate().unwrap();
        let serve_key = key.clone();
        let server = tokio::spawn(async move {
            let mut admitted = Vec::new();
            for _ in 0..3 {
                let (tcp, _) = listener.accept().await.unwrap();
                admitted.push(admit(tcp, &serve_key).await);
            }
            admitted
        });
        // The right key, then bytes that reach the inner side.
        let mut good = TcpStream::connect(addr).await.unwrap();
        good.write_all(key.preamble()).await.unwrap();
        good.write_all(b"hello").await.unwrap();
        // A wrong key; a connection that closes early.
        let mut bad = TcpStream::connect(addr).await.unwrap();
        bad.write_all(other.preamble()).await.unwrap();
        let mut short = TcpStream::connect(addr).await.unwrap();
        short.write_all(b"0123").await.unwrap();
        short.shutdown().await.unwrap();
        let admitted = server.await.unwrap();
        let mut inner = admitted.into_iter();
        let mut served = inner.next().unwrap().expect("the right key is admitted");
        assert!(inner.next().unwrap().is_none(), "a wrong key is refused");
        assert!(inner.next().unwrap().is_none(), "a short key is refused");
        let mut got = [0u8; 5];
        served.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"hello");
        served.write_all(b"back").await.unwrap();
        let mut back = [0u8; 4];
        good.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"back");
        // The refused connection gets nothing and is closed.
        let mut rest = Vec::new();
        let n = tokio::time::timeout(Duration::from_secs(5), bad.read_to_end(&mut rest)).await.unwrap();
        assert_eq!((n.unwrap_or(0), rest.len()), (0, 0));
        // The supervisor answers and closes its side before it read what the client
        // still sends: the client can go on writing, reads the whole answer, and ends the
        // connection by closing its own side.
        served.write_all(b"answer").await.unwrap();
        drop(served);
        good.write_all(&vec![7u8; 1 << 20]).await.unwrap();
        let mut answer = [0u8; 6];
        good.read_exact(&mut answer).await.unwrap();
        assert_eq!(&answer, b"answer");
        good.shutdown().await.unwrap();
        let mut rest = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), good.read_to_end(&mut rest)).await.unwrap().unwrap();
        assert!(rest.is_empty(), "nothing after the answer, then the end");
    }
}
