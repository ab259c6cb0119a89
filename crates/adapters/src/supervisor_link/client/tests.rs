//! The server's side against a misbehaving supervisor (what a compromised sandbox could
//! answer): more bytes than a file announced, a listing past its bounds, output past the
//! cap, an upload answered early. Each breaks only its own operation.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use tokio::net::UnixListener;

use super::*;

/// A fake supervisor on a fresh socket: it answers the hello, reads the request, then
/// sends `frames` (and keeps the connection until the client goes).
async fn fake(frames: Vec<Frame>) -> (tempfile::TempDir, PathBuf) {
    let (dir, path, _gone) = fake_seeing_the_client_go(frames).await;
    (dir, path)
}

/// [`fake`], and a receiver told when the client's side of the connection closed.
async fn fake_seeing_the_client_go(
    frames: Vec<Frame>,
) -> (tempfile::TempDir, PathBuf, tokio::sync::oneshot::Receiver<()>) {
    let (gone_tx, gone) = tokio::sync::oneshot::channel();
    let (dir, path) = fake_then(|mut stream| async move {
        for frame in frames {
            if write_frame(&mut stream, &frame).await.is_err() {
                return;
            }
        }
        // Wait for the client to go.
        while let Ok(Some(_)) = read_frame(&mut stream).await {}
        let _ = gone_tx.send(());
    });
    (dir, path, gone)
}

/// A fake supervisor on a fresh socket: it answers the hello, reads the request, then
/// hands the connection to `then`.
fn fake_then<F, Fut>(then: F) -> (tempfile::TempDir, PathBuf)
where
    F: FnOnce(tokio::net::UnixStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sock");
    let listener = UnixListener::bind(&path).unwrap();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let _hello = read_frame(&mut stream).await;
        let hello = Reply::Hello { version: VERSION, features: vec![], protections: Protections::default() };
        write_frame(&mut stream, &Frame::control(&hello).unwrap()).await.unwrap();
        let _request = read_frame(&mut stream).await;
        then(stream).await;
    });
    (dir, path)
}

fn control(reply: &Reply) -> Frame {
    Frame::control(reply).unwrap()
}

fn data(kind: FrameType, bytes: &[u8]) -> Frame {
    Frame { kind, payload: bytes.to_vec() }
}

fn sandbox() -> SandboxId {
    SandboxId::generate(5, 5)
}

const T: Duration = Duration::from_secs(5);

#[tokio::test]
async fn a_file_is_held_to_the_size_it_announced() {
    let frames =
        vec![control(&Reply::File { size: 3 }), data(FrameType::Data, b"abcdef"), control(&Reply::End)];
    let (_dir, sock) = fake(frames).await;
    let FileRead::File(size, mut stream) = file_read(&sock, &sandbox(), "/workspace/f", T).await.unwrap()
    else {
        panic!("a file");
    };
    assert_eq!(size, 3);
    let Err(DriverError::Failed(cause)) = stream.next().await else { panic!("a failure") };
    assert!(cause.to_string().contains("more bytes"), "{cause}");
    // The client's own error stays whole below the port's: the chain reaches it.
    let below = std::error::Error::source(&cause).expect("a source");
    assert!(matches!(below.downcast_ref::<ClientError>(), Some(ClientError::Protocol(_))), "{below:?}");

    // Fewer bytes than announced, then the end: not presented as whole.
    let frames =
        vec![control(&Reply::File { size: 10 }), data(FrameType::Data, b"abc"), control(&Reply::End)];
    let (_dir, sock) = fake(frames).await;
    let FileRead::File(_, mut stream) = file_read(&sock, &sandbox(), "/workspace/f", T).await.unwrap() else {
        panic!("a file");
    };
    assert_eq!(stream.next().await.unwrap(), Some(b"abc".to_vec()));
    assert!(stream.next().await.is_err(), "a short file is an error, not an end");
}

