//! One unix-socket connection to a supervisor (bubblewrap, containers), which receives a
//! descriptor only where a reply names one.
//!
//! A unix socket carries descriptors (`SCM_RIGHTS`) beside any bytes, and one sent to a
//! reader that does not take it is not ignored: the kernel closes it on the reading thread,
//! inside that `read`, and closes whatever still waits in the connection's queue on the
//! thread that closes the connection. Either close may be that of a TCP socket the sandbox
//! set to linger with unsent data, which waits (see [`super::closer`]); on a runtime
//! thread it would stall every tenant's requests. So:
//!
//! - A connection whose replies name no descriptor (every request but `take`)
//!   asks the kernel to refuse them before it exists (`SO_PASSRIGHTS` off,
//!   Linux 6.16 and later): the supervisor's `sendmsg` fails with `EPERM`, nothing is ever
//!   in flight to it, and it is closed like any socket.
//! - Every read is a `recvmsg` with room for as many descriptors as one message can carry
//!   (`SCM_MAX_FD`), so whatever comes is ours, never the kernel's to close here. A read
//!   that receives one anyway (a kernel without `SO_PASSRIGHTS`) fails, as does every
//!   later read of the connection, and the descriptors go to the closer thread;
//!   `MSG_CTRUNC` (some could not be received: the server is out of descriptors, and the
//!   kernel closed those itself) fails it too.
//! - `take` reads its reply with its descriptor (`UnixChannel::recv_named`) and then
//!   refuses any more. A read that brings a second one fails at once, however many bytes
//!   the reply's header still announces: a supervisor that sends its reply a byte at a time,
//!   each with `SCM_MAX_FD` descriptors, would otherwise fill the server's descriptor table.
//! - A connection that could ever receive descriptors is closed after its reading side is
//!   shut (nothing more can be queued) and what is queued has been read out, each read's
//!   descriptors to the closer at once; past [`MAX_DRAIN`] bytes (or `MAX_DRAIN_READS`
//!   reads) the socket itself, with what is left in it, goes to the closer.
//!
//! Reads and writes ask for non-blocking behaviour themselves (`MSG_DONTWAIT`), though
//! the socket is the server's alone.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};

use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendFlags, Shutdown};
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::UnixStream;

use super::client::ClientError;
use super::closer::SandboxFd;
use supervisor::protocol::{Frame, ProtocolError};

/// The most descriptors one message can carry (`SCM_MAX_FD`): room for them all, so the
/// kernel never closes any for want of room.
const SCM_MAX_FD: usize = 253;

/// The most bytes a connection that could receive descriptors has read out of its queue
/// when it is closed; past this, the socket goes to the closer thread.
pub const MAX_DRAIN: usize = 256 * 1024;

/// The most reads a closing connection makes of what is queued (see [`MAX_DRAIN`]): a queue
/// of one-byte messages costs this many reads at most.
const MAX_DRAIN_READS: usize = 1024;

/// The most bytes a reply that names descriptors is read for.
const MAX_NAMED_REPLY: usize = 64 * 1024;

/// The most descriptors a reply that names descriptors brings: one (`take`, `connect`).
const MAX_NAMED_FDS: usize = 1;

/// `SO_PASSRIGHTS` (Linux 6.16): off, the socket refuses `SCM_RIGHTS` (the sender gets
/// `EPERM`). Its value where the architecture uses the generic socket options; older
/// kernels answer `ENOPROTOOPT`.
#[cfg(any(
    target_arch = "x86_64",
    target_arch = "x86",
    target_arch = "aarch64",
    target_arch = "arm",
    target_arch = "riscv64",
    target_arch = "loongarch64",
    target_arch = "s390x",
    target_arch = "powerpc64"
))]
const SO_PASSRIGHTS: Option<libc::c_int> = Some(83);
#[cfg(not(any(
    target_arch = "x86_64",
    target_arch = "x86",
    target_arch = "aarch64",
    target_arch = "arm",
    target_arch = "riscv64",
    target_arch = "loongarch64",
    target_arch = "s390x",
    target_arch = "powerpc64"
)))]
const SO_PASSRIGHTS: Option<libc::c_int> = None;

/// Whether the connection's replies may name descriptors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Descriptors {
    /// None: the kernel is asked to refuse them.
    Refused,
    /// One reply names them (`take`).
    Named,
}

/// A connection to a supervisor over a unix socket (see the module's documentation).
#[derive(Debug)]
pub struct UnixChannel {
    inner: Arc<Inner>,
}

