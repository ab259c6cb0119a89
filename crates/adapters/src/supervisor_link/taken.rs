//! A TCP connection handed over by a supervisor (`take`, `SCM_RIGHTS`): the egress
//! proxy's client connection, which the server then reads and writes itself.
//!
//! The descriptor comes from inside a sandbox and is treated as hostile. Checked on
//! arrival: a socket (`S_ISSOCK`), of type `SOCK_STREAM`, in `AF_INET` or `AF_INET6`;
//! anything else is closed and refused. Then, in use: the supervisor may have kept a copy,
//! and a descriptor's file status flags belong to the open file both copies share, so it
//! can clear `O_NONBLOCK` whenever it likes. A tokio `TcpStream` trusts that flag: its
//! next `read` with nothing to read, or `write` to a peer that stopped reading, would then
//! block one of the server's runtime threads for as long as the sandbox wants (every
//! sandbox's requests with it). [`TakenTcp`] never relies on the flag: every `recv` and
//! `send` asks for non-blocking behaviour itself (`MSG_DONTWAIT`), and waits for readiness
//! through the runtime like any other socket; `shutdown` never waits.
//!
//! Nor is its close trusted: the sandbox may have set `SO_LINGER` on the socket (and may
//! set it again whenever it likes, holding a copy), and a lingering close with unsent
//! data waits on the thread that makes it. `SO_LINGER` is reset when the connection is
//! taken, and the last close is the closer thread's ([`super::closer`]): the runtime's
//! `TcpStream` holds a second descriptor of the socket, and the original, dropped after
//! it, goes to the closer.

use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use rustix::net::{RecvFlags, SendFlags, Shutdown};
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;

use super::closer::SandboxFd;

/// A TCP connection received from a sandbox, read and written without ever blocking (see
/// the module's documentation).
#[derive(Debug)]
pub struct TakenTcp {
    /// Registered with the runtime for its readiness; never read or written through its
    /// own methods (they trust `O_NONBLOCK`). A second descriptor of the socket, whose
    /// close is never the last: it is dropped before `_last`.
    stream: TcpStream,
    /// The descriptor received: dropped after `stream`, it makes the last close, on the
    /// closer thread.
    _last: SandboxFd,
}

impl TakenTcp {
    /// Checks `fd` and registers it with the runtime.
    ///
    /// # Errors
    /// The reason `fd` is not a connected-stream IPv4 or IPv6 socket, or why it could not
    /// be registered; `fd` is closed either way (by the closer thread).
    pub(crate) fn new(fd: SandboxFd) -> Result<Self, String> {
        inet_stream(fd.as_fd())?;
        // Not relied on (see above): it spares the closer a wait while the sandbox leaves
        // it alone.
        rustix::net::sockopt::set_socket_linger(&fd, None)
            .map_err(|e| format!("cannot turn the socket's linger off: {e}"))?;
        // Not relied on either, but a blocking descriptor in the runtime's epoll set is
        // never what the runtime expects.
        rustix::io::ioctl_fionbio(&fd, true)
            .map_err(|e| format!("cannot make the socket non-blocking: {e}"))?;
        let ours = fd.duplicate().map_err(|e| format!("cannot duplicate the descriptor: {e}"))?;
        let stream = TcpStream::from_std(std::net::TcpStream::from(ours))
            .map_err(|e| format!("cannot register the socket: {e}"))?;
        Ok(Self { stream, _last: fd })
    }
}

/// Whether `fd`, received from a sandbox, is a stream socket in `AF_INET` or `AF_INET6`:
/// the reason when not.
pub(super) fn inet_stream(fd: BorrowedFd<'_>) -> Result<(), String> {
    use rustix::fs::FileType;
    use rustix::net::{AddressFamily, SocketType, sockopt};
    let stat = rustix::fs::fstat(fd).map_err(|e| format!("cannot stat the descriptor: {e}"))?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::Socket {
        return Err("the descriptor is not a socket".to_owned());
    }
    let kind = sockopt::socket_type(fd).map_err(|e| format!("cannot read the socket's type: {e}"))?;
    if kind != SocketType::STREAM {
        return Err("the socket is not a stream socket".to_owned());
    }
    let family = sockopt::socket_domain(fd).map_err(|e| format!("cannot read the socket's family: {e}"))?;
    if family != AddressFamily::INET && family != AddressFamily::INET6 {
        return Err("the socket is not an IPv4 or IPv6 one".to_owned());
    }
    Ok(())
}

impl AsyncRead for TakenTcp {
    #[allow(unsafe_code)]
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let stream = &self.stream;
        loop {
            ready!(stream.poll_read_ready(cx))?;
            // SAFETY: `recv` only writes into the slice; what it wrote is marked initialised
            // below, and nothing is de-initialised.
            let unfilled = unsafe { buf.unfilled_mut() };
            let room = unfilled.len();
            // On `WouldBlock`, `try_io` clears the readiness: the next poll waits for more.
            match stream.try_io(Interest::READABLE, || {
                rustix::net::recv(stream, &mut *unfilled, RecvFlags::DONTWAIT)
                    .map(|(_, n)| n.min(room))
                    .map_err(io::Error::from)
            }) {
                Ok(n) => {
                    // SAFETY: `recv` wrote `n` bytes at the start of the unfilled part.
                    unsafe { buf.assume_init(n) };
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsyncWrite for TakenTcp {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let stream = &self.stream;
        loop {
            ready!(stream.poll_write_ready(cx))?;
            match stream.try_io(Interest::WRITABLE, || {
                rustix::net::send(stream, buf, SendFlags::DONTWAIT | SendFlags::NOSIGNAL)
                    .map_err(io::Error::from)
            }) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                result => return Poll::Ready(result),
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match rustix::net::shutdown(&self.stream, Shutdown::Write) {
            Ok(()) | Err(rustix::io::Errno::NOTCONN) => Poll::Ready(Ok(())),
            Err(e) => Poll::Ready(Err(e.into())),
        }
    }
}
