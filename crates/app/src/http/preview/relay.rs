//! The relay of one visitor's request to a port inside a sandbox, and of its answer back:
//! the sandbox's connection is spoken to with hyper's HTTP/1.1 client, its answer streamed
//! to the visitor as it comes, and a WebSocket (any `Upgrade`) becomes a byte pipe both
//! ways. What crosses either way is cleaned here (see the parent module).
//!
//! A plain answer's sandbox connection is driven by the visitor's own task, inside the
//! response body's `poll_frame`: each chunk read from the sandbox is handed to the visitor's
//! connection without a wake-up of another task in between (a bulk download is mostly that
//! hand-off). An upgraded connection gets a task of its own, since it outlives the response.

use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::Request;
use axum::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use axum::http::{StatusCode, Uri};
use axum::response::Response;
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::{is_lane_cookie, page};
use crate::http::AppState;
use crate::usecase::preview::{self as usecase, PreviewConnection};

/// The hop-by-hop headers (RFC 9110 7.6.1), besides those a `Connection` header names.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
];

/// Removes the hop-by-hop headers (and `Upgrade`, put back by the caller for an upgrade).
pub(super) fn drop_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    headers.remove(header::UPGRADE);
}

/// The `Upgrade` a request asks for (a WebSocket's), when its `Connection` says so.
pub(super) fn upgrade_of(headers: &HeaderMap) -> Option<HeaderValue> {
    let asks = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    if asks { headers.get(header::UPGRADE).cloned() } else { None }
}

/// The request's headers as the sandbox may see them.
pub(super) fn forwarded_headers(headers: &mut HeaderMap, upgrade: Option<&HeaderValue>) {
    drop_hop_by_hop(headers);
    headers.remove(header::AUTHORIZATION);
    let cookies: Vec<String> = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .map(str::trim)
        .filter(|pair| {
            !pair.is_empty() && pair.split_once('=').is_none_or(|(name, _)| !is_lane_cookie(name.trim()))
        })
        .map(str::to_owned)
        .collect();
    headers.remove(header::COOKIE);
    if !cookies.is_empty()
        && let Ok(value) = HeaderValue::from_str(&cookies.join("; "))
    {
        headers.insert(header::COOKIE, value);
    }
    if let Some(upgrade) = upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, upgrade.clone());
    }
}

/// Whether a `Set-Cookie` from the sandbox may reach the visitor: not when it names a
/// `Domain` (cookies for other hosts under the preview domain) or the lane's cookie.
fn cookie_allowed(value: &HeaderValue) -> bool {
    let Ok(text) = value.to_str() else { return false };
    let mut parts = text.split(';');
    let name = parts.next().and_then(|p| p.split_once('=')).map(|(n, _)| n.trim());
    if name.is_none_or(is_lane_cookie) {
        return false;
    }
    !parts.any(|attribute| {
        attribute.split_once('=').map_or(attribute, |(a, _)| a).trim().eq_ignore_ascii_case("domain")
    })
}

/// The response's headers as the visitor may see them.
pub(super) fn returned_headers(headers: &mut HeaderMap, upgraded: Option<HeaderValue>) {
    drop_hop_by_hop(headers);
    // `Clear-Site-Data: "cookies"` clears the cookies of the whole registrable domain: every
    // other sandbox's preview cookie in the visitor's browser.
    headers.remove(HeaderName::from_static("clear-site-data"));
    let cookies: Vec<HeaderValue> = headers.get_all(header::SET_COOKIE).iter().cloned().collect();
    headers.remove(header::SET_COOKIE);
    for cookie in cookies.into_iter().filter(cookie_allowed) {
        headers.append(header::SET_COOKIE, cookie);
    }
    if let Some(upgrade) = upgraded {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, upgrade);
    }
}

/// The size of the reads from a sandbox's port: a bulk answer crosses in fewer chunks.
const PREVIEW_READ_BUF: usize = 256 * 1024;

