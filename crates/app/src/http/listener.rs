//! The HTTP listener: holds nothing for long for a client that sends nothing.
//!
//! - **A cap on open connections.** A connection is accepted only with one of
//!   [`ListenerLimits::max_connections`] permits in hand, so past the cap a new client
//!   waits in the kernel's accept queue (its backlog), costing the server no descriptor,
//!   and is served as soon as a connection closes.
//! - **A header-read timeout.** A connection's first request head (request line and
//!   headers) must arrive within [`ListenerLimits::header_timeout`] of its accept; a later
//!   one within that of its first byte. A client that sends half a request is cut off.
//! - **An idle timeout.** A kept-alive connection waits at most
//!   [`ListenerLimits::idle_timeout`] for its next request. A request in progress is never
//!   idle, however long its response stays silent (a streamed exec's output), nor is a
//!   response whose bytes the client is still taking.
//!
//! hyper's own `header_read_timeout` cannot say this: its clock starts whenever the
//! connection waits for a head, so it would end kept-alive connections at the header
//! timeout. Here `Watched`, the connection's socket, keeps the clock: it knows from the
//! service (`Tracked`) whether a request is in flight, sees the first byte of the next
//! request itself, and ends a connection past its deadline by failing hyper's read.
//!
//! An upgraded connection (`101`: a terminal's WebSocket, [`super::terminals`], or a
//! WebSocket relayed to a preview port) is the upgrade's own from then on: neither
//! timeout applies to it any more (`Activity::upgraded`); its handler ends it.
//!
//! An upgraded connection keeps its place under the cap until its socket closes: the
//! cap counts sockets, so WebSockets cannot take the server's descriptors past it.
//!
//! Graceful shutdown: new connections stop, idle ones close at once, requests in flight
//! finish (streamed responses, terminals and preview WebSockets end on
//! [`super::ndjson::Shutdown`]); [`serve_router`] returns when every socket has closed.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use futures_util::task::AtomicWaker;
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::{Instant, Sleep};
use tower::ServiceExt;
use tracing::{debug, warn};

/// The most a connection buffers of a request's head.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// What the listener holds a client to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenerLimits {
    /// How long a request's head may take: from the accept for a connection's first
    /// request, from its first byte for a later one.
    pub header_timeout: Duration,
    /// How long a kept-alive connection may wait for its next request.
    pub idle_timeout: Duration,
    /// Most connections open at once.
    pub max_connections: u32,
}

/// Serves `router` on `listener` within `limits` until `shutdown` completes, then stops
/// gracefully (see the module's documentation) and returns once every connection ended.
///
/// # Errors
/// None today: an accept error is logged and retried (a full descriptor table, after a
/// second).
pub async fn serve_router(
    listener: TcpListener,
    router: Router,
    limits: ListenerLimits,
    shutdown: impl Future<Output = ()> + Send,
) -> io::Result<()> {
    let max = limits.max_connections.max(1);
    let permits = Arc::new(Semaphore::new(max as usize));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut shutdown = pin!(shutdown);
    loop {
        // The permit first: past the cap, the next client stays in the kernel's queue.
        let permit = tokio::select! {
            biased;
            () = &mut shutdown => break,
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break, // never closed
            },
        };
        let stream = tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(e) if is_connection_error(&e) => continue,
                Err(e) => {
                    // Out of descriptors (or memory): wait rather than spin.
                    warn!(error = %e, "cannot accept a connection; trying again in 1 s");
                    tokio::select! {
                        () = &mut shutdown => break,
                        () = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    }
                }
            },
        };
        keep_alive(&stream);
        tokio::spawn(connection(stream, permit, router.clone(), limits, stop_rx.clone()));
    }
    drop(listener);
    let _ = stop_tx.send(true);
    // Each connection holds a permit until it has ended.
    let _ = permits.acquire_many(max).await;
    Ok(())
}

/// TCP keepalive probes after [`KEEPALIVE_IDLE`] of silence, every [`KEEPALIVE_INTERVAL`],
/// [`KEEPALIVE_PROBES`] of them: a client that vanished without a word (a laptop asleep, a
/// NAT entry dropped) is found within about two minutes, and whatever it held (a terminal
/// attachment, a preview WebSocket, their place under the cap) goes.
fn keep_alive(stream: &TcpStream) {
    use rustix::net::sockopt;
    let set = sockopt::set_socket_keepalive(stream, true)
        .and_then(|()| sockopt::set_tcp_keepidle(stream, KEEPALIVE_IDLE))
        .and_then(|()| sockopt::set_tcp_keepintvl(stream, KEEPALIVE_INTERVAL))
        .and_then(|()| sockopt::set_tcp_keepcnt(stream, KEEPALIVE_PROBES));
    if let Err(e) = set {
        debug!(error = %e, "cannot set TCP keepalive on a connection");
    }
}