/// A supervisor that lists processes of many empty arguments (3 bytes each on the wire, a
/// `String` each in memory) is cut off by what the listing holds in memory, not by its
/// size on the wire.
#[tokio::test]
async fn a_process_listing_is_bounded_by_the_memory_it_takes() {
    let status = ProcessStatus {
        pid: 1,
        argv: vec![String::new(); 80_000],
        running: true,
        exit_code: None,
        timed_out: false,
        terminal: None,
    };
    let frame = control(&Reply::Process(status));
    assert!(frame.payload.len() < supervisor::protocol::MAX_FRAME, "one frame: {}", frame.payload.len());
    let mut frames = vec![frame; 20];
    frames.push(control(&Reply::End));
    let (_dir, sock) = fake(frames).await;
    let got = process_list(&sock, T).await;
    assert!(got.is_err(), "20 statuses of 80,000 arguments (about 40 MB held) are past the bound");
    // A few honest ones are read.
    let honest = ProcessStatus {
        pid: 2,
        argv: vec!["sleep".into(), "60".into()],
        running: true,
        exit_code: None,
        timed_out: false,
        terminal: Some("term_x".into()),
    };
    let (_dir, sock) = fake(vec![control(&Reply::Process(honest.clone())), control(&Reply::End)]).await;
    assert_eq!(process_list(&sock, T).await.unwrap().len(), 1);
}

#[tokio::test]
async fn a_listing_past_its_bounds_is_refused() {
    let big = "n".repeat(200_000);
    let entry = WireEntry { name: big, kind: "file".into(), size: 1 };
    let mut frames = vec![control(&Reply::Directory)];
    // 400 frames of one 200 kB name: 80 MB, past the bound.
    frames.extend((0..400).map(|_| control(&Reply::Entries { entries: vec![entry.clone()] })));
    frames.push(control(&Reply::End));
    let (_dir, sock) = fake(frames).await;
    let Ok(FileRead::Directory(mut listing)) = file_read(&sock, &sandbox(), "/workspace", T).await else {
        panic!("a listing");
    };
    // Relayed a frame at a time until the bound, then broken off (never an end).
    let mut batches = 0;
    let failed = loop {
        match listing.next().await {
            Ok(Some(batch)) => {
                assert_eq!(batch.len(), 1);
                batches += 1;
            }
            Ok(None) => panic!("a listing past its bounds ended as if whole"),
            Err(e) => break e,
        }
    };
    assert!(matches!(failed, DriverError::TooLarge(_)), "{failed:?}");
    assert!(batches < 400 && batches * 200_000 <= MAX_LISTING_BYTES, "{batches}");
    // Past the count of entries too.
    let small = WireEntry { name: "a".into(), kind: "file".into(), size: 1 };
    let mut frames = vec![control(&Reply::Directory)];
    frames.extend(
        (0..=MAX_LISTING / 1000).map(|_| control(&Reply::Entries { entries: vec![small.clone(); 1000] })),
    );
    frames.push(control(&Reply::End));
    let (_dir, sock) = fake(frames).await;
    let Ok(FileRead::Directory(mut listing)) = file_read(&sock, &sandbox(), "/workspace", T).await else {
        panic!("a listing");
    };
    let mut seen = 0;
    let failed = loop {
        match listing.next().await {
            Ok(Some(batch)) => seen += batch.len(),
            Ok(None) => panic!("a listing past its bounds ended as if whole"),
            Err(e) => break e,
        }
    };
    assert!(matches!(failed, DriverError::TooLarge(_)) && seen <= MAX_LISTING, "{failed:?} after {seen}");
    // Positive control: a listing within the bounds is read, in its batches, to its end.
    let frames = vec![
        control(&Reply::Directory),
        control(&Reply::Entries {
            entries: vec![WireEntry { name: "a".into(), kind: "file".into(), size: 1 }],
        }),
        control(&Reply::Entries {
            entries: vec![WireEntry { name: "b".into(), kind: "directory".into(), size: 4096 }],
        }),
        control(&Reply::End),
    ];
    let (_dir, sock) = fake(frames).await;
    let Ok(FileRead::Directory(mut listing)) = file_read(&sock, &sandbox(), "/workspace", T).await else {
        panic!("a listing");
    };
    let first = listing.next().await.unwrap().unwrap();
    assert_eq!((first.len(), first[0].name.as_str(), first[0].kind), (1, "a", EntryKind::File));
    let second = listing.next().await.unwrap().unwrap();
    assert_eq!((second[0].name.as_str(), second[0].kind, second[0].size), ("b", EntryKind::Directory, 4096));
    assert!(listing.next().await.unwrap().is_none());
}

