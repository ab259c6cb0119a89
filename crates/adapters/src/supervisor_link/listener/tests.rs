//! The proxy's listener opened in a sandbox's network namespace: reached from inside that
//! namespace only, accepted on the runtime, the server's own namespace refused, a port
//! held inside reported, bound again after the server's socket closed (a restart), and
//! the init's exit seen. A process in a network namespace of its own (`unshare --net`,
//! loopback up) stands for a sandbox. Needs root (as the drivers that use it).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{Init, Parked, ProxyListener, open_in_namespace, start_time};

/// A process in a network namespace of its own, loopback up; killed when dropped.
struct InNamespace(Child);

impl Drop for InNamespace {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl InNamespace {
    fn pid(&self) -> i32 {
        i32::try_from(self.0.id()).unwrap()
    }
}

fn in_namespace() -> InNamespace {
    let child = Command::new("unshare")
        .args(["--net", "sh", "-c", "ip link set lo up && exec sleep 60"])
        .stdin(Stdio::null())
        .spawn()
        .expect("unshare (util-linux) and ip (iproute2) are installed");
    let child = InNamespace(child);
    // Ready once `sleep` runs (the loopback is up by then).
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::read_to_string(format!("/proc/{}/comm", child.pid())).unwrap_or_default().trim() != "sleep"
    {
        assert!(Instant::now() < deadline, "the namespace's process did not start");
        std::thread::sleep(Duration::from_millis(10));
    }
    child
}

/// Runs `f` on a thread inside the network namespace of `pid`.
fn inside<T: Send + 'static>(pid: i32, f: impl FnOnce() -> T + Send + 'static) -> T {
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/net")).unwrap();
    std::thread::spawn(move || {
        use rustix::thread::{LinkNameSpaceType, move_into_link_name_space};
        move_into_link_name_space(ns.as_fd(), Some(LinkNameSpaceType::Network)).unwrap();
        f()
    })
    .join()
    .unwrap()
}

fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name))
        .count()
}

async fn open(pid: i32, port: u16) -> std::io::Result<ProxyListener> {
    open_in_namespace(Init::open(pid).unwrap(), port).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listener_is_in_the_sandboxs_namespace_and_accepted_on_the_runtime() {
    let sandbox = in_namespace();
    let proxy = open(sandbox.pid(), 0).await.unwrap();
    let port = proxy.listener.local_addr().unwrap().port();
    assert_eq!(proxy.listener.local_addr().unwrap().ip(), std::net::Ipv4Addr::LOCALHOST);
    // The thread that entered the namespace has ended.
    let deadline = Instant::now() + Duration::from_secs(5);
    while threads_named("egress-netns") > 0 {
        assert!(Instant::now() < deadline, "the namespace thread outlived the open");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let client = tokio::task::spawn_blocking(move || {
        inside(sandbox.pid(), move || {
            let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
            stream.write_all(b"from inside").unwrap();
            stream.shutdown(std::net::Shutdown::Write).unwrap();
            let mut answer = String::new();
            stream.read_to_string(&mut answer).unwrap();
            answer
        })
    });
    let (mut stream, _) =
        tokio::time::timeout(Duration::from_secs(5), proxy.listener.accept()).await.unwrap().unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut got = String::new();
    stream.read_to_string(&mut got).await.unwrap();
    assert_eq!(got, "from inside");
    stream.write_all(b"answered").await.unwrap();
    drop(stream);
    assert_eq!(client.await.unwrap(), "answered");
    // The host's loopback has no such listener (unless by chance another one): a
    // connection from the server's namespace does not reach it.
    let from_host = std::net::TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(500),
    );
    if from_host.is_ok() {
        let accepted = tokio::time::timeout(Duration::from_millis(300), proxy.listener.accept()).await;
        assert!(accepted.is_err(), "a connection from the host reached the sandbox's listener");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_servers_own_namespace_is_refused() {
    let mut host = Command::new("sleep").arg("60").spawn().unwrap();
    let pid = i32::try_from(host.id()).unwrap();
    let refused = open(pid, 0).await;
    let _ = host.kill();
    let _ = host.wait();
    let e = refused.unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
    assert!(e.to_string().contains("server's own network namespace"), "{e}");
    // Not even pid 1 or below is taken for a sandbox's init.
    assert!(Init::open(1).is_err() && Init::open(0).is_err() && Init::open(-5).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_held_inside_is_reported_and_the_port_is_bound_again_once_closed() {
    let sandbox = in_namespace();
    let pid = sandbox.pid();
    // Something inside holds a port: the server's bind says so.
    let held = inside(pid, || std::net::TcpListener::bind("127.0.0.1:0").unwrap());
    let port = held.local_addr().unwrap().port();
    let e = open(pid, port).await.unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse, "{e}");
    drop(held);
    // The server's socket, with a connection it closed first (left in TIME_WAIT), closes
    // (as with the server's process): a restarted server binds the same port again.
    let proxy = open(pid, port).await.unwrap();
    let client = std::thread::spawn(move || {
        inside(pid, move || {
            let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
            let mut rest = Vec::new();
            let _ = stream.read_to_end(&mut rest);
        })
    });
    let (stream, _) = proxy.listener.accept().await.unwrap();
    drop(stream);
    client.join().unwrap();
    drop(proxy);
    let again = open(pid, port).await.unwrap();
    assert_eq!(again.listener.local_addr().unwrap().port(), port);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inits_exit_is_seen_and_its_parked_listener_dropped() {
    let mut sandbox = in_namespace();
    let pid = sandbox.pid();
    assert!(start_time(pid).unwrap() > 0);
    let proxy = open(pid, 0).await.unwrap();
    assert!(!proxy.init.has_exited());
    let parked = Parked::default();
    parked.park(proxy);
    let proxy = parked.take(pid).unwrap();
    assert!(parked.take(pid).is_none(), "taken once");
    parked.park(proxy);
    sandbox.0.kill().unwrap();
    sandbox.0.wait().unwrap();
    let other = in_namespace();
    // The init's exit ends a parked listener: not handed out, and dropped at the next park.
    assert!(parked.take(pid).is_none());
    assert!(Init::open(pid).is_err(), "a pid that exited opens nothing");
    let proxy = open(other.pid(), 0).await.unwrap();
    let exited = Init::open(other.pid()).unwrap();
    parked.park(proxy);
    assert_eq!(parked.len(), 1);
    drop(other);
    tokio::time::timeout(Duration::from_secs(5), exited.exited()).await.expect("the exit is seen");
    assert!(exited.has_exited());
}