const KEEPALIVE_IDLE: Duration = Duration::from_secs(60);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(15);
const KEEPALIVE_PROBES: u32 = 4;

/// An accept error that concerns one connection only (the client went away first).
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
    )
}

/// Serves one connection until it ends. Its permit goes with its socket: back when the
/// socket closes, after the connection or, for an upgrade, after the WebSocket using it.
async fn connection(
    stream: TcpStream,
    permit: OwnedSemaphorePermit,
    router: Router,
    limits: ListenerLimits,
    mut stop: watch::Receiver<bool>,
) {
    let activity = Arc::new(Activity::default());
    let io = TokioIo::new(Watched::new(stream, permit, activity.clone(), limits));
    let mut builder = http1::Builder::new();
    // The head's clock is `Watched`'s (see the module's documentation).
    builder.header_read_timeout(None);
    // A request's head is read into at most this much (hyper's default is about 400 KiB a
    // connection: thousands of slow heads would hold gigabytes); a longer head is
    // answered 431. Bodies stream past it.
    builder.max_buf_size(MAX_HEAD_BYTES);
    // Upgrades (terminals' and previews' WebSockets) take the connection over from hyper.
    let mut conn = pin!(builder.serve_connection(io, Tracked { router, activity }).with_upgrades());
    let stopping = async move {
        let _ = stop.wait_for(|stopping| *stopping).await;
    };
    let result = tokio::select! {
        result = conn.as_mut() => result,
        () = stopping => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        debug!(error = %e, "connection ended");
    }
}

/// What a connection's service tells its socket.
#[derive(Debug, Default)]
struct Activity {
    /// Requests taken and not yet answered to the last byte (at most one on HTTP/1).
    in_flight: AtomicUsize,
    /// Responses ended (or requests abandoned) so far: a new value starts an idle wait.
    ended: AtomicU64,
    /// Whether the connection was upgraded (`101`): it is then a WebSocket whose handler
    /// keeps its own time, never idle here.
    upgraded: AtomicBool,
    /// The read that was waiting while a request was in flight, with no deadline of its
    /// own: woken when the request ends, so the idle wait starts even if nothing else
    /// polls the read again.
    reader: AtomicWaker,
}

/// Marks a request in flight until dropped, with its response's body.
#[derive(Debug)]
struct InFlight(Arc<Activity>);

impl InFlight {
    fn enter(activity: &Arc<Activity>) -> Self {
        activity.in_flight.fetch_add(1, Ordering::AcqRel);
        Self(activity.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        // `ended` first: whoever sees no request in flight sees the new idle wait too.
        self.0.ended.fetch_add(1, Ordering::AcqRel);
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.0.reader.wake();
    }
}

/// The router as hyper's service, marking each request in flight until its response's
/// body has ended or was dropped.
#[derive(Clone)]
struct Tracked {
    router: Router,
    activity: Arc<Activity>,
}

type TrackedFuture =
    Pin<Box<dyn Future<Output = Result<axum::response::Response<TrackedBody>, Infallible>> + Send>>;

impl hyper::service::Service<hyper::Request<Incoming>> for Tracked {
    type Response = axum::response::Response<TrackedBody>;
    type Error = Infallible;
    type Future = TrackedFuture;

    fn call(&self, request: hyper::Request<Incoming>) -> Self::Future {
        // Called as the head is parsed, before the body is read: from here the
        // connection is busy, not idle.
        let in_flight = InFlight::enter(&self.activity);
        let router = self.router.clone();
        let activity = self.activity.clone();
        Box::pin(async move {
            let response = router.oneshot(request.map(Body::new)).await?;
            if response.status() == axum::http::StatusCode::SWITCHING_PROTOCOLS {
                activity.upgraded.store(true, Ordering::Release);
            }
            Ok(response.map(|body| TrackedBody { body, _in_flight: in_flight }))
        })
    }
}

/// A response body that keeps its request in flight while it lives.
struct TrackedBody {
    body: Body,
    _in_flight: InFlight,
}

impl HttpBody for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A connection's socket with its deadline: while no request is in flight, a read that
/// would wait fails once the deadline has passed, which ends the connection.
struct Watched {
    stream: TcpStream,
    /// The connection's place under the cap, held as long as its socket is open: an
    /// upgraded connection (a WebSocket) outlives hyper's connection and keeps it.
    _permit: OwnedSemaphorePermit,
    activity: Arc<Activity>,
    limits: ListenerLimits,
    /// The idle wait the deadline belongs to (the `ended` count it started at); `None`
    /// while a request is in flight.
    wait: Option<u64>,
    /// Whether a byte of the next request arrived during this wait.
    head_started: bool,
    deadline: Pin<Box<Sleep>>,
}

impl Watched {
    fn new(
        stream: TcpStream,
        permit: OwnedSemaphorePermit,
        activity: Arc<Activity>,
        limits: ListenerLimits,
    ) -> Self {
        // The first request's head is due a header timeout after the accept.
        let deadline = Box::pin(tokio::time::sleep(limits.header_timeout));
        Self { stream, _permit: permit, activity, limits, wait: Some(0), head_started: false, deadline }
    }