/// The reading half of a [`UnixChannel`].
#[derive(Debug)]
pub(crate) struct ChannelRx(Arc<Inner>);

/// The writing half of a [`UnixChannel`]: dropped, it shuts the connection's writing
/// side (as tokio's own halves do).
#[derive(Debug)]
pub(crate) struct ChannelTx(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    stream: UnixStream,
    /// The kernel refused descriptors on this connection from its start.
    sealed: bool,
    /// A read refused descriptors: every later read fails too.
    refused: AtomicBool,
    /// Set when the connection is closed with more queued than [`MAX_DRAIN`]: a second
    /// descriptor of the socket, dropped after `stream`, so the closer makes the last
    /// close.
    last: Option<SandboxFd>,
}

impl UnixChannel {
    /// Connects to the socket file at `path`, opened without following a symbolic link
    /// (see [`socket_no_follow`]).
    ///
    /// # Errors
    /// [`ClientError::Gone`] when nobody listens there; a protocol error otherwise.
    pub(crate) async fn connect(path: &Path, descriptors: Descriptors) -> Result<Self, ClientError> {
        use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
        let socket = match socket_no_follow(path) {
            Ok(socket) => socket,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(ClientError::Gone(e)),
            Err(e) => return Err(ProtocolError::Unexpected(format!("{}: {e}", path.display())).into()),
        };
        let fd = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::STREAM,
            SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
            None,
        )
        .map_err(|e| ProtocolError::Io(format!("cannot make a unix socket: {e}")))?;
        // Before the connection exists, so nothing can come before it holds.
        let sealed = descriptors == Descriptors::Refused && refuse_descriptors(fd.as_fd());
        // The descriptor's magic link names the inode checked above, whatever the path
        // names by now.
        let through = PathBuf::from(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&socket)));
        let address = SocketAddrUnix::new(through.as_path()).map_err(|e| ProtocolError::Io(e.to_string()))?;
        let connected = match rustix::net::connect(&fd, &address) {
            Ok(()) | Err(rustix::io::Errno::INPROGRESS) => Ok(()),
            Err(e) => Err(io::Error::from(e)),
        };
        drop(socket);
        let stream = connected
            .and_then(|()| UnixStream::from_std(std::os::unix::net::UnixStream::from(fd)))
            .map_err(gone_or_io)?;
        stream.writable().await.map_err(gone_or_io)?;
        if let Some(e) = stream.take_error().map_err(gone_or_io)? {
            return Err(gone_or_io(e));
        }
        Ok(Self::with(stream, sealed))
    }

    fn with(stream: UnixStream, sealed: bool) -> Self {
        Self { inner: Arc::new(Inner { stream, sealed, refused: AtomicBool::new(false), last: None }) }
    }

    /// A channel over one end of a pair made in a test (descriptors not refused).
    #[cfg(test)]
    pub(crate) fn for_tests(stream: UnixStream) -> Self {
        Self::with(stream, false)
    }

    /// Its two halves, each usable on its own.
    pub(crate) fn into_halves(self) -> (ChannelRx, ChannelTx) {
        (ChannelRx(self.inner.clone()), ChannelTx(self.inner))
    }

    /// Reads one frame with `recvmsg`, keeping every descriptor that came with its bytes
    /// (each closed by the closer thread when dropped), then asks the kernel to refuse any
    /// more on this connection. A truncated or foreign ancillary message fails.
    ///
    /// # Errors
    /// As the read fails or the supervisor breaks the protocol.
    pub(crate) async fn recv_named(&self) -> Result<(Frame, Vec<SandboxFd>), ClientError> {
        let inner = &self.inner;
        let mut fds = Vec::new();
        let mut bytes: Vec<u8> = Vec::new();
        let frame = loop {
            if let Some((frame, _)) = supervisor::protocol::decode(&bytes)? {
                break frame;
            }
            inner.refused_so_far().map_err(|e| ProtocolError::Io(e.to_string()))?;
            inner.stream.readable().await.map_err(|e| ProtocolError::Io(e.to_string()))?;
            let mut buf = [0u8; 4096];
            let got =
                inner.stream.try_io(Interest::READABLE, || recv(inner.stream.as_fd(), &mut buf, &mut fds));
            let (n, odd) = match got {
                Ok(got) => got,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(ProtocolError::Io(e.to_string()).into()),
            };
            if odd {
                return Err(ProtocolError::Unexpected(
                    "the supervisor sent a control message that was not descriptors, or more than could be \
                     received"
                        .to_owned(),
                )
                .into());
            }
            // A reply names one descriptor: more fail at once, whatever the frame still
            // announces (each read may bring up to `SCM_MAX_FD` more; reading on until the
            // frame's bytes came would hold as many as the sandbox cares to send).
            if fds.len() > MAX_NAMED_FDS {
                return Err(ProtocolError::Unexpected(format!(
                    "the supervisor sent {} descriptors with a reply that names exactly one",
                    fds.len()
                ))
                .into());
            }
            if n == 0 {
                return Err(ProtocolError::Truncated.into());
            }
            bytes.extend_from_slice(&buf[..n]);
            if bytes.len() > MAX_NAMED_REPLY {
                return Err(ProtocolError::TooLarge(bytes.len()).into());
            }
        };
        refuse_descriptors(inner.stream.as_fd());
        Ok((frame, fds))
    }
}