/// A listing's first entries are read before it is handed over (an error up front is
/// told as one); then it is relayed as it comes: the server holds a frame, not the
/// listing, and a listing whose supervisor never ends it is not whole. Dropping it
/// closes the connection.
#[tokio::test]
async fn a_listing_is_relayed_as_it_comes() {
    let frames = vec![
        control(&Reply::Directory),
        control(&Reply::Error { code: "conflict".into(), message: "not searchable".into() }),
    ];
    let (_dir, sock) = fake(frames).await;
    assert!(matches!(
        file_read(&sock, &sandbox(), "/workspace/d", T).await,
        Err(ClientError::Refused { ref code, .. }) if code == "conflict"
    ));
    // The first batch, then nothing more: handed over with that batch, never ended.
    let entry = WireEntry { name: "a".into(), kind: "file".into(), size: 1 };
    let frames = vec![control(&Reply::Directory), control(&Reply::Entries { entries: vec![entry] })];
    let (_dir, sock, gone) = fake_seeing_the_client_go(frames).await;
    let Ok(FileRead::Directory(mut listing)) = file_read(&sock, &sandbox(), "/workspace/d", T).await else {
        panic!("a listing");
    };
    assert_eq!(listing.next().await.unwrap().unwrap().len(), 1);
    let more = tokio::time::timeout(Duration::from_millis(300), listing.next()).await;
    assert!(more.is_err(), "no end came, so the listing is not over: {more:?}");
    drop(listing);
    tokio::time::timeout(T, gone).await.expect("the connection closed").unwrap();
}

/// A supervisor that sends empty batches (an honest one never does) could hold a listing
/// open a frame at a time: the first empty batch breaks it off.
#[tokio::test]
async fn an_empty_batch_in_a_listing_breaks_it_off() {
    let entry = WireEntry { name: "a".into(), kind: "file".into(), size: 1 };
    let mut frames = vec![control(&Reply::Directory), control(&Reply::Entries { entries: vec![entry] })];
    frames.extend((0..3).map(|_| control(&Reply::Entries { entries: Vec::new() })));
    frames.push(control(&Reply::End));
    let (_dir, sock) = fake(frames).await;
    let Ok(FileRead::Directory(mut listing)) = file_read(&sock, &sandbox(), "/workspace/d", T).await else {
        panic!("a listing");
    };
    assert_eq!(listing.next().await.unwrap().unwrap().len(), 1);
    let next = listing.next().await;
    assert!(next.is_err(), "an empty batch is a protocol error: {next:?}");
}

#[tokio::test]
async fn output_past_the_cap_is_dropped_here_too() {
    let frames = vec![
        control(&Reply::Started { pid: 9 }),
        data(FrameType::Stdout, &[b'x'; 100]),
        data(FrameType::Stdout, &[b'y'; 100]),
        control(&Reply::Exit { code: 0, timed_out: false, truncated: false }),
    ];
    let (_dir, sock) = fake(frames).await;
    let spec = ExecSpec {
        argv: vec!["x".into()],
        env: vec![],
        cwd: "/workspace".into(),
        timeout_ms: 5_000,
        output_cap: 150,
        stdin: false,
        rlimits: vec![],
    };
    let out = exec(&sock, &spec, b"", T, T).await.unwrap();
    assert_eq!(out.stdout.len(), 150, "the supervisor's cap is checked again");
    assert!(out.truncated, "and reported, whatever the supervisor says");
}

/// A source of `n` chunks of 64 KiB.
struct Endless(usize);

#[async_trait]
impl ByteSource for Endless {
    async fn next(&mut self) -> Result<Option<Vec<u8>>, SourceError> {
        if self.0 == 0 {
            return Ok(None);
        }
        self.0 -= 1;
        Ok(Some(vec![0u8; 64 << 10]))
    }
}

#[tokio::test]
async fn an_upload_answered_early_stops_sending_and_reports_why() {
    let refusal = Reply::Error { code: "too_large".into(), message: "no room".into() };
    let (_dir, sock) = fake(vec![control(&refusal)]).await;
    let got = file_write(&sock, "/workspace/f", Box::new(Endless(100_000)), T).await;
    assert!(matches!(got, Err(ClientError::Refused { ref code, .. }) if code == "too_large"), "{got:?}");
}

/// A supervisor that takes the upload's request and then reads nothing more, its
/// connection open: the upload fails at the idle deadline (its file-operation place goes
/// with it), not never.
#[tokio::test(start_paused = true)]
async fn an_upload_the_supervisor_stops_reading_fails_at_the_idle_deadline() {
    let (_dir, sock) = fake_then(|stream| async move {
        // Holds the connection, reading nothing.
        std::future::pending::<()>().await;
        drop(stream);
    });
    let started = tokio::time::Instant::now();
    let got = file_write(&sock, "/workspace/f", Box::new(Endless(100_000)), T).await;
    assert!(got.is_err(), "{got:?}");
    let took = started.elapsed();
    assert!(took >= IDLE_TIMEOUT && took < IDLE_TIMEOUT * 2, "failed after {took:?}");
}