    /// Whether a request is in flight; else brings the deadline to the current wait.
    fn busy(&mut self) -> bool {
        if self.activity.in_flight.load(Ordering::Acquire) > 0
            || self.activity.upgraded.load(Ordering::Acquire)
        {
            self.wait = None;
            return true;
        }
        let ended = self.activity.ended.load(Ordering::Acquire);
        if self.wait != Some(ended) {
            // A response ended: the connection waits for its next request.
            self.wait = Some(ended);
            self.head_started = false;
            self.deadline.as_mut().reset(Instant::now() + self.limits.idle_timeout);
        }
        false
    }

    fn expired(&self) -> io::Error {
        let what = if self.head_started || self.wait == Some(0) {
            "the request's head took longer than the header timeout"
        } else {
            "the connection was idle longer than the idle timeout"
        };
        io::Error::new(io::ErrorKind::TimedOut, what)
    }

    /// After bytes of the response went out while idle (the tail of an ended response):
    /// the client is taking them, so the idle wait starts again.
    fn wrote(&mut self, n: usize) {
        if n > 0 && !self.busy() && !self.head_started && self.wait != Some(0) {
            self.deadline.as_mut().reset(Instant::now() + self.limits.idle_timeout);
        }
    }
}

impl AsyncRead for Watched {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // Registered before `busy` reads the counts, so an end in between still wakes it.
        this.activity.reader.register(cx.waker());
        if this.busy() {
            return Pin::new(&mut this.stream).poll_read(cx, buf);
        }
        if this.deadline.is_elapsed() {
            return Poll::Ready(Err(this.expired()));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before && !this.head_started {
                    this.head_started = true;
                    // A later request's head is due a header timeout after its first
                    // byte; the first request's stays due from the accept.
                    if this.wait != Some(0) {
                        this.deadline.as_mut().reset(Instant::now() + this.limits.header_timeout);
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                ready!(this.deadline.as_mut().poll(cx));
                Poll::Ready(Err(this.expired()))
            }
        }
    }
}

impl AsyncWrite for Watched {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let n = ready!(Pin::new(&mut this.stream).poll_write(cx, buf))?;
        this.wrote(n);
        Poll::Ready(Ok(n))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let n = ready!(Pin::new(&mut this.stream).poll_write_vectored(cx, bufs))?;
        this.wrote(n);
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::time::Instant as StdInstant;

    use axum::routing::get;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::oneshot;
    use tokio::task::JoinHandle;

    use super::*;

    const REQUEST: &[u8] = b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n";
    const HALF: &[u8] = b"GET /ok HTTP/1.1\r\nHost: x\r\n";

    /// `/ok`; `/silent`: "a", 1.2 s of silence, then "b".
    fn router() -> Router {
        let silent = || async {
            let chunks = futures_util::stream::unfold(0u8, |step| async move {
                match step {
                    0 => Some((Ok::<_, Infallible>(Bytes::from_static(b"a")), 1)),
                    1 => {
                        tokio::time::sleep(Duration::from_millis(1200)).await;
                        Some((Ok(Bytes::from_static(b"b")), 2))
                    }
                    _ => None,
                }
            });
            Body::from_stream(chunks)
        };
        // Upgrades, then reads the upgraded connection until the client closes it.
        let upgrade = |mut request: axum::extract::Request| async move {
            let on = hyper::upgrade::on(&mut request);
            tokio::spawn(async move {
                if let Ok(upgraded) = on.await {
                    let mut io = TokioIo::new(upgraded);
                    let mut buf = [0u8; 64];
                    while let Ok(1..) = io.read(&mut buf).await {}
                }
            });
            axum::http::Response::builder()
                .status(axum::http::StatusCode::SWITCHING_PROTOCOLS)
                .header("connection", "upgrade")
                .header("upgrade", "test")
                .body(Body::empty())
                .unwrap()
        };
        Router::new()
            .route("/ok", get(|| async { "ok" }))
            .route("/silent", get(silent))
            .route("/upgrade", get(upgrade))
    }