impl Inner {
    fn refused_so_far(&self) -> io::Result<()> {
        if self.refused.load(Ordering::Acquire) {
            return Err(refusal());
        }
        Ok(())
    }

    fn poll_read(&self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        self.refused_so_far()?;
        loop {
            ready!(self.stream.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            let mut fds = Vec::new();
            // On `WouldBlock`, `try_io` clears the readiness: the next poll waits for more.
            match self.stream.try_io(Interest::READABLE, || recv(self.stream.as_fd(), unfilled, &mut fds)) {
                Ok((n, odd)) => {
                    if odd || !fds.is_empty() {
                        self.refused.store(true, Ordering::Release);
                        // Dropped: to the closer thread.
                        drop(fds);
                        return Poll::Ready(Err(refusal()));
                    }
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    fn poll_write(&self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.stream.poll_write_ready(cx))?;
            match self.stream.try_io(Interest::WRITABLE, || {
                rustix::net::send(&self.stream, buf, SendFlags::DONTWAIT | SendFlags::NOSIGNAL)
                    .map_err(io::Error::from)
            }) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                result => return Poll::Ready(result),
            }
        }
    }

    fn shutdown_writing(&self) -> io::Result<()> {
        match rustix::net::shutdown(&self.stream, Shutdown::Write) {
            Ok(()) | Err(rustix::io::Errno::NOTCONN) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

fn refusal() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        "the supervisor sent descriptors with a reply that names none (refused and closed)",
    )
}

/// One `recvmsg` without waiting, with room for every descriptor one message can carry:
/// the bytes read, and whether anything but descriptors came along or some were lost
/// (`MSG_CTRUNC`). Every descriptor received is pushed onto `fds`.
fn recv(fd: BorrowedFd<'_>, buf: &mut [u8], fds: &mut Vec<SandboxFd>) -> io::Result<(usize, bool)> {
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(SCM_MAX_FD))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut iov = [io::IoSliceMut::new(buf)];
    let msg =
        rustix::net::recvmsg(fd, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC | RecvFlags::DONTWAIT)?;
    let mut odd = msg.flags.contains(ReturnFlags::CTRUNC);
    for message in control.drain() {
        match message {
            RecvAncillaryMessage::ScmRights(received) => fds.extend(received.map(SandboxFd::new)),
            _ => odd = true,
        }
    }
    Ok((msg.bytes, odd))
}

/// Asks the kernel to refuse descriptors sent to `fd` from now on; whether it does.
#[allow(unsafe_code)]
fn refuse_descriptors(fd: BorrowedFd<'_>) -> bool {
    #[cfg(test)]
    if !KERNEL_REFUSAL.with(std::cell::Cell::get) {
        return false;
    }
    let Some(option) = SO_PASSRIGHTS else { return false };
    let off: libc::c_int = 0;
    // SAFETY: `fd` is a socket that stays open for the call; the kernel reads the option's
    // value from `off` for exactly the length given (a `c_int`) and writes nothing back.
    let done = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            libc::SOL_SOCKET,
            option,
            (&raw const off).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    done == 0
}

#[cfg(test)]
thread_local! {
    /// Whether connections made on this thread ask the kernel to refuse descriptors (a
    /// test turns it off to play a kernel without `SO_PASSRIGHTS`).
    static KERNEL_REFUSAL: std::cell::Cell<bool> = const { std::cell::Cell::new(true) };
}

/// Makes the connections opened on this thread from now on go without the kernel's
/// refusal, as on a kernel without `SO_PASSRIGHTS`.
#[cfg(test)]
pub(crate) fn without_kernel_refusal() {
    KERNEL_REFUSAL.with(|on| on.set(false));
}

/// Whether the running kernel refuses descriptors where asked (`SO_PASSRIGHTS`).
#[cfg(test)]
pub(crate) fn kernel_refuses() -> bool {
    let (one, _other) = std::os::unix::net::UnixStream::pair().expect("a socket pair");
    SO_PASSRIGHTS.is_some() && refuse_descriptors(one.as_fd())
}

fn gone_or_io(e: io::Error) -> ClientError {
    if matches!(
        e.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionReset
    ) {
        ClientError::Gone(e)
    } else {
        ProtocolError::Io(e.to_string()).into()
    }
}

/// The socket file at `path`, opened without following a symbolic link in its last
/// component (`O_PATH | O_NOFOLLOW`) and checked to be a socket. A container's supervisor
/// listens in a host directory bound into the container, so a compromised one can replace
/// its socket with a link to any socket of the host: `connect(2)` would follow it, and the
/// server would then send this sandbox's requests (an exec's argv and environment) to
/// another sandbox's supervisor or a host service. Connecting through the descriptor
/// instead reaches exactly the inode checked here.
///
/// # Errors
/// `NotFound` when there is nothing at `path`; `InvalidData` when it is not a socket (a
/// link, a regular file, …); any other error of `open` or `fstat`.
fn socket_no_follow(path: &Path) -> io::Result<OwnedFd> {
    use rustix::fs::{FileType, Mode, OFlags};
    let fd = rustix::fs::open(path, OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())?;
    let kind = FileType::from_raw_mode(rustix::fs::fstat(&fd)?.st_mode);
    if kind != FileType::Socket {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("not a socket but a {kind:?}")));
    }
    Ok(fd)
}

