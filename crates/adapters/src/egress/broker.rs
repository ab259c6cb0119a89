//! Brokered connections: where the gate's grant carries secrets for the host
//! ([`ports::egress::Brokered`]), the proxy ends the sandbox's TLS itself with a leaf of
//! the sandbox's own CA ([`super::ca`]), serves HTTP/1.1 or HTTP/2 to it (ALPN), and for
//! each request checks the binding's methods and paths, records the use, replaces the
//! named header with the secret's value and forwards it over TLS to the real server,
//! verified against the system's roots (or `egress.upstream_ca_file`). A plain HTTP
//! request gets the same check, record and header (`prepare`).
//!
//! The ClientHello must name the `CONNECT`'s host: no SNI, or another name, and the
//! connection is closed before any certificate is shown. Every byte to and from the
//! sandbox counts against the connection's budget (`Counted`); bodies stream both ways
//! under hyper's flow control (a client that stops reading stops the upstream's reads).

use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use domain::SandboxId;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use ports::egress::{BrokerUse, Brokered, EgressBudget};
use rustls::ClientConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::ca::{CaError, CaSource};
use super::{Body, BoxError, HEADER_TIMEOUT, text};

/// The upstream HTTP/2 flow-control window of one stream, in bytes.
const UPSTREAM_STREAM_WINDOW: u32 = 256 << 10;
/// The upstream HTTP/2 flow-control window of one connection, in bytes.
const UPSTREAM_CONNECTION_WINDOW: u32 = 1 << 20;

/// Most concurrent HTTP/2 streams one brokered client connection may open.
const MAX_STREAMS: u32 = 32;

/// Most bytes of answers one HTTP/2 stream buffers towards a client that does not read
/// them (with [`MAX_STREAMS`]: at most 2 MiB per brokered connection).
const MAX_STREAM_BUFFER: usize = 64 << 10;

/// How long one brokered connection takes new requests. Its secrets, and the caller they
/// are chosen for, are decided when the sandbox's client opens it: past this it takes no
/// new request (HTTP/2: `GOAWAY`; HTTP/1.1: closed once idle), the requests in flight
/// finish, and the client's next connection is decided afresh (a caller revoked or
/// changed by a later ensure, a secret deleted).
pub const BROKERED_LIFETIME: std::time::Duration = std::time::Duration::from_secs(60);

/// What the proxy needs to broker TLS for one sandbox: its CA, and how upstream servers
/// are verified.
#[derive(Clone)]
pub struct BrokerTls {
    /// The sandbox's CA (`None`: brokered `CONNECT`s are refused).
    pub ca: Option<Arc<dyn CaSource>>,
    /// The TLS client configuration towards real servers.
    pub upstream: Arc<ClientConfig>,
    /// How long a brokered connection takes new requests ([`BROKERED_LIFETIME`]).
    pub lifetime: std::time::Duration,
}

impl std::fmt::Debug for BrokerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerTls").field("ca", &self.ca.is_some()).finish_non_exhaustive()
    }
}

impl BrokerTls {
    /// The sandbox's CA and the upstream settings, connections kept [`BROKERED_LIFETIME`].
    pub fn new(ca: Option<Arc<dyn CaSource>>, upstream: Arc<ClientConfig>) -> Self {
        Self { ca, upstream, lifetime: BROKERED_LIFETIME }
    }

    /// No CA (brokered TLS refused), upstream verified against the system's roots.
    pub fn without_ca() -> Self {
        Self::new(None, system_upstream())
    }
}

/// The upstream client configuration over the system's roots, loaded once.
pub fn system_upstream() -> Arc<ClientConfig> {
    static CONFIG: std::sync::OnceLock<Arc<ClientConfig>> = std::sync::OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let mut roots = rustls::RootCertStore::empty();
            let found = rustls_native_certs::load_native_certs();
            let (added, _ignored) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                tracing::warn!(
                    "egress: no system root certificate found; brokered upstreams will not verify"
                );
            }
            client_config(roots)
        })
        .clone()
}

/// The upstream client configuration: the system's roots, or only those of the PEM file
/// `ca_file` when given (`egress.upstream_ca_file`).
///
/// # Errors
/// [`CaError`] when the file does not read or holds no certificate.
pub fn upstream_tls(ca_file: Option<&Path>) -> Result<Arc<ClientConfig>, CaError> {
    let Some(path) = ca_file else { return Ok(system_upstream()) };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| CaError::new(format!("cannot read {}: {e}", path.display())))?
        .collect::<Result<_, _>>()
        .map_err(|e| CaError::new(format!("{} does not parse: {e}", path.display())))?;
    let mut roots = rustls::RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(CaError::new(format!("{} holds no usable certificate", path.display())));
    }
    Ok(client_config(roots))
}

