//! Webhook deliveries over HTTP/1.1 (hyper's client connection; HTTPS with the rustls
//! client configuration of the egress proxy's brokered upstreams, the system's roots).
//! The receiver's name is resolved here and every address checked before connecting, and
//! the connection goes to the address checked (no second lookup a DNS answer could turn
//! towards an internal address): a loopback, private, link-local or otherwise non-public
//! address is refused unless private receivers are allowed (SSRF).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use ports::{SendError, WebhookSender};
use rustls_pki_types::ServerName;

/// The most of a receiver's answer read (its body is not kept).
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// A URL taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    https: bool,
    host: String,
    port: u16,
    /// The path and query (`/` at least).
    path: String,
}

impl Target {
    /// The `Host` header: the host (an IPv6 address in brackets), with the port unless it
    /// is the scheme's (RFC 9110 7.2).
    fn host_header(&self) -> String {
        let host = if self.host.contains(':') { format!("[{}]", self.host) } else { self.host.clone() };
        if self.port == if self.https { 443 } else { 80 } { host } else { format!("{host}:{}", self.port) }
    }
}

fn parse(url: &str) -> Result<Target, SendError> {
    let refuse = |why: &str| SendError::Refused(format!("{why}: {url}"));
    let (https, rest) = if let Some(rest) = url.strip_prefix("https://") {
        (true, rest)
    } else if let Some(rest) = url.strip_prefix("http://") {
        (false, rest)
    } else {
        return Err(refuse("a webhook URL is http:// or https://"));
    };
    let (authority, path) = rest.find(['/', '?']).map_or((rest, "/"), |i| rest.split_at(i));
    if authority.is_empty() || authority.contains('@') {
        return Err(refuse("a webhook URL names a host and no user"));
    }
    if url.contains('#') || url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(refuse("a webhook URL has no fragment, space or control character"));
    }
    let default_port = if https { 443 } else { 80 };
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6.split_once(']').ok_or_else(|| refuse("unclosed [ in the host"))?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().map_err(|_| refuse("a bad port"))?,
            None if after.is_empty() => default_port,
            None => return Err(refuse("a bad host")),
        };
        (host.to_owned(), port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_owned(), p.parse().map_err(|_| refuse("a bad port"))?),
            None => (authority.to_owned(), default_port),
        }
    };
    if host.is_empty() || port == 0 {
        return Err(refuse("a bad host or port"));
    }
    let path = if path.starts_with('?') { format!("/{path}") } else { path.to_owned() };
    Ok(Target { https, host: host.to_ascii_lowercase(), port, path })
}

/// The sender.
#[derive(Debug, Clone)]
pub struct HttpWebhookSender {
    allow_private: bool,
    timeout: Duration,
    tls: Arc<rustls::ClientConfig>,
}

impl HttpWebhookSender {
    /// A sender whose attempts take at most `timeout`; `allow_private` lets receivers be
    /// on loopback or private addresses (`webhooks.allow_private`).
    pub fn new(allow_private: bool, timeout: Duration) -> Self {
        let mut tls = (*crate::egress::broker::system_upstream()).clone();
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        Self { allow_private, timeout, tls: Arc::new(tls) }
    }

    /// The receiver's addresses, every one allowed, or the refusal.
    async fn addresses(&self, target: &Target) -> Result<Vec<SocketAddr>, SendError> {
        let addresses: Vec<SocketAddr> = match target.host.parse::<IpAddr>() {
            Ok(ip) => vec![SocketAddr::new(ip, target.port)],
            Err(_) => tokio::net::lookup_host((target.host.as_str(), target.port))
                .await
                .map_err(|e| SendError::Failed(format!("cannot resolve {}: {e}", target.host)))?
                .collect(),
        };
        if addresses.is_empty() {
            return Err(SendError::Failed(format!("{} has no address", target.host)));
        }
        if !self.allow_private {
            for a in &addresses {
                if let Some(range) = domain::egress::refused_range(a.ip()) {
                    return Err(SendError::Refused(format!(
                        "{} is {} ({range}); private receivers are not allowed (webhooks.allow_private)",
                        target.host,
                        a.ip()
                    )));
                }
            }
        }
        Ok(addresses)
    }

    async fn exchange(
        &self,
        target: &Target,
        headers: &[(String, String)],
        body: &str,
    ) -> Result<u16, SendError> {
        let addresses = self.addresses(target).await?;
        let fail = |what: &str, e: &dyn std::fmt::Display| SendError::Failed(format!("{what}: {e}"));
        let tcp = tokio::net::TcpStream::connect(addresses.as_slice())
            .await
            .map_err(|e| fail(&format!("cannot connect to {}:{}", target.host, target.port), &e))?;
        let _ = tcp.set_nodelay(true);
        let host_header = target.host_header();
        let mut request = Request::post(target.path.as_str())
            .header(hyper::header::HOST, host_header)
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .header(hyper::header::USER_AGENT, concat!("sandlane-webhooks/", env!("CARGO_PKG_VERSION")));
        for (name, value) in headers {
            request = request.header(name.as_str(), value.as_str());
        }
        let request = request
            .body(Full::new(Bytes::copy_from_slice(body.as_bytes())))
            .map_err(|e| fail("bad request", &e))?;
        if target.https {
            let name = ServerName::try_from(target.host.clone()).map_err(|e| fail("bad host name", &e))?;
            let tls = tokio_rustls::TlsConnector::from(self.tls.clone())
                .connect(name, tcp)
                .await
                .map_err(|e| fail("TLS failed", &e))?;
            send(TokioIo::new(tls), request).await
        } else {
            send(TokioIo::new(tcp), request).await
        }
    }
}