impl Drop for Inner {
    fn drop(&mut self) {
        if self.sealed {
            // Nothing was ever in flight to it: its close releases nothing of the sandbox's.
            return;
        }
        // Nothing more can be queued once the reading side is shut; what is queued is read
        // out, its descriptors to the closer.
        let _ = rustix::net::shutdown(&self.stream, Shutdown::Read);
        let mut buf = [0u8; 16 * 1024];
        let (mut drained, mut reads) = (0usize, 0usize);
        loop {
            // Each read's descriptors go to the closer at once: a queue of one-byte messages
            // each carrying `SCM_MAX_FD` of them is never held here together, and past
            // `MAX_DRAIN_READS` reads the rest goes to the closer with the socket.
            let mut fds = Vec::new();
            reads += 1;
            match recv(self.stream.as_fd(), &mut buf, &mut fds) {
                // Empty: the close (the field's drop) releases this socket alone.
                Ok((0, _)) => return,
                Ok((n, _)) if drained + n <= MAX_DRAIN && reads < MAX_DRAIN_READS => drained += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Ok(_) | Err(_) => break,
            }
        }
        // More than the bound, or a state not understood: the closer makes the last close.
        self.last = self.stream.as_fd().try_clone_to_owned().ok().map(SandboxFd::new);
    }
}

impl AsyncRead for UnixChannel {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        self.inner.poll_read(cx, buf)
    }
}

impl AsyncWrite for UnixChannel {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.inner.poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.inner.shutdown_writing())
    }
}

impl AsyncRead for ChannelRx {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        self.0.poll_read(cx, buf)
    }
}

impl AsyncWrite for ChannelTx {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.0.poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.0.shutdown_writing())
    }
}

