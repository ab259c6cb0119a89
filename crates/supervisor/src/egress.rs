//! The supervisor's side of egress, when it is started with an egress port (`--egress-port`:
//! a Kubernetes pod, whose network namespace the server cannot reach; elsewhere the
//! server opens the proxy's socket in the sandbox's namespace itself and the supervisor
//! serves no egress): it listens on the sandbox's own loopback (the port
//! [`domain::egress::PROXY_PORT`] every command's `HTTP_PROXY` names), holds each
//! connection a process makes there, announces it on the server's `events` stream, and
//! relays it over a `tunnel` connection the server opens for it (see
//! [`crate::protocol`]), or hands its descriptor over (`take`). The supervisor never reads
//! what goes through: the server's proxy parses it, decides, and connects.
//!
//! Bounded: at most [`MAX_HELD`] connections wait at once (more are closed as they come)
//! and each waits at most [`HOLD`]; nothing else is kept.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio::sync::mpsc;

use crate::protocol::EgressCounts;
use crate::protocol::{Frame, FrameType, MAX_FRAME, Reply, read_frame, write_frame, write_slice};

/// The most connections held at once, waiting for the server to take them.
pub const MAX_HELD: usize = 128;

/// How long a held connection waits for the server to take it.
pub const HOLD: Duration = Duration::from_secs(10);

/// The proxy's listening socket, the connections held for the server, and who is told of
/// new ones.
pub(crate) struct Held {
    listener: TcpListener,
    pending: Mutex<HashMap<u64, TcpStream>>,
    next: AtomicU64,
    subscriber: Mutex<Option<mpsc::Sender<u64>>>,
    /// Connections handed over (`take`) so far.
    taken: AtomicU64,
    /// Connections relayed in frames (`tunnel`) so far.
    tunnelled: AtomicU64,
}

/// How many held connections were handed over and relayed in frames so far.
pub(crate) fn counts(held: &Held) -> EgressCounts {
    EgressCounts {
        taken: held.taken.load(Ordering::Relaxed),
        tunnelled: held.tunnelled.load(Ordering::Relaxed),
    }
}

/// Listens on the sandbox's loopback at `port`, and accepts there for as long as the
/// supervisor runs.
pub(crate) async fn serve(port: u16) -> io::Result<Arc<Held>> {
    let listener = TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, port)).await?;
    let held = Arc::new(Held {
        listener,
        pending: Mutex::default(),
        next: AtomicU64::default(),
        subscriber: Mutex::default(),
        taken: AtomicU64::default(),
        tunnelled: AtomicU64::default(),
    });
    tokio::spawn(accept_loop(held.clone()));
    Ok(held)
}

/// Accepts connections for as long as the supervisor runs.
async fn accept_loop(held: Arc<Held>) {
    loop {
        let stream = match held.listener.accept().await {
            Ok((stream, _)) => stream,
            Err(_) => {
                // Out of descriptors, most likely: wait rather than spin.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let id = held.next.fetch_add(1, Ordering::Relaxed) + 1;
        {
            // The subscriber's lock first, so an `events` starting now sees the connection
            // exactly once: in its list of those waiting, or announced.
            let subscriber = held.subscriber.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let mut pending = held.pending.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if pending.len() >= MAX_HELD {
                continue; // dropping the stream closes it
            }
            pending.insert(id, stream);
            if let Some(tx) = subscriber.as_ref() {
                let _ = tx.try_send(id);
            }
        }
        let held = held.clone();
        tokio::spawn(async move {
            tokio::time::sleep(HOLD).await;
            held.pending.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&id);
        });
    }
}

async fn send(stream: &mut (impl AsyncWriteExt + Unpin), reply: &Reply) -> bool {
    match Frame::control(reply) {
        Ok(frame) => write_frame(stream, &frame).await.is_ok(),
        Err(_) => false,
    }
}

/// The `events` stream: every held connection's id, until the server closes the
/// connection. One at a time: while one is open, another is answered `busy` (a second
/// server, another replica, serves nothing of this sandbox; a restarted server's old
/// stream closed with its process).
pub(crate) async fn events(stream: UnixStream, held: &Held) {
    let (mut rx, mut tx) = stream.into_split();
    let (ids_tx, mut ids) = mpsc::channel(MAX_HELD);
    let waiting: Option<Vec<u64>> = {
        let mut subscriber = held.subscriber.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if subscriber.as_ref().is_some_and(|tx| !tx.is_closed()) {
            None
        } else {
            *subscriber = Some(ids_tx);
            let pending = held.pending.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let mut ids: Vec<u64> = pending.keys().copied().collect();
            ids.sort_unstable();
            Some(ids)
        }
    };
    let Some(waiting) = waiting else {
        let message = "another server serves this sandbox's egress".to_owned();
        let _ = send(&mut tx, &Reply::Error { code: "busy".to_owned(), message }).await;
        return;
    };
    for id in waiting {
        if !send(&mut tx, &Reply::Client { id }).await {
            return;
        }
    }
    let gone = async { read_frame(&mut rx).await.ok() };
    tokio::pin!(gone);
    loop {
        tokio::select! {
            id = ids.recv() => match id {
                Some(id) => if !send(&mut tx, &Reply::Client { id }).await { return },
                None => return,
            },
            _ = &mut gone => return,
        }
    }
}

/// Removes held connection `id` from those waiting, for `tunnel` or `take`; when it is not
/// held (taken already, or it waited too long) answers `not_found` on `stream`.
async fn held_connection(stream: &mut UnixStream, id: u64, held: &Held) -> Option<TcpStream> {
    let taken = held.pending.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&id);
    if taken.is_none() {
        let message = format!("no egress connection {id} is held (taken already, or it waited too long)");
        let _ = send(stream, &Reply::Error { code: "not_found".to_owned(), message }).await;
    }
    taken
}