fn client_config(roots: rustls::RootCertStore) -> Arc<ClientConfig> {
    let mut config = ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_or_else(
            |_| ClientConfig::builder().with_root_certificates(roots.clone()).with_no_client_auth(),
            |builder| builder.with_root_certificates(roots.clone()).with_no_client_auth(),
        );
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Arc::new(config)
}

/// A byte stream whose bytes, both ways, are spent from the connection's budget: once it
/// is used up, reads and writes fail (the connection ends).
pub(super) struct Counted<I> {
    inner: I,
    budget: Arc<dyn EgressBudget>,
}

impl<I> Counted<I> {
    pub(super) fn new(inner: I, budget: Arc<dyn EgressBudget>) -> Self {
        Self { inner, budget }
    }
}

fn used_up() -> std::io::Error {
    std::io::Error::other("the sandbox used its egress allowance of bytes")
}

impl<I: AsyncRead + Unpin> AsyncRead for Counted<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let n = (buf.filled().len() - before) as u64;
                if n > 0 && !self.budget.spend(n) {
                    buf.set_filled(before);
                    return Poll::Ready(Err(used_up()));
                }
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Counted<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write(cx, buf) {
            Poll::Ready(Ok(n)) if n > 0 && !self.budget.spend(n as u64) => Poll::Ready(Err(used_up())),
            other => other,
        }
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A byte stream read from `head` first (what was read ahead of it), then from `inner`.
pub(super) struct Prefixed<I> {
    head: Bytes,
    inner: I,
}

