//! The listening socket a supervisor hands over: only a listening TCP socket passes; the
//! thread accepts under the permits; a sandbox that makes its `accept` block cannot keep
//! the thread past the sandbox's end; dropped, it leaves the socket to its owner.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::sync::Semaphore;

use super::{Accepting, Listener, SandboxFd, UnixChannel};

fn conn() -> UnixChannel {
    UnixChannel::for_tests(tokio::net::UnixStream::pair().unwrap().0)
}

fn listening() -> (std::net::TcpListener, Listener) {
    let owner = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let ours = OwnedFd::from(owner.try_clone().unwrap());
    (owner, Listener::new(SandboxFd::new(ours), conn()).unwrap())
}

/// Serves each client with `n` (its order) and holds it until `release` has a permit.
fn numbered(
    release: Arc<Semaphore>,
) -> impl Fn(std::net::TcpStream) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> {
    let next = Arc::new(std::sync::atomic::AtomicU8::new(0));
    move |stream| {
        let (n, release) = (next.fetch_add(1, std::sync::atomic::Ordering::SeqCst), release.clone());
        Box::pin(async move {
            let mut stream = tokio::net::TcpStream::from_std(stream).unwrap();
            stream.write_all(&[b'0' + n]).await.unwrap();
            let _held = release.acquire().await.unwrap();
        })
    }
}

fn read_one(client: &mut std::net::TcpStream, wait: Duration) -> Option<u8> {
    client.set_read_timeout(Some(wait)).unwrap();
    let mut buf = [0u8; 1];
    match client.read(&mut buf) {
        Ok(1) => Some(buf[0]),
        _ => None,
    }
}

async fn finished(accepting: &Accepting, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while !accepting.is_finished() {
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

#[tokio::test]
async fn only_a_listening_tcp_socket_is_taken() {
    let refused = |fd: OwnedFd| Listener::new(SandboxFd::new(fd), conn()).unwrap_err();
    let file = OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
    assert_eq!(refused(file), "the descriptor is not a socket");
    let udp = OwnedFd::from(std::net::UdpSocket::bind("127.0.0.1:0").unwrap());
    assert_eq!(refused(udp), "the socket is not a stream socket");
    let unix = OwnedFd::from(std::os::unix::net::UnixStream::pair().unwrap().0);
    assert_eq!(refused(unix), "the socket is not an IPv4 or IPv6 one");
    let (owner, _) = listening();
    let connected = std::net::TcpStream::connect(owner.local_addr().unwrap()).unwrap();
    assert_eq!(refused(OwnedFd::from(connected)), "the socket does not listen");
    assert!(Listener::new(SandboxFd::new(OwnedFd::from(owner)), conn()).is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_are_accepted_only_under_a_permit() {
    let (owner, listener) = listening();
    let release = Arc::new(Semaphore::new(0));
    let accepting = listener
        .accept_on_thread(
            Arc::new(Semaphore::new(1)),
            tokio::runtime::Handle::current(),
            numbered(release.clone()),
        )
        .unwrap();
    let addr = owner.local_addr().unwrap();
    let mut first = std::net::TcpStream::connect(addr).unwrap();
    let mut second = std::net::TcpStream::connect(addr).unwrap();
    assert_eq!(read_one(&mut first, Duration::from_secs(5)), Some(b'0'));
    // One permit, held by the first client: the second waits in the backlog.
    assert_eq!(read_one(&mut second, Duration::from_millis(400)), None);
    release.add_permits(1);
    assert_eq!(read_one(&mut second, Duration::from_secs(5)), Some(b'1'));
    release.add_permits(1);
    drop(accepting);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_that_makes_accept_block_cannot_keep_the_thread() {
    let (owner, listener) = listening();
    // The sandbox's copy clears `O_NONBLOCK` on the socket both share: the thread's
    // `accept` blocks (no client comes).
    owner.set_nonblocking(false).unwrap();
    let release = Arc::new(Semaphore::new(16));
    let accepting = listener
        .accept_on_thread(Arc::new(Semaphore::new(4)), tokio::runtime::Handle::current(), numbered(release))
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!accepting.is_finished(), "still accepting");
    // The sandbox ended: closing shuts the socket down, which ends the blocked `accept`.
    accepting.close();
    assert!(finished(&accepting, Duration::from_secs(2)).await, "the thread ended");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_it_leaves_the_socket_to_its_owner_at_once() {
    let (owner, listener) = listening();
    let release = Arc::new(Semaphore::new(16));
    let accepting = listener
        .accept_on_thread(Arc::new(Semaphore::new(4)), tokio::runtime::Handle::current(), numbered(release))
        .unwrap();
    let addr = owner.local_addr().unwrap();
    let mut served = std::net::TcpStream::connect(addr).unwrap();
    assert_eq!(read_one(&mut served, Duration::from_secs(5)), Some(b'0'));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!accepting.is_finished(), "waiting for the next client");
    let ended = accepting.ended();
    drop(accepting);
    let deadline = Instant::now() + Duration::from_secs(1);
    while !ended.load(std::sync::atomic::Ordering::Acquire) {
        assert!(Instant::now() < deadline, "the thread ends at once, with no client coming");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Not shut down, and no longer accepted on by the thread: the owner accepts again.
    let mut later = std::net::TcpStream::connect(addr).unwrap();
    owner.set_nonblocking(false).unwrap();
    let (mut accepted, _) = owner.accept().unwrap();
    std::io::Write::write_all(&mut accepted, b"x").unwrap();
    assert_eq!(read_one(&mut later, Duration::from_secs(5)), Some(b'x'));
}