/// A replay of a process's output (no `follow`) that never ends (a supervisor streaming a
/// frame a second, never its end): the read fails once the replay has taken
/// [`OP_TIMEOUT`], however often frames come. (An MCP `process_output` without `wait_ms`
/// reads one to its end, outside the HTTP request timeout.)
#[tokio::test(start_paused = true)]
async fn an_output_replay_that_never_ends_fails_at_its_deadline() {
    let (_dir, sock) = fake_then(|mut stream| async move {
        let replay = Reply::Replay { dropped: 0 };
        if write_frame(&mut stream, &control(&replay)).await.is_err() {
            return;
        }
        loop {
            let chunk = Frame { kind: FrameType::Stdout, payload: b"more\n".to_vec() };
            if write_frame(&mut stream, &chunk).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    let sandbox = SandboxId::generate(1, 2);
    let started = tokio::time::Instant::now();
    let mut output = process_output(&sock, &sandbox, 7, false, T).await.unwrap();
    let failed = loop {
        match output.next().await {
            Ok(Some(OutputEvent::Stdout(_))) => {}
            other => break other,
        }
    };
    assert!(failed.is_err(), "{failed:?}");
    let took = started.elapsed();
    assert!(took >= OP_TIMEOUT && took < OP_TIMEOUT + Duration::from_secs(5), "failed after {took:?}");
}

/// A supervisor that takes a start's request and then reads none of its stdin (a MiB, more
/// than the socket holds): the start fails at the operation's deadline, not never.
#[tokio::test(start_paused = true)]
async fn a_start_whose_stdin_is_never_read_fails_at_its_deadline() {
    let (_dir, sock) = fake_then(|stream| async move {
        std::future::pending::<()>().await;
        drop(stream);
    });
    let spec = ExecSpec {
        argv: vec!["cat".into()],
        env: vec![],
        cwd: "/workspace".into(),
        timeout_ms: 0,
        output_cap: 150,
        stdin: true,
        rlimits: vec![],
    };
    let start = ProcessStart {
        spec,
        buffer_bytes: 1 << 20,
        max_processes: 4,
        max_buffered_bytes: 1 << 24,
        terminal: None,
    };
    let started = tokio::time::Instant::now();
    let got = process_start(&sock, &start, &vec![b'x'; 1 << 20], T).await;
    assert!(got.is_err(), "{got:?}");
    let took = started.elapsed();
    assert!(took >= OP_TIMEOUT && took < OP_TIMEOUT * 2, "failed after {took:?}");
}

/// A fake supervisor that answers `take` (or `listen`) with `reply`, with `fds` attached
/// (`SCM_RIGHTS`), then closes its copies of them.
async fn fake_take(reply: Reply, fds: Vec<std::os::fd::OwnedFd>) -> (tempfile::TempDir, PathBuf) {
    fake_then(move |mut stream| async move {
        let bytes = Frame::control(&reply).unwrap().encode();
        let borrowed: Vec<_> = fds.iter().map(std::os::fd::AsFd::as_fd).collect();
        let mut space = vec![std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(16))];
        let mut control = rustix::net::SendAncillaryBuffer::new(&mut space);
        if !borrowed.is_empty() {
            assert!(control.push(rustix::net::SendAncillaryMessage::ScmRights(&borrowed)));
        }
        stream.writable().await.unwrap();
        let n = rustix::net::sendmsg(
            &stream,
            &[io::IoSlice::new(&bytes)],
            &mut control,
            rustix::net::SendFlags::empty(),
        )
        .unwrap();
        assert_eq!(n, bytes.len());
        drop(fds);
        while let Ok(Some(_)) = read_frame(&mut stream).await {}
    })
}

/// A connected pair of loopback TCP streams: (the one to pass, its peer).
fn tcp_pair() -> (std::net::TcpStream, std::net::TcpStream) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let near = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (far, _) = listener.accept().unwrap();
    (far, near)
}

/// Whether `peer`'s other end was closed (it reads the end of the stream).
fn closed(peer: &mut std::net::TcpStream) -> bool {
    use std::io::Read;
    peer.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    matches!(peer.read(&mut [0u8; 1]), Ok(0))
}

async fn take_refusal(fds: Vec<std::os::fd::OwnedFd>) -> String {
    let (_dir, path) = fake_take(Reply::Taken, fds).await;
    match take(&path, 1, T).await {
        Err(ClientError::Protocol(ProtocolError::Unexpected(why))) => why,
        other => panic!("refused as a protocol breach, not {other:?}"),
    }
}

#[tokio::test]
async fn a_taken_tcp_connection_is_used_as_it_is() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (passed, mut peer) = tcp_pair();
    let (_dir, path) = fake_take(Reply::Taken, vec![passed.into()]).await;
    let mut stream = take(&path, 1, T).await.unwrap();
    stream.write_all(b"through").await.unwrap();
    let mut got = [0u8; 7];
    std::io::Read::read_exact(&mut peer, &mut got).unwrap();
    assert_eq!(&got, b"through");
    std::io::Write::write_all(&mut peer, b"back").unwrap();
    let mut back = [0u8; 4];
    stream.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"back");
}