impl Drop for ChannelTx {
    fn drop(&mut self) {
        let _ = self.0.shutdown_writing();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::os::fd::AsFd;
    use std::time::{Duration, Instant};

    use super::super::linger_tests::{ends, lingering};
    use super::*;

    /// A channel over one end of a pair, the other end (the supervisor's) with room for
    /// a megabyte queued.
    fn pair() -> (UnixChannel, std::os::unix::net::UnixStream) {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        rustix::net::sockopt::set_socket_send_buffer_size(&theirs, 1 << 20).unwrap();
        theirs.set_nonblocking(true).unwrap();
        (UnixChannel::for_tests(UnixStream::from_std(ours).unwrap()), theirs)
    }

    /// Queues `bytes` bytes, then one byte with a lingering socket: its peer.
    fn queue(theirs: &std::os::unix::net::UnixStream, bytes: usize) -> std::net::TcpStream {
        use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
        let chunk = vec![1u8; 16 * 1024];
        let mut queued = 0;
        while queued < bytes {
            queued +=
                rustix::net::send(theirs, &chunk[..chunk.len().min(bytes - queued)], SendFlags::empty())
                    .expect("room in the queue");
        }
        let (near, peer) = lingering(Duration::from_secs(30));
        let fds = [near.as_fd()];
        let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        assert!(control.push(SendAncillaryMessage::ScmRights(&fds)));
        rustix::net::sendmsg(theirs, &[io::IoSlice::new(b"x")], &mut control, SendFlags::empty()).unwrap();
        drop(near);
        peer
    }

    /// Descriptors still queued when a connection that could receive them is dropped are
    /// the closer's, not the dropping thread's: whether they are read out ...
    #[tokio::test]
    async fn descriptors_queued_at_the_close_are_not_closed_here() {
        let (channel, theirs) = pair();
        let mut peer = queue(&theirs, 1000);
        let started = Instant::now();
        drop(channel);
        assert!(started.elapsed() < Duration::from_millis(100), "the close waited {:?}", started.elapsed());
        assert!(ends(&mut peer), "the descriptor was closed");
    }

    /// ... or sit behind more than is read out (the socket goes to the closer whole).
    #[tokio::test]
    async fn descriptors_queued_past_the_drain_are_not_closed_here_either() {
        let (channel, theirs) = pair();
        let mut peer = queue(&theirs, MAX_DRAIN + 64 * 1024);
        let started = Instant::now();
        drop(channel);
        assert!(started.elapsed() < Duration::from_millis(100), "the close waited {:?}", started.elapsed());
        assert!(ends(&mut peer), "the descriptor was closed");
    }

    /// A reply that names a descriptor brings one: a supervisor that announces a long
    /// frame and sends it a byte at a time, each with `SCM_MAX_FD` descriptors, fails the
    /// read at the first message past one descriptor, never held until the frame's bytes
    /// came; what came goes to the closer, and what is still queued goes at the drop.
    #[tokio::test]
    async fn a_named_reply_with_more_than_one_descriptor_fails_at_once() {
        use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
        let count = || std::fs::read_dir("/proc/self/fd").unwrap().count();
        let (channel, theirs) = pair();
        let null = std::fs::File::open("/dev/null").unwrap();
        let before = count();
        // A header announcing 60,000 bytes of payload, then 20 one-byte messages of 253.
        let mut header = 60_000u32.to_be_bytes().to_vec();
        header.push(supervisor::protocol::FrameType::Data as u8);
        rustix::net::send(&theirs, &header, SendFlags::empty()).unwrap();
        let many = [null.as_fd(); SCM_MAX_FD];
        for _ in 0..20 {
            let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(SCM_MAX_FD))];
            let mut control = SendAncillaryBuffer::new(&mut space);
            assert!(control.push(SendAncillaryMessage::ScmRights(&many)));
            rustix::net::sendmsg(&theirs, &[io::IoSlice::new(b"x")], &mut control, SendFlags::empty())
                .unwrap();
        }
        let got = tokio::time::timeout(Duration::from_secs(5), channel.recv_named()).await;
        let refused = got.expect("the read failed at once, not waiting for the frame's bytes").unwrap_err();
        assert!(refused.to_string().contains("descriptors with a reply that names exactly one"), "{refused}");
        drop(channel);
        // The closer closes all of them: none is left in this process.
        let deadline = Instant::now() + Duration::from_secs(10);
        while count() > before && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(count() <= before, "{} descriptors left of {before}", count());
    }

    /// A read that receives a descriptor fails (the bytes with it too), and so does every
    /// later one; the descriptor is closed, not here.
    #[tokio::test]
    async fn a_descriptor_where_none_is_named_fails_the_connection() {
        use tokio::io::AsyncReadExt;
        let (mut channel, theirs) = pair();
        let mut peer = queue(&theirs, 10);
        let mut buf = [0u8; 64];
        let started = Instant::now();
        let refused = channel.read(&mut buf).await.unwrap_err();
        assert!(started.elapsed() < Duration::from_millis(100), "the read waited {:?}", started.elapsed());
        assert!(refused.to_string().contains("names none"), "{refused}");
        assert!(channel.read(&mut buf).await.is_err(), "the connection stays refused");
        assert!(ends(&mut peer), "the descriptor was closed");
    }
}
