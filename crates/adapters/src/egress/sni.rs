//! The SNI rule for end-to-end tunnels: the first bytes a client sends through a
//! `CONNECT` are read (not terminated); when they are a TLS ClientHello whose server name
//! is another host than the one the `CONNECT` named, the tunnel is closed (domain
//! fronting: an allowed host's address carrying a request for another). Anything that is
//! not a TLS handshake passes as it is.

use tokio::io::{AsyncRead, AsyncReadExt};

/// Most bytes of handshake records read to find a ClientHello's end.
const MAX_HELLO: usize = 64 << 10;

/// What the first bytes of a tunnel were.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Hello {
    /// Not a TLS handshake (or the client ended first): passes.
    NotTls,
    /// A ClientHello with this server name (lower case), or none.
    Tls(Option<String>),
    /// A TLS handshake that does not parse (or too large): refused.
    Malformed,
}

/// Reads from `client` (after `early`, what was already read) until the first TLS
/// ClientHello is whole, or the bytes show it is not TLS. Returns what it found and every
/// byte read (to be forwarded as they are).
pub(crate) async fn peek(client: &mut (impl AsyncRead + Unpin), early: &[u8]) -> (Hello, Vec<u8>) {
    let mut buf = early.to_vec();
    let mut chunk = vec![0u8; 16 << 10];
    loop {
        match parse(&buf) {
            Parsed::Done(hello) => return (hello, buf),
            Parsed::More if buf.len() < MAX_HELLO + 5 * 8 => {}
            Parsed::More => return (Hello::Malformed, buf),
        }
        match client.read(&mut chunk).await {
            Ok(0) | Err(_) => {
                let hello =
                    if buf.first().is_some_and(|b| *b == 0x16) { Hello::Malformed } else { Hello::NotTls };
                return (hello, buf);
            }
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

enum Parsed {
    Done(Hello),
    More,
}

/// Parses the handshake records at the start of `bytes`.
fn parse(bytes: &[u8]) -> Parsed {
    let Some(&first) = bytes.first() else { return Parsed::More };
    if first != 0x16 {
        return Parsed::Done(Hello::NotTls);
    }
    // Reassemble the handshake message from as many records as it spans.
    let mut handshake = Vec::new();
    let mut at = 0;
    loop {
        let Some(header) = bytes.get(at..at + 5) else { return Parsed::More };
        if header[0] != 0x16 {
            return Parsed::Done(Hello::Malformed);
        }
        let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
        let Some(fragment) = bytes.get(at + 5..at + 5 + len) else { return Parsed::More };
        handshake.extend_from_slice(fragment);
        at += 5 + len;
        if handshake.len() >= 4 {
            if handshake[0] != 0x01 {
                return Parsed::Done(Hello::Malformed);
            }
            let body = (usize::from(handshake[1]) << 16)
                | (usize::from(handshake[2]) << 8)
                | usize::from(handshake[3]);
            if body > MAX_HELLO {
                return Parsed::Done(Hello::Malformed);
            }
            if handshake.len() >= 4 + body {
                return Parsed::Done(
                    server_name(&handshake[4..4 + body]).map_or(Hello::Malformed, Hello::Tls),
                );
            }
        }
    }
}

/// A cursor over the ClientHello's fields.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|b| usize::from(b[0]))
    }
    fn u16(&mut self) -> Option<usize> {
        self.take(2).map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
    }
    fn vec8(&mut self) -> Option<&'a [u8]> {
        let n = self.u8()?;
        self.take(n)
    }
    fn vec16(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()?;
        self.take(n)
    }
}