/// The `tunnel` for held connection `id`: its bytes both ways until both directions
/// end, or either side goes away. A client that goes away (a reset, or a write to it that
/// fails) is told to the server with a `gone` error frame before the tunnel closes: on
/// Kubernetes the pod's gate holds the server's connection open for a while after the
/// supervisor closes its side (see `gate::relay_until_closed`), so the close alone would
/// reach the server late, and the destination would go on sending for nobody until then.
pub(crate) async fn tunnel(mut stream: UnixStream, id: u64, held: &Held) {
    let Some(tcp) = held_connection(&mut stream, id, held).await else { return };
    held.tunnelled.fetch_add(1, Ordering::Relaxed);
    relay(stream, tcp).await;
}

/// Answers `tunnel` on `stream`, then relays `tcp`'s bytes both ways in data frames until
/// both directions end or either side goes away (see [`tunnel`]; a preview port's
/// `connect` without a descriptor relays the same way).
pub(crate) async fn relay(mut stream: UnixStream, tcp: TcpStream) {
    if !send(&mut stream, &Reply::Tunnel).await {
        return;
    }
    let (mut from_server, mut to_server) = stream.into_split();
    let (mut from_client, mut to_client) = tcp.into_split();
    let gone = std::sync::Arc::new(tokio::sync::Notify::new());
    // Set once the client has ended its direction cleanly: `up` then only waits to say
    // `gone` (it keeps the server's write half for that), and no longer counts as running.
    let client_ended = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let up = {
        let (gone, client_ended) = (gone.clone(), client_ended.clone());
        async move {
            let mut buf = vec![0u8; MAX_FRAME];
            loop {
                let read = tokio::select! {
                    read = from_client.read(&mut buf) => read,
                    () = gone.notified() => Err(io::ErrorKind::BrokenPipe.into()),
                };
                let Ok(n) = read else { break };
                if write_slice(&mut to_server, FrameType::Data, &buf[..n]).await.is_err() {
                    return;
                }
                if n == 0 {
                    // The client's end of its direction (told above as an empty frame). It
                    // may still go away before the answer is through: a write to it then
                    // fails, and the server must hear of it.
                    client_ended.store(true, Ordering::Release);
                    gone.notified().await;
                    break;
                }
            }
            let reply = Reply::Error { code: "gone".to_owned(), message: "the client went away".to_owned() };
            let _ = send(&mut to_server, &reply).await;
        }
    };
    // `true`: the server ended its direction; `false`: it went away (or broke the protocol),
    // or the client did.
    let down = async move {
        loop {
            match read_frame(&mut from_server).await {
                Ok(Some(frame)) if frame.kind == FrameType::Data && frame.payload.is_empty() => {
                    let _ = to_client.shutdown().await;
                    return true;
                }
                Ok(Some(frame)) if frame.kind == FrameType::Data => {
                    if to_client.write_all(&frame.payload).await.is_err() {
                        return false;
                    }
                }
                _ => return false,
            }
        }
    };
    tokio::pin!(up);
    tokio::pin!(down);
    let (mut up_done, mut down_done) = (false, false);
    while !(down_done && (up_done || client_ended.load(Ordering::Acquire))) {
        tokio::select! {
            () = &mut up, if !up_done => up_done = true,
            clean = &mut down, if !down_done => {
                if !clean {
                    // The client (or the server) is gone: the other direction says so to
                    // the server, if it still listens, and ends.
                    gone.notify_one();
                    if !up_done {
                        let _ = tokio::time::timeout(GONE_NOTICE, &mut up).await;
                    }
                    return;
                }
                down_done = true;
            }
        }
    }
}

/// How long a tunnel whose client went away waits to tell the server so.
const GONE_NOTICE: Duration = Duration::from_secs(1);

/// Hands held connection `id` over: the reply `taken` goes with its descriptor
/// (`SCM_RIGHTS`), and the supervisor's copy is closed once sent.
pub(crate) async fn take(mut stream: UnixStream, id: u64, held: &Held) {
    let Some(tcp) = held_connection(&mut stream, id, held).await else { return };
    held.taken.fetch_add(1, Ordering::Relaxed);
    send_with_fd(&mut stream, &Reply::Taken, tcp.as_fd()).await;
    drop(tcp);
}

/// Sends `reply` with `fd` attached (`SCM_RIGHTS`); whether it went.
pub(crate) async fn send_with_fd(stream: &mut UnixStream, reply: &Reply, fd: BorrowedFd<'_>) -> bool {
    let Ok(frame) = Frame::control(reply) else { return false };
    let bytes = frame.encode();
    let sent = loop {
        if stream.writable().await.is_err() {
            break None;
        }
        let attempt = stream.try_io(tokio::io::Interest::WRITABLE, || {
            let fds = [fd];
            let mut space = [std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut control = rustix::net::SendAncillaryBuffer::new(&mut space);
            if !control.push(rustix::net::SendAncillaryMessage::ScmRights(&fds)) {
                return Err(io::Error::other("no room for the descriptor"));
            }
            let iov = [io::IoSlice::new(&bytes)];
            rustix::net::sendmsg(&*stream, &iov, &mut control, rustix::net::SendFlags::NOSIGNAL)
                .map_err(io::Error::from)
        });
        match attempt {
            Ok(n) => break Some(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => break None,
        }
    };
    // The descriptor went with the first byte; the rest of the frame (never more than a
    // few bytes) follows plainly.
    match sent {
        Some(n) if n < bytes.len() => stream.write_all(&bytes[n..]).await.is_ok(),
        Some(_) => true,
        None => false,
    }
}