#[tokio::test]
async fn a_pipe_is_refused() {
    let (read, _write) = std::io::pipe().unwrap();
    let why = take_refusal(vec![read.into()]).await;
    assert!(why.contains("not a socket"), "{why}");
}

#[tokio::test]
async fn a_datagram_socket_is_refused() {
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let why = take_refusal(vec![udp.into()]).await;
    assert!(why.contains("not a stream socket"), "{why}");
}

#[tokio::test]
async fn a_unix_socket_is_refused() {
    let (one, _other) = std::os::unix::net::UnixStream::pair().unwrap();
    let why = take_refusal(vec![one.into()]).await;
    assert!(why.contains("not an IPv4 or IPv6"), "{why}");
}

#[tokio::test]
async fn two_descriptors_are_refused_and_both_closed() {
    let (first, mut first_peer) = tcp_pair();
    let (second, mut second_peer) = tcp_pair();
    let why = take_refusal(vec![first.into(), second.into()]).await;
    assert!(why.contains("exactly one"), "{why}");
    assert!(closed(&mut first_peer) && closed(&mut second_peer), "both descriptors closed");
}

#[tokio::test]
async fn many_descriptors_are_refused_and_all_closed() {
    // The reply is read with room for every descriptor one message can carry, so the
    // kernel closes none of them itself (on the reading thread): all are received,
    // refused and closed.
    let pairs: Vec<_> = (0..16).map(|_| tcp_pair()).collect();
    let (passed, mut peers): (Vec<_>, Vec<_>) = pairs.into_iter().unzip();
    let why = take_refusal(passed.into_iter().map(Into::into).collect()).await;
    assert!(why.contains("exactly one"), "{why}");
    assert!(peers.iter_mut().all(closed), "every descriptor closed");
}

#[tokio::test]
async fn taken_without_a_descriptor_is_refused() {
    let why = take_refusal(Vec::new()).await;
    assert!(why.contains("exactly one"), "{why}");
}

#[tokio::test]
async fn a_descriptor_with_a_refusal_is_closed() {
    let (passed, mut peer) = tcp_pair();
    let refusal = Reply::Error { code: "not_found".to_owned(), message: "gone".to_owned() };
    let (_dir, path) = fake_take(refusal, vec![passed.into()]).await;
    let refused = take(&path, 1, T).await;
    assert!(matches!(&refused, Err(ClientError::Refused { code, .. }) if code == "not_found"), "{refused:?}");
    assert!(closed(&mut peer), "the descriptor that came along was closed");
}

#[tokio::test]
async fn a_descriptor_with_another_reply_than_taken_is_refused() {
    let owner = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (_dir, path) = fake_take(Reply::Tunnel, vec![owner.try_clone().unwrap().into()]).await;
    let why = match take(&path, 1, T).await {
        Err(ClientError::Protocol(ProtocolError::Unexpected(why))) => why,
        other => panic!("refused as a protocol breach, not {other:?}"),
    };
    assert!(why.contains("instead of taken"), "{why}");
}