    struct Served {
        address: SocketAddr,
        stop: Option<oneshot::Sender<()>>,
        task: JoinHandle<io::Result<()>>,
    }

    async fn serve(header_ms: u64, idle_ms: u64, max_connections: u32) -> Served {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let limits = ListenerLimits {
            header_timeout: Duration::from_millis(header_ms),
            idle_timeout: Duration::from_millis(idle_ms),
            max_connections,
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve_router(listener, router(), limits, async move {
            let _ = stopped.await;
        }));
        Served { address, stop: Some(stop), task }
    }

    /// Reads until `needle` is in what was read (or the connection ends); returns it.
    async fn read_until(stream: &mut TcpStream, needle: &[u8]) -> Vec<u8> {
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        let done = |seen: &[u8]| seen.windows(needle.len()).any(|w| w == needle);
        while !done(&seen) {
            let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
                .await
                .expect("an answer within 5 s")
                .expect("read");
            if n == 0 {
                break;
            }
            seen.extend_from_slice(&buf[..n]);
        }
        seen
    }

    /// How long until the server ends the connection (EOF or reset), at most `limit`.
    async fn closed_after(stream: &mut TcpStream, limit: Duration) -> Option<Duration> {
        let start = StdInstant::now();
        let mut buf = [0u8; 1024];
        loop {
            match tokio::time::timeout(limit.saturating_sub(start.elapsed()), stream.read(&mut buf)).await {
                Err(_) => return None,
                Ok(Ok(0) | Err(_)) => return Some(start.elapsed()),
                Ok(Ok(_)) => {}
            }
        }
    }

    /// Accepted sockets probe a silent peer.
    #[tokio::test]
    async fn accepted_sockets_keep_alive() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        keep_alive(&accepted);
        assert!(rustix::net::sockopt::socket_keepalive(&accepted).unwrap());
        assert_eq!(rustix::net::sockopt::tcp_keepidle(&accepted).unwrap(), KEEPALIVE_IDLE);
        assert_eq!(rustix::net::sockopt::tcp_keepcnt(&accepted).unwrap(), KEEPALIVE_PROBES);
        drop(client);
    }

    /// An upgraded connection keeps its place under the cap until its socket closes: with
    /// a cap of one, a second client waits while a WebSocket is open, and is served once
    /// it closes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_upgraded_connection_counts_until_it_closes() {
        let served = serve(5_000, 10_000, 1).await;
        let mut upgraded = TcpStream::connect(served.address).await.unwrap();
        upgraded
            .write_all(b"GET /upgrade HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgrade: test\r\n\r\n")
            .await
            .unwrap();
        assert!(read_until(&mut upgraded, b"\r\n\r\n").await.starts_with(b"HTTP/1.1 101"));
        let mut next = TcpStream::connect(served.address).await.unwrap();
        next.write_all(REQUEST).await.unwrap();
        let mut buf = [0u8; 64];
        let early = tokio::time::timeout(Duration::from_millis(700), next.read(&mut buf)).await;
        assert!(early.is_err(), "not served while the upgraded connection holds the only place");
        drop(upgraded);
        assert!(read_until(&mut next, b"ok").await.starts_with(b"HTTP/1.1 200"), "served once it closed");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn half_a_head_or_nothing_is_cut_at_the_header_timeout() {
        let served = serve(300, 10_000, 16).await;
        let mut half = TcpStream::connect(served.address).await.unwrap();
        half.write_all(HALF).await.unwrap();
        let mut silent = TcpStream::connect(served.address).await.unwrap();
        let waited = closed_after(&mut half, Duration::from_secs(3)).await.expect("half a head is cut");
        assert!(waited >= Duration::from_millis(250), "not before the timeout: {waited:?}");
        assert!(closed_after(&mut silent, Duration::from_secs(1)).await.is_some(), "nothing sent: cut too");
        // A whole request on a new connection is answered.
        let mut whole = TcpStream::connect(served.address).await.unwrap();
        whole.write_all(REQUEST).await.unwrap();
        assert!(read_until(&mut whole, b"ok").await.starts_with(b"HTTP/1.1 200"));
    }