async fn send<T>(io: T, request: Request<Full<Bytes>>) -> Result<u16, SendError>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let fail = |what: &str, e: &dyn std::fmt::Display| SendError::Failed(format!("{what}: {e}"));
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(io).await.map_err(|e| fail("HTTP handshake failed", &e))?;
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    let answer = sender.send_request(request).await.map_err(|e| fail("the receiver did not answer", &e));
    let result = match answer {
        Ok(response) => {
            let status = response.status().as_u16();
            // The body is read (up to a cap) so the exchange ends cleanly, then dropped.
            let mut body = response.into_body();
            let mut read = 0usize;
            while read < MAX_ANSWER_BYTES {
                match body.frame().await {
                    Some(Ok(frame)) => read += frame.data_ref().map_or(0, Bytes::len),
                    _ => break,
                }
            }
            Ok(status)
        }
        Err(e) => Err(e),
    };
    driver.abort();
    result
}

#[async_trait]
impl WebhookSender for HttpWebhookSender {
    async fn check(&self, url: &str) -> Result<(), SendError> {
        let target = parse(url)?;
        match self.addresses(&target).await {
            // A name that does not resolve now may later: refused only for what it names.
            Ok(_) | Err(SendError::Failed(_)) => Ok(()),
            Err(refused) => Err(refused),
        }
    }

    async fn send(&self, url: &str, headers: &[(String, String)], body: &str) -> Result<u16, SendError> {
        let target = parse(url)?;
        match tokio::time::timeout(self.timeout, self.exchange(&target, headers, body)).await {
            Ok(result) => result,
            Err(_) => Err(SendError::Failed(format!("no answer within {} ms", self.timeout.as_millis()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_taken_apart_or_refused() {
        let t = parse("https://hooks.example.com/in?x=1").unwrap();
        assert_eq!(
            (t.https, t.host.as_str(), t.port, t.path.as_str()),
            (true, "hooks.example.com", 443, "/in?x=1")
        );
        let t = parse("http://[::1]:8080").unwrap();
        assert_eq!((t.host.as_str(), t.port, t.path.as_str()), ("::1", 8080, "/"));
        for bad in
            ["ftp://x/", "http://", "http://u:p@x/", "http://x:0/", "http://x:99999/", "http://x/#f", "x/y"]
        {
            assert!(matches!(parse(bad), Err(SendError::Refused(_))), "{bad}");
        }
    }

    #[test]
    fn the_host_header_brackets_an_ipv6_address_and_names_a_port_not_the_schemes() {
        let header = |url: &str| parse(url).unwrap().host_header();
        assert_eq!(header("http://[::1]:8080/"), "[::1]:8080");
        assert_eq!(header("https://[2001:db8::1]/in"), "[2001:db8::1]");
        assert_eq!(header("https://Hooks.Example.com:8443/"), "hooks.example.com:8443");
        assert_eq!(header("http://hooks.example.com/"), "hooks.example.com");
    }

    #[tokio::test]
    async fn the_host_header_sent_to_an_ipv6_receiver_is_bracketed() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let Ok(listener) = tokio::net::TcpListener::bind("[::1]:0").await else {
            panic!("this test needs IPv6 on loopback");
        };
        let port = listener.local_addr().unwrap().port();
        let receiver = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = conn.read(&mut buf).await.unwrap();
                assert!(n > 0, "the request ended early");
                got.extend_from_slice(&buf[..n]);
            }
            conn.write_all(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n").await.unwrap();
            String::from_utf8_lossy(&got).to_ascii_lowercase()
        });
        let sender = HttpWebhookSender::new(true, Duration::from_secs(5));
        let status = sender.send(&format!("http://[::1]:{port}/in"), &[], "{}").await.unwrap();
        assert_eq!(status, 204);
        let head = receiver.await.unwrap();
        assert!(head.contains(&format!("\r\nhost: [::1]:{port}\r\n")), "{head}");
    }

    #[tokio::test]
    async fn private_receivers_are_refused_unless_allowed() {
        let strict = HttpWebhookSender::new(false, Duration::from_secs(1));
        for url in [
            "http://127.0.0.1:9/",
            "http://10.1.2.3/",
            "http://[::1]/",
            "http://169.254.169.254/latest",
            "http://localhost:9/",
        ] {
            assert!(matches!(strict.check(url).await, Err(SendError::Refused(_))), "{url}");
            assert!(matches!(strict.send(url, &[], "{}").await, Err(SendError::Refused(_))), "{url}");
        }
        let lax = HttpWebhookSender::new(true, Duration::from_secs(1));
        assert!(lax.check("http://127.0.0.1:9/").await.is_ok());
    }
}