/// A supervisor may keep a copy of the descriptor it hands over, and the file status flags
/// (`O_NONBLOCK`) belong to the open file that both copies share: it can make the socket
/// blocking again at any time. The server's reads and writes must still only ever wait
/// for readiness, never block the thread they run on (here the runtime's only one, so a
/// blocked call would stop every timer, and the test's watchdog would see it).
#[test]
fn a_descriptor_its_sender_makes_blocking_never_blocks_the_server() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let (passed, mut peer) = tcp_pair();
            let kept = passed.try_clone().unwrap(); // the sender's copy
            let (_dir, path) = fake_take(Reply::Taken, vec![passed.into()]).await;
            let mut stream = take(&path, 1, T).await.unwrap();
            kept.set_nonblocking(false).unwrap();
            let wait = Duration::from_millis(200);

            // A read that empties what was there, then one with nothing there: it waits.
            std::io::Write::write_all(&mut peer, b"0123456789abcdef").unwrap();
            let mut got = [0u8; 16];
            tokio::time::timeout(T, stream.read_exact(&mut got)).await.unwrap().unwrap();
            assert_eq!(&got, b"0123456789abcdef");
            let idle = tokio::time::timeout(wait, stream.read(&mut got)).await;
            assert!(idle.is_err(), "a read with nothing to read returned: {idle:?}");

            // A peer that never reads: writing more than the socket buffers hold waits.
            let big = vec![7u8; 64 << 20];
            let stuck = tokio::time::timeout(wait, stream.write_all(&big)).await;
            assert!(stuck.is_err(), "a write past the buffers returned: {stuck:?}");

            // The connection still works both ways once the peer reads.
            drop(big);
            std::io::Write::write_all(&mut peer, b"more").unwrap();
            let mut more = [0u8; 4];
            tokio::time::timeout(T, stream.read_exact(&mut more)).await.unwrap().unwrap();
            assert_eq!(&more, b"more");
            drop(kept);
        });
        let _ = done.send(());
    });
    finished.recv_timeout(Duration::from_secs(30)).expect(
        "the server's thread blocked on a descriptor its sender made blocking (or the test panicked)",
    );
}

/// A supervisor that can write where it listens (a container's, in a host directory bound
/// into the container) may replace its socket with a link to another socket of the host:
/// the server must not follow it. The same socket reached by its own path still works.
#[tokio::test]
async fn a_socket_replaced_by_a_link_is_refused_and_never_followed() {
    let elsewhere = tempfile::tempdir().unwrap();
    let target = elsewhere.path().join("other.sock");
    let listener = UnixListener::bind(&target).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("sock");
    std::os::unix::fs::symlink(&target, &link).unwrap();

    let refused = connect(link.as_path(), T).await;
    match refused {
        Err(ClientError::Protocol(ProtocolError::Unexpected(why))) => {
            assert!(why.contains("not a socket"), "{why}");
        }
        Err(e) => panic!("refused as a protocol breach, not {e:?}"),
        Ok(_) => panic!("a link was followed"),
    }
    let reached = tokio::time::timeout(Duration::from_millis(200), listener.accept()).await;
    assert!(reached.is_err(), "the link's target was connected to");

    // Positive control: a regular file is refused too, a missing path is gone, and the
    // target itself is reached by its own path.
    let file = dir.path().join("file");
    std::fs::write(&file, b"").unwrap();
    assert!(matches!(connect(file.as_path(), T).await, Err(ClientError::Protocol(_))));
    assert!(matches!(connect(dir.path().join("none").as_path(), T).await, Err(ClientError::Gone(_))));
    let (_dir2, real) = fake(Vec::new()).await;
    connect(real.as_path(), T).await.expect("a real socket is connected to");
}

/// A caller that goes away before the supervisor has said `started` (the command may
/// already run) closes the connection at once, so the supervisor ends the command: the
/// task that holds the write half open is aborted with the request, not left holding it
/// until the command's own timeout.
#[tokio::test]
async fn an_exec_abandoned_before_started_closes_its_connection() {
    // No `started`: the fake reads until the client's side closes.
    let (_dir, path, closed) = fake_seeing_the_client_go(Vec::new()).await;
    let spec = ExecSpec {
        argv: vec!["sleep".into(), "60".into()],
        env: vec![],
        cwd: "/workspace".into(),
        timeout_ms: 60_000,
        output_cap: 1024,
        stdin: false,
        rlimits: vec![],
    };
    let abandoned =
        tokio::time::timeout(Duration::from_millis(200), exec(path.as_path(), &spec, b"", T, T)).await;
    assert!(abandoned.is_err(), "the exec was still waiting for started");
    tokio::time::timeout(Duration::from_secs(5), closed)
        .await
        .expect("the supervisor saw the connection close within 5 s of the caller going away")
        .unwrap();
}