/// A sandbox's port as the runtime's byte stream.
struct PortIo(Box<dyn ports::PortStream>);

impl AsyncRead for PortIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let unfilled = buf.initialize_unfilled();
        match this.0.poll_read(cx, unfilled) {
            Poll::Ready(Ok(n)) => {
                buf.advance(n);
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncWrite for PortIo {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        self.get_mut().0.poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.get_mut().0.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.get_mut().0.poll_shutdown(cx)
    }
}

/// hyper's side of the sandbox's connection: it writes the request and reads the answer
/// while it is polled (its type cannot be named: hyper's upgradeable connection).
type Connection = Pin<Box<dyn Future<Output = hyper::Result<()>> + Send>>;

/// The sandbox's connection until it ends: polled by whoever holds it; dropping it closes
/// the connection.
struct Driven(Option<Connection>);

impl Driven {
    /// Moves the connection on (reads and writes what it can); after it ended, nothing.
    fn poll(&mut self, cx: &mut Context<'_>) {
        if let Some(connection) = self.0.as_mut()
            && let Poll::Ready(ended) = connection.as_mut().poll(cx)
        {
            if let Err(e) = ended {
                tracing::debug!(error = %e, "a preview's sandbox connection ended with an error");
            }
            self.0 = None;
        }
    }

    /// Drives the connection on a task of its own until it ends (an upgrade outlives the
    /// response): the task ends with the returned guard.
    fn spawn(mut self) -> AbortOnDrop {
        AbortOnDrop(tokio::spawn(async move {
            poll_fn(|cx| {
                self.poll(cx);
                if self.0.is_none() { Poll::Ready(()) } else { Poll::Pending }
            })
            .await
        }))
    }
}

/// Aborts a task when dropped (the visitor went away, or the upgrade ended).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The sandbox's response body, relayed frame by frame; drives the sandbox's connection
/// and holds its activity while it lives.
struct Relayed {
    body: Incoming,
    connection: Driven,
    /// Ready once the link or caller the answer was opened for no longer stands: the
    /// answer then breaks off.
    lapsed: Pin<Box<dyn Future<Output = ()> + Send>>,
    _held: usecase::Held,
}

impl HttpBody for Relayed {
    type Data = axum::body::Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        if this.lapsed.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err("the preview's link or caller no longer stands".into())));
        }
        if let Poll::Ready(frame) = Pin::new(&mut this.body).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        // Nothing read yet: the connection reads the next chunk (the body asked for it
        // just now), and the body has it at once.
        this.connection.poll(cx);
        Pin::new(&mut this.body).poll_frame(cx).map(|frame| frame.map(|f| f.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Relays `request` to the sandbox's port over `connection`, and the answer back.
pub(super) async fn relay(state: &AppState, connection: PreviewConnection, mut request: Request) -> Response {
    let limit = state.body_limit;
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return too_large(limit);
    }
    let upgrade = upgrade_of(request.headers());
    let visitor_upgrade = upgrade.as_ref().map(|_| hyper::upgrade::on(&mut request));
    let (mut parts, body) = request.into_parts();
    forwarded_headers(&mut parts.headers, upgrade.as_ref());
    if let Some(path) = parts.uri.path_and_query().cloned() {
        parts.uri = Uri::from(path);
    }
    parts.version = axum::http::Version::HTTP_11;
    let outgoing = axum::http::Request::from_parts(parts, http_body_util::Limited::new(body, limit));

    let (stream, held, standing) = connection.into_parts();
    // Ends what outlives the request (an upgrade, a streamed answer) once the link or the
    // caller it was opened for no longer stands.
    let lapsed = crate::usecase::standing::lapsed(state.deps.clone(), standing);
    let handshake = http1::Builder::new()
        .read_buf_exact_size(Some(PREVIEW_READ_BUF))
        .handshake(TokioIo::new(PortIo(stream)))
        .await;
    let (mut sender, connection) = match handshake {
        Ok(pair) => pair,
        Err(e) => return unanswered(&e.to_string()),
    };
    let mut connection = Driven(Some(Box::pin(connection.with_upgrades())));
    // The request goes out, and its answer's head comes back, while this task drives the
    // connection.
    let mut sent = pin!(sender.send_request(outgoing));
    let answered = tokio::time::timeout(
        state.request_timeout,
        poll_fn(|cx| {
            connection.poll(cx);
            sent.as_mut().poll(cx)
        }),
    )
    .await;
    let mut response = match answered {
        Ok(Ok(response)) => response,
        // A body without a length (chunked) that went over the limit on its way.
        Ok(Err(e)) if over_the_limit(&e) => return too_large(limit),
        Ok(Err(e)) => return unanswered(&e.to_string()),
        Err(_) => return unanswered("no answer in time"),
    };
    if response.status() == StatusCode::SWITCHING_PROTOCOLS
        && let Some(visitor) = visitor_upgrade
    {
        let upgraded = response.headers().get(header::UPGRADE).cloned();
        let sandbox = hyper::upgrade::on(&mut response);
        let task = connection.spawn();
        let stopping = state.shutdown.clone();
        tokio::spawn(async move {
            let _task = task;
            let _held = held;
            let (Ok(visitor), Ok(sandbox)) = (visitor.await, sandbox.await) else { return };
            tokio::select! {
                () = pipe(TokioIo::new(visitor), TokioIo::new(sandbox)) => {}
                () = lapsed => {}
                () = stopping.stopping() => {}
            }
        });
        let (mut parts, _) = response.into_parts();
        returned_headers(&mut parts.headers, upgraded);
        return Response::from_parts(parts, Body::empty());
    }
    let (mut parts, body) = response.into_parts();
    returned_headers(&mut parts.headers, None);
    Response::from_parts(
        parts,
        Body::new(Relayed { body, connection, lapsed: Box::pin(lapsed), _held: held }),
    )
}

/// How long an upgraded connection's other direction may go on once one has ended.
pub(super) const HALF_CLOSED_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Copies both ways between the visitor and the sandbox until one direction ends, then
/// gives the other [`HALF_CLOSED_GRACE`] to end too: a sandbox (or a visitor) that keeps
/// its side open and silent never holds the connection, its task and its descriptors.
pub(super) async fn pipe<V, S>(visitor: V, sandbox: S)
where
    V: AsyncRead + AsyncWrite + Unpin,
    S: AsyncRead + AsyncWrite + Unpin,
{
    use tokio::io::AsyncWriteExt as _;
    let (mut from_visitor, mut to_visitor) = tokio::io::split(visitor);
    let (mut from_sandbox, mut to_sandbox) = tokio::io::split(sandbox);
    let up = async {
        let _ = tokio::io::copy(&mut from_visitor, &mut to_sandbox).await;
        let _ = to_sandbox.shutdown().await;
    };
    let down = async {
        let _ = tokio::io::copy(&mut from_sandbox, &mut to_visitor).await;
        let _ = to_visitor.shutdown().await;
    };
    let (mut up, mut down) = (pin!(up), pin!(down));
    tokio::select! {
        () = &mut up => { let _ = tokio::time::timeout(HALF_CLOSED_GRACE, &mut down).await; }
        () = &mut down => { let _ = tokio::time::timeout(HALF_CLOSED_GRACE, &mut up).await; }
    }
}

/// Whether sending failed because the request's body went over the body limit.
fn over_the_limit(error: &hyper::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = cause {
        if e.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        cause = e.source();
    }
    false
}

fn too_large(limit: usize) -> Response {
    page(
        StatusCode::PAYLOAD_TOO_LARGE,
        "Request too large",
        &format!("The request body is over the limit of {limit} bytes."),
    )
}

fn unanswered(detail: &str) -> Response {
    tracing::debug!(detail, "a preview's sandbox did not answer");
    page(
        StatusCode::BAD_GATEWAY,
        "The sandbox did not answer",
        "The server in the sandbox closed the connection or did not answer in time.",
    )
}