impl<I> Prefixed<I> {
    pub(super) fn new(head: Bytes, inner: I) -> Self {
        Self { head, inner }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Prefixed<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !self.head.is_empty() {
            let n = self.head.len().min(buf.remaining());
            let chunk = self.head.split_to(n);
            buf.put_slice(&chunk);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Prefixed<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The first answer a refused brokered request gets, or `None` when it may go: checks
/// every injection's methods and paths (refused: recorded with `allowed: false`, 403),
/// records each use (a record that fails: 503, nothing sent), then replaces each named
/// header with its value.
pub(super) async fn prepare<B>(
    request: &mut Request<B>,
    broker: &Brokered,
    sandbox: &SandboxId,
    host: &str,
) -> Option<Response<Body>> {
    let method = request.method().as_str().to_owned();
    let target = request.uri().path_and_query().map_or("/", |p| p.as_str()).to_owned();
    let path = request.uri().path().to_owned();
    let used = |secret: &str, allowed: bool| BrokerUse {
        sandbox: sandbox.clone(),
        secret: secret.to_owned(),
        host: host.to_owned(),
        method: method.clone(),
        path: path.clone(),
        allowed,
    };
    if matches!(method.as_str(), "TRACE" | "TRACK") {
        // Its answer echoes the request's headers back: the secret with them.
        return Some(text(
            StatusCode::METHOD_NOT_ALLOWED,
            "a request that carries a secret may not be TRACE",
        ));
    }
    if let Some(refused) = broker.injections.iter().find(|i| !i.permits(&method, &target)) {
        // Recorded whatever the audit answers: the request is refused either way.
        let _ = broker.audit.record(&used(&refused.secret, false)).await;
        return Some(text(
            StatusCode::FORBIDDEN,
            "the request's method or path is outside the secret's binding",
        ));
    }
    for injection in &broker.injections {
        if !broker.audit.record(&used(&injection.secret, true)).await {
            return Some(text(
                StatusCode::SERVICE_UNAVAILABLE,
                "the use of a secret could not be recorded; not sent",
            ));
        }
    }
    let headers = request.headers_mut();
    for injection in &broker.injections {
        let (Ok(name), Ok(mut value)) = (
            HeaderName::from_bytes(injection.header.as_bytes()),
            HeaderValue::from_str(injection.value.expose()),
        ) else {
            return Some(text(StatusCode::SERVICE_UNAVAILABLE, "a secret's header does not encode"));
        };
        value.set_sensitive(true);
        headers.remove(&name);
        headers.insert(name, value);
    }
    None
}

/// One brokered `CONNECT`: what the proxy needs to serve it once the client's TLS is ended.
pub(super) struct Session {
    pub sandbox: SandboxId,
    pub host: String,
    pub port: u16,
    pub addrs: Vec<std::net::SocketAddr>,
    pub budget: Arc<dyn EgressBudget>,
    pub broker: Brokered,
    pub upstream_tls: Arc<ClientConfig>,
    pub lifetime: std::time::Duration,
}

/// How requests reach the real server: one connection, opened on the first request
/// (over the TCP connection made before the `CONNECT` was answered) and again when it
/// closed. HTTP/2 when the server offers it (requests multiplexed), else HTTP/1.1
/// (requests one after another on it).
enum Sender {
    H1(hyper::client::conn::http1::SendRequest<Body>),
    H2(hyper::client::conn::http2::SendRequest<Body>),
}

struct Upstream {
    session: Session,
    first: std::sync::Mutex<Option<TcpStream>>,
    sender: tokio::sync::Mutex<Option<Sender>>,
}

/// Serves a brokered `CONNECT` whose client is `client` (the bytes after the `200`):
/// reads its ClientHello, refuses it unless its SNI is the `CONNECT`'s host, ends TLS with
/// a leaf for that host, and serves HTTP/1.1 or HTTP/2 on it until it ends.
pub(super) async fn serve_tls<I>(
    client: I,
    upstream: TcpStream,
    session: Session,
    ca: Arc<super::ca::SandboxCa>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let client = Counted::new(client, session.budget.clone());
    let acceptor = tokio_rustls::LazyConfigAcceptor::new(rustls::server::Acceptor::default(), client);
    let Ok(Ok(start)) = tokio::time::timeout(HEADER_TIMEOUT, acceptor).await else { return };
    let sni = start.client_hello().server_name().map(str::to_owned);
    if !sni.as_deref().is_some_and(|name| super::sni::same_host(name, &session.host)) {
        tracing::debug!(sandbox = %session.sandbox, "egress: a brokered ClientHello named another host (or none); closed");
        return;
    }
    let config = match ca.server_config(&session.host) {
        Ok(config) => config,
        Err(e) => {
            tracing::warn!(sandbox = %session.sandbox, error = %e, "egress: no leaf certificate for a brokered host");
            return;
        }
    };
    let Ok(Ok(tls)) = tokio::time::timeout(HEADER_TIMEOUT, start.into_stream(config)).await else { return };
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2".as_slice());
    let lifetime = tokio::time::sleep(session.lifetime);
    let upstream = Arc::new(Upstream {
        session,
        first: std::sync::Mutex::new(Some(upstream)),
        sender: tokio::sync::Mutex::new(None),
    });
    let service = hyper::service::service_fn(move |request| {
        let upstream = upstream.clone();
        async move { Ok::<_, std::convert::Infallible>(upstream.handle(request).await) }
    });
    let io = TokioIo::new(tls);
    // Past its lifetime the connection takes no new request: `graceful_shutdown` lets what
    // is in flight finish ([`BROKERED_LIFETIME`]).
    macro_rules! until_lifetime {
        ($connection:expr) => {{
            let connection = $connection;
            tokio::pin!(connection, lifetime);
            tokio::select! {
                served = connection.as_mut() => served,
                () = lifetime => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            }
        }};
    }
    let served = if h2 {
        until_lifetime!(
            hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .max_concurrent_streams(MAX_STREAMS)
                .max_send_buf_size(MAX_STREAM_BUFFER)
                .serve_connection(io, service)
        )
    } else {
        until_lifetime!(
            hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(io, service)
        )
    };
    if let Err(e) = served {
        tracing::debug!(error = %e, "egress: a brokered connection ended with an error");
    }
}

impl Upstream {
    async fn handle(&self, mut request: Request<Incoming>) -> Response<Body> {
        let s = &self.session;
        // This hop's headers go before the secret is set: a header the sandbox names in
        // `Connection` (`authorization`, say) must not take the injected one with it.
        strip_hop_by_hop(request.headers_mut(), true);
        if let Some(refused) = prepare(&mut request, &s.broker, &s.sandbox, &s.host).await {
            return refused;
        }
        // The client's bytes are counted where they arrive ([`Counted`]); bodies pass as
        // they come.
        let request = request.map(|inner| inner.map_err(BoxError::from).boxed());
        let mut guard = self.sender.lock().await;
        let reusable = match guard.as_mut() {
            Some(Sender::H1(sender)) => sender.ready().await.is_ok(),
            Some(Sender::H2(sender)) => !sender.is_closed(),
            None => false,
        };
        if !reusable {
            match self.open().await {
                Ok(sender) => *guard = Some(sender),
                Err(why) => return text(StatusCode::BAD_GATEWAY, &format!("{}:{}: {why}", s.host, s.port)),
            }
        }
        let sent = match guard.as_mut() {
            Some(Sender::H1(sender)) => {
                let request = match origin_form(request, &s.host, s.port) {
                    Ok(r) => r,
                    Err(why) => return text(StatusCode::BAD_REQUEST, why),
                };
                let sent = sender.send_request(request);
                drop(guard);
                sent.await
            }
            Some(Sender::H2(sender)) => {
                let request = match absolute_form(request, &s.host, s.port) {
                    Ok(r) => r,
                    Err(why) => return text(StatusCode::BAD_REQUEST, why),
                };
                let mut sender = sender.clone();
                drop(guard);
                sender.send_request(request).await
            }
            None => return text(StatusCode::BAD_GATEWAY, "no upstream connection"),
        };
        match sent {
            // Streamed back as it comes; the bytes are counted where they leave ([`Counted`]).
            Ok(response) => {
                let mut response = response.map(|inner| inner.map_err(BoxError::from).boxed());
                strip_hop_by_hop(response.headers_mut(), false);
                response
            }
            Err(e) => text(StatusCode::BAD_GATEWAY, &format!("{}:{}: {e}", s.host, s.port)),
        }
    }

    /// Opens a TLS connection to the real server, verified for the host (SNI: the host).
    async fn open(&self) -> Result<Sender, String> {
        let s = &self.session;
        let first = self.first.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        let tcp = match first {
            Some(tcp) => tcp,
            None => super::connect(&s.addrs).await.ok_or("cannot connect")?,
        };
        let name = ServerName::try_from(s.host.clone()).map_err(|e| format!("not a server name: {e}"))?;
        let connector = tokio_rustls::TlsConnector::from(s.upstream_tls.clone());
        let tls = match tokio::time::timeout(super::CONNECT_TIMEOUT, connector.connect(name, tcp)).await {
            Ok(Ok(tls)) => tls,
            Ok(Err(e)) => return Err(format!("TLS: {e}")),
            Err(_) => return Err("TLS handshake timed out".to_owned()),
        };
        let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2".as_slice());
        let io = TokioIo::new(tls);
        if h2 {
            // Small flow-control windows: what the upstream may send ahead of the sandbox's
            // reads is held by the server (hyper's defaults, 2 MiB a stream and 5 MiB a
            // connection, times 64 connections a sandbox, would be 320 MiB).
            let (sender, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .initial_stream_window_size(UPSTREAM_STREAM_WINDOW)
                .initial_connection_window_size(UPSTREAM_CONNECTION_WINDOW)
                .handshake(io)
                .await
                .map_err(|e| e.to_string())?;
            tokio::spawn(connection);
            Ok(Sender::H2(sender))
        } else {
            let (sender, connection) =
                hyper::client::conn::http1::Builder::new().handshake(io).await.map_err(|e| e.to_string())?;
            tokio::spawn(connection);
            Ok(Sender::H1(sender))
        }
    }
}

/// Headers of one hop only, never forwarded.
const HOP_BY_HOP: [&str; 8] = [
    "proxy-connection",
    "proxy-authorization",
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
    "transfer-encoding",
];

/// Removes the headers of one hop: [`HOP_BY_HOP`] and the ones `Connection` names. On a
/// request, `TE: trailers` alone stays: it says the client takes trailers, which the proxy
/// relays as they come (gRPC asks for it and fails without it).
pub(super) fn strip_hop_by_hop(headers: &mut hyper::HeaderMap, request: bool) {
    let te_trailers = request
        && headers.get_all("te").iter().count() == 1
        && headers.get("te").is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"trailers"));
    let named: Vec<hyper::header::HeaderName> = headers
        .get_all(hyper::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|token| hyper::header::HeaderName::from_bytes(token.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    if te_trailers {
        headers.insert(hyper::header::TE, HeaderValue::from_static("trailers"));
    }
}

fn authority(host: &str, port: u16) -> String {
    if port == 443 { host.to_owned() } else { format!("{host}:{port}") }
}

/// For an HTTP/1.1 server: origin form, `Host` the `CONNECT`'s host.
fn origin_form(mut request: Request<Body>, host: &str, port: u16) -> Result<Request<Body>, &'static str> {
    let origin = request.uri().path_and_query().map_or("/", |p| p.as_str()).to_owned();
    *request.uri_mut() = origin.parse().map_err(|_| "the request's path does not parse")?;
    *request.version_mut() = hyper::Version::HTTP_11;
    let headers = request.headers_mut();
    strip_hop_by_hop(headers, true);
    headers.remove("transfer-encoding");
    let value =
        HeaderValue::from_str(&authority(host, port)).map_err(|_| "the request's host does not parse")?;
    headers.insert(hyper::header::HOST, value);
    Ok(request)
}

/// For an HTTP/2 server: absolute form (its `:authority` the `CONNECT`'s host), no `Host`.
fn absolute_form(mut request: Request<Body>, host: &str, port: u16) -> Result<Request<Body>, &'static str> {
    let origin = request.uri().path_and_query().map_or("/", |p| p.as_str()).to_owned();
    let uri = format!("https://{}{origin}", authority(host, port));
    *request.uri_mut() = uri.parse().map_err(|_| "the request's path does not parse")?;
    *request.version_mut() = hyper::Version::HTTP_2;
    let headers = request.headers_mut();
    strip_hop_by_hop(headers, true);
    headers.remove(hyper::header::HOST);
    Ok(request)
}