    /// A head larger than [`MAX_HEAD_BYTES`] is refused (431) and its connection closed,
    /// never buffered whole; one within it is served.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_head_past_the_buffer_is_refused_not_held() {
        let served = serve(5_000, 10_000, 16).await;
        let head = |header_bytes: usize| {
            format!("GET /ok HTTP/1.1\r\nHost: x\r\nX-Pad: {}\r\n\r\n", "a".repeat(header_bytes)).into_bytes()
        };
        let mut small = TcpStream::connect(served.address).await.unwrap();
        small.write_all(&head(MAX_HEAD_BYTES / 2)).await.unwrap();
        assert!(read_until(&mut small, b"ok").await.starts_with(b"HTTP/1.1 200"));
        let mut large = TcpStream::connect(served.address).await.unwrap();
        // Written while the server reads (it may close before taking all of it).
        let _ = large.write_all(&head(MAX_HEAD_BYTES * 3)).await;
        let answer = read_until(&mut large, b"\r\n").await;
        assert!(answer.starts_with(b"HTTP/1.1 431"), "{:?}", String::from_utf8_lossy(&answer));
        assert!(closed_after(&mut large, Duration::from_secs(3)).await.is_some(), "closed after the 431");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_kept_alive_connection_waits_the_idle_timeout_and_a_later_head_the_header_timeout() {
        let served = serve(200, 1_000, 16).await;
        let mut stream = TcpStream::connect(served.address).await.unwrap();
        stream.write_all(REQUEST).await.unwrap();
        read_until(&mut stream, b"ok").await;
        // Idle past the header timeout but within the idle one: still served.
        tokio::time::sleep(Duration::from_millis(500)).await;
        stream.write_all(REQUEST).await.unwrap();
        assert!(read_until(&mut stream, b"ok").await.starts_with(b"HTTP/1.1 200"));
        let idle = closed_after(&mut stream, Duration::from_secs(3)).await.expect("closed when idle");
        assert!(idle >= Duration::from_millis(900), "the idle timeout, not the header one: {idle:?}");

        // After a response, half of the next head is due the header timeout.
        let mut stream = TcpStream::connect(served.address).await.unwrap();
        stream.write_all(REQUEST).await.unwrap();
        read_until(&mut stream, b"ok").await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        stream.write_all(HALF).await.unwrap();
        let cut = closed_after(&mut stream, Duration::from_secs(3)).await.expect("half a head is cut");
        assert!(cut < Duration::from_millis(700), "the header timeout from its first byte: {cut:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_silent_response_in_progress_is_never_cut() {
        let served = serve(200, 200, 16).await;
        let mut stream = TcpStream::connect(served.address).await.unwrap();
        stream.write_all(b"GET /silent HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
        let start = StdInstant::now();
        let mut response = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut response))
            .await
            .unwrap()
            .unwrap();
        let text = String::from_utf8_lossy(&response);
        assert!(start.elapsed() >= Duration::from_millis(1200), "{text}");
        assert!(
            text.contains("\r\n1\r\na\r\n1\r\nb\r\n0\r\n\r\n"),
            "the whole body, silence and all: {text}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn past_the_cap_a_client_waits_until_a_connection_closes() {
        let served = serve(10_000, 10_000, 2).await;
        let first = TcpStream::connect(served.address).await.unwrap();
        let _second = TcpStream::connect(served.address).await.unwrap();
        let mut third = TcpStream::connect(served.address).await.unwrap();
        third.write_all(REQUEST).await.unwrap();
        let mut buf = [0u8; 64];
        let early = tokio::time::timeout(Duration::from_millis(500), third.read(&mut buf)).await;
        assert!(early.is_err(), "not served while two connections are open: {early:?}");
        drop(first);
        assert!(read_until(&mut third, b"ok").await.starts_with(b"HTTP/1.1 200"), "served once one closed");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shutdown_closes_idle_connections_and_lets_a_response_finish() {
        let mut served = serve(10_000, 10_000, 16).await;
        let mut idle = TcpStream::connect(served.address).await.unwrap();
        idle.write_all(REQUEST).await.unwrap();
        read_until(&mut idle, b"ok").await;
        let mut busy = TcpStream::connect(served.address).await.unwrap();
        busy.write_all(b"GET /silent HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        read_until(&mut busy, b"\r\n1\r\na\r\n").await;
        let _ = served.stop.take().unwrap().send(());
        assert!(closed_after(&mut idle, Duration::from_millis(500)).await.is_some(), "idle: closed at once");
        assert!(!served.task.is_finished(), "a response is still in progress");
        let rest = read_until(&mut busy, b"0\r\n\r\n").await;
        assert!(String::from_utf8_lossy(&rest).contains("b\r\n0\r\n\r\n"), "it finished");
        let result = tokio::time::timeout(Duration::from_secs(3), served.task).await.expect("serve returns");
        assert!(result.unwrap().is_ok());
        assert!(TcpStream::connect(served.address).await.is_err(), "no longer listening");
    }
}