/// The ClientHello body's `server_name` (host name type), lower case: `Some(None)` when it
/// has none, `None` when it does not parse.
fn server_name(body: &[u8]) -> Option<Option<String>> {
    let mut r = Reader(body);
    r.take(2 + 32)?; // version, random
    r.vec8()?; // session id
    r.vec16()?; // cipher suites
    r.vec8()?; // compression methods
    if r.0.is_empty() {
        return Some(None);
    }
    let mut extensions = Reader(r.vec16()?);
    while !extensions.0.is_empty() {
        let kind = extensions.u16()?;
        let data = extensions.vec16()?;
        if kind != 0 {
            continue;
        }
        let mut list = Reader(Reader(data).vec16()?);
        while !list.0.is_empty() {
            let name_type = list.u8()?;
            let name = list.vec16()?;
            if name_type == 0 {
                let name = std::str::from_utf8(name).ok()?;
                return Some(Some(name.trim_end_matches('.').to_ascii_lowercase()));
            }
        }
        return Some(None);
    }
    Some(None)
}

/// Whether `sni` names the `CONNECT`'s `host` (case and a trailing dot aside).
pub(crate) fn same_host(sni: &str, host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']').trim_end_matches('.');
    sni.trim_end_matches('.').eq_ignore_ascii_case(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ClientHello record naming `name`, split into records of `split` bytes.
    pub(crate) fn client_hello(name: Option<&str>, split: usize) -> Vec<u8> {
        let mut ext = Vec::new();
        if let Some(name) = name {
            let mut list = vec![0u8];
            list.extend_from_slice(&(name.len() as u16).to_be_bytes());
            list.extend_from_slice(name.as_bytes());
            let mut data = (list.len() as u16).to_be_bytes().to_vec();
            data.extend_from_slice(&list);
            ext.extend_from_slice(&0u16.to_be_bytes());
            ext.extend_from_slice(&(data.len() as u16).to_be_bytes());
            ext.extend_from_slice(&data);
        }
        // Another extension after it (supported versions), to be skipped.
        ext.extend_from_slice(&[0x00, 0x2b, 0x00, 0x03, 0x02, 0x03, 0x04]);
        let mut body = vec![0x03, 0x03];
        body.extend_from_slice(&[7u8; 32]);
        body.extend_from_slice(&[0, 0, 2, 0x13, 0x01, 1, 0]);
        body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
        body.extend_from_slice(&ext);
        let mut handshake = vec![0x01, 0, (body.len() >> 8) as u8, body.len() as u8];
        handshake.extend_from_slice(&body);
        let mut out = Vec::new();
        for fragment in handshake.chunks(split) {
            out.extend_from_slice(&[0x16, 0x03, 0x01]);
            out.extend_from_slice(&(fragment.len() as u16).to_be_bytes());
            out.extend_from_slice(fragment);
        }
        out
    }

    #[tokio::test]
    async fn the_server_name_is_found_across_records_and_reads() {
        for split in [1000, 7] {
            let bytes = client_hello(Some("API.example.com."), split);
            let (mut rx, mut tx) = tokio::io::duplex(1 << 16);
            let (head, rest) = bytes.split_at(3);
            tokio::io::AsyncWriteExt::write_all(&mut tx, rest).await.unwrap();
            let (hello, read) = peek(&mut rx, head).await;
            assert_eq!(hello, Hello::Tls(Some("api.example.com".into())));
            assert_eq!(read, bytes, "every byte read is kept to be forwarded");
        }
    }

    #[tokio::test]
    async fn no_name_other_protocols_and_garbage() {
        let (hello, _) = peek(&mut tokio::io::empty(), &client_hello(None, 1000)).await;
        assert_eq!(hello, Hello::Tls(None));
        let (hello, read) = peek(&mut tokio::io::empty(), b"SSH-2.0-OpenSSH\r\n").await;
        assert_eq!((hello, read.as_slice()), (Hello::NotTls, b"SSH-2.0-OpenSSH\r\n".as_slice()));
        let (hello, _) = peek(&mut tokio::io::empty(), &[0x16, 3, 1, 0, 4, 2, 0, 0, 0]).await;
        assert_eq!(hello, Hello::Malformed, "a handshake that is not a ClientHello");
        let (hello, _) = peek(&mut tokio::io::empty(), &[0x16, 3, 1]).await;
        assert_eq!(hello, Hello::Malformed, "a handshake cut short");
        assert!(same_host("api.example.com", "API.Example.com."));
        assert!(!same_host("evil.test", "api.example.com"));
    }
}
