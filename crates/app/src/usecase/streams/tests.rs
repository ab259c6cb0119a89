//! The operations inside a sandbox over mocks: the gate (ready sandboxes only), the caps
//! the use cases hold (files and archives both ways), the process caps handed to the
//! driver, and how a sandbox gone from the driver is reported.

use std::sync::{Arc, Mutex};

use domain::execution::SandboxSubject;
use domain::{CallerClass, ProcessCaps, ProcessRequest, SandboxId, SandboxPath, SandboxState};
use ports::{ByteStream, DriverError, ReadOutcome};

use crate::test_support::*;
use crate::usecase::{
    LaneDeps, OperationError, StreamLimits, archive_in, archive_out, read_path, start_process, write_file,
};

fn sandbox() -> SandboxId {
    SandboxId::generate(21, 21)
}

/// Mocks where the service caller may act and the sandbox is in `state`.
fn mocks_with(state: SandboxState) -> Mocks {
    let mut m = Mocks::new(true);
    m.first_ensurer_owns(Some(CALLER_ID));
    let mut record = existing_ready(agent_execution().sandbox_key(), &sandbox());
    record.state = state;
    m.reads_sandbox(record.clone(), Some(CALLER_ID));
    m.registry.expect_get().returning(move |_| Ok(Some(record.clone())));
    m
}

fn deps_with(m: Mocks, limits: StreamLimits) -> LaneDeps {
    let mut deps = m.deps();
    deps.streams = limits;
    deps
}

fn path(p: &str) -> SandboxPath {
    SandboxPath::parse(p).unwrap()
}

fn small() -> StreamLimits {
    StreamLimits { max_file_bytes: 10, max_archive_bytes: 20, ..StreamLimits::default() }
}

#[tokio::test]
async fn an_upload_that_says_it_is_too_large_never_reaches_the_driver() {
    let mut m = mocks_with(SandboxState::Ready);
    m.driver.expect_write_file().never();
    m.driver.expect_archive_in().never();
    let deps = deps_with(m, small());
    let actor = actor(CallerClass::Service);
    let got =
        write_file(&deps, &actor, &org(), &sandbox(), &path("f"), ChunkSource::of(&[b"x"]), Some(11)).await;
    assert_eq!(got, Err(OperationError::TooLarge { what: "a file of 11 bytes".into(), limit: 10 }));
    let got =
        archive_in(&deps, &actor, &org(), &sandbox(), &path("d"), ChunkSource::of(&[b"x"]), Some(21)).await;
    assert!(matches!(got, Err(OperationError::TooLarge { limit: 20, .. })), "{got:?}");
}

#[tokio::test]
async fn an_upload_that_passes_the_cap_is_abandoned_and_reported_too_large() {
    let mut m = mocks_with(SandboxState::Ready);
    let pulled = Arc::new(Mutex::new(Vec::new()));
    let seen = pulled.clone();
    m.driver.expect_write_file().times(2).returning(move |_, _, mut source| {
        // The driver pulls as a real one does; the cap fails the source past 10 bytes.
        let seen = seen.clone();
        let rt = tokio::runtime::Handle::current();
        std::thread::scope(|s| {
            s.spawn(|| {
                rt.block_on(async {
                    loop {
                        match source.next().await {
                            Ok(Some(bytes)) => seen.lock().unwrap().push(bytes),
                            Ok(None) => return Ok(4),
                            Err(e) => return Err(DriverError::Source(e)),
                        }
                    }
                })
            })
            .join()
            .unwrap()
        })
    });
    let deps = deps_with(m, small());
    let actor = actor(CallerClass::Service);
    let big = ChunkSource::of(&[b"123456", b"7890", b"X"]);
    let got = write_file(&deps, &actor, &org(), &sandbox(), &path("f"), big, None).await;
    assert_eq!(got, Err(OperationError::TooLarge { what: "the file for /workspace/f".into(), limit: 10 }));
    assert_eq!(pulled.lock().unwrap().concat(), b"1234567890", "nothing past the cap was handed on");
    // Positive control: within the cap it is written.
    let got =
        write_file(&deps, &actor, &org(), &sandbox(), &path("f"), ChunkSource::of(&[b"abcd"]), Some(4)).await;
    assert_eq!(got, Ok(4));
}

#[tokio::test]
async fn reads_and_archives_out_are_held_to_their_caps() {
    let mut m = mocks_with(SandboxState::Ready);
    m.driver.expect_read_path().returning(|_, p| {
        let size = if p.relative() == "big" { 11 } else { 3 };
        Ok(ReadOutcome::File { size, contents: Box::new(ChunkStream(vec![b"abc".to_vec()].into())) })
    });
    m.driver.expect_archive_out().returning(|_, _| {
        Ok(Box::new(ChunkStream(vec![vec![1u8; 15], vec![2u8; 15]].into())) as Box<dyn ByteStream>)
    });
    let deps = deps_with(m, small());
    let actor = actor(CallerClass::Service);
    let got = read_path(&deps, &actor, &org(), &sandbox(), &path("big")).await;
    assert!(matches!(got, Err(OperationError::TooLarge { limit: 10, .. })), "{got:?}");
    let got = read_path(&deps, &actor, &org(), &sandbox(), &path("small")).await;
    assert!(matches!(got, Ok(ReadOutcome::File { size: 3, .. })), "{got:?}");
    let mut stream = archive_out(&deps, &actor, &org(), &sandbox(), &path("d")).await.unwrap();
    assert_eq!(stream.next().await.unwrap().map(|b| b.len()), Some(15));
    assert!(
        matches!(stream.next().await, Err(DriverError::TooLarge(_))),
        "the 30th byte passes the cap of 20"
    );
}

#[tokio::test]
async fn operations_need_a_ready_sandbox_and_report_one_gone() {
    let mut m = mocks_with(SandboxState::Provisioning);
    m.driver.expect_start_process().never();
    let deps = deps_with(m, StreamLimits::default());
    let request = ProcessRequest::new(vec!["sleep".into()], vec![], None).unwrap();
    let got = start_process(&deps, &actor(CallerClass::Service), &org(), &sandbox(), &request).await;
    assert!(
        matches!(got, Err(OperationError::NotReady { state: SandboxState::Provisioning, .. })),
        "{got:?}"
    );

    let mut m = mocks_with(SandboxState::Ready);
    m.driver.expect_start_process().returning(|id, _, _| Err(DriverError::NotFound(id.clone())));
    let deps = deps_with(m, StreamLimits::default());
    let got = start_process(&deps, &actor(CallerClass::Service), &org(), &sandbox(), &request).await;
    assert_eq!(got, Err(OperationError::Gone(sandbox())));
}

#[tokio::test]
async fn a_start_hands_the_configured_caps_and_the_request_to_the_driver() {
    let caps = ProcessCaps { max_processes: 3, buffer_bytes: 100, max_buffered_bytes: 300 };
    let mut m = mocks_with(SandboxState::Ready);
    m.driver.expect_start_process().times(1).returning(move |id, request, given| {
        assert_eq!(id, &sandbox());
        assert_eq!(given, &caps);
        assert_eq!(
            (request.argv(), request.stdin(), request.timeout_ms()),
            (&["cat".to_owned()][..], &b"in"[..], None)
        );
        Ok(domain::ProcessInfo {
            pid: 9,
            argv: vec!["cat".into()],
            running: true,
            exit_code: None,
            timed_out: false,
            terminal: None,
        })
    });
    let deps = deps_with(m, StreamLimits { processes: caps, ..StreamLimits::default() });
    let request = ProcessRequest::new(vec!["cat".into()], b"in".to_vec(), None).unwrap();
    let got = start_process(&deps, &actor(CallerClass::Service), &org(), &sandbox(), &request).await.unwrap();
    assert_eq!((got.pid, got.running), (9, true));
}

#[tokio::test]
async fn an_empty_archive_is_refused() {
    let mut m = mocks_with(SandboxState::Ready);
    m.driver.expect_archive_in().times(1).returning(|_, _, _| Ok(ports::Unpacked::default()));
    let deps = deps_with(m, small());
    let actor = actor(CallerClass::Service);
    // Declared empty: refused before the driver.
    let got = archive_in(&deps, &actor, &org(), &sandbox(), &path("d"), ChunkSource::of(&[]), Some(0)).await;
    assert!(matches!(got, Err(OperationError::Invalid(_))), "{got:?}");
    // Chunked with no bytes: the driver saw nothing to unpack; still refused.
    let got = archive_in(&deps, &actor, &org(), &sandbox(), &path("d"), ChunkSource::of(&[]), None).await;
    assert!(matches!(got, Err(OperationError::Invalid(_))), "{got:?}");
}

/// An output stream of a background process that ends (with its exit) once `ended` is
/// notified.
struct EndsWhenTold(Arc<tokio::sync::Notify>);

#[async_trait::async_trait]
impl ports::OutputStream for EndsWhenTold {
    async fn next(&mut self) -> Result<Option<domain::OutputEvent>, DriverError> {
        self.0.notified().await;
        Ok(Some(domain::OutputEvent::Exit(domain::ExitStatus {
            exit_code: 0,
            timed_out: false,
            truncated: false,
        })))
    }
}

/// Mocks where the sandbox has one place in the command quota, the driver starts processes
/// with pids 11, 12, ... and a process's output ends (with its exit) once the returned
/// `Notify` is notified.
fn one_place() -> (Mocks, Arc<tokio::sync::Notify>) {
    let mut m = mocks_with(SandboxState::Ready);
    m.defaults = m
        .defaults
        .apply(&domain::PolicyPatch { max_commands_per_sandbox: Some(Some(1)), ..Default::default() })
        .unwrap();
    m.leases.expect_lease().returning(|_, _, want, limit, _, _| Ok(want.min(limit)));
    let pids = Arc::new(Mutex::new(10u32));
    let counter = pids.clone();
    m.driver.expect_start_process().returning(move |_, request, _| {
        let mut next = counter.lock().unwrap();
        *next += 1;
        Ok(domain::ProcessInfo {
            pid: *next,
            argv: request.argv().to_vec(),
            running: true,
            exit_code: None,
            timed_out: false,
            terminal: None,
        })
    });
    let ended = Arc::new(tokio::sync::Notify::new());
    let told = ended.clone();
    m.driver.expect_process_output().returning(move |_, _, follow| {
        assert!(follow, "the watch follows the process");
        Ok(Box::new(EndsWhenTold(told.clone())) as Box<dyn ports::OutputStream>)
    });
    (m, ended)
}

fn sleep_60() -> ProcessRequest {
    ProcessRequest::new(vec!["sleep".into(), "60".into()], Vec::new(), None).unwrap()
}

/// Starts processes until one starts (the place given back is seen within a second).
async fn start_once_free(deps: &LaneDeps) -> Result<domain::ProcessInfo, OperationError> {
    let actor = actor(CallerClass::Service);
    let mut got = Err(OperationError::Invalid(String::new()));
    for _ in 0..100 {
        got = start_process(deps, &actor, &org(), &sandbox(), &sleep_60()).await;
        if got.is_ok() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    got
}

fn is_busy(got: &Result<domain::ProcessInfo, OperationError>) -> bool {
    matches!(got, Err(OperationError::Busy(crate::usecase::CommandRefusal::Sandbox { limit: 1, .. })))
}

#[tokio::test]
async fn a_background_process_holds_its_place_in_the_command_quota_until_it_ends() {
    let (m, ended) = one_place();
    let deps = m.deps();
    let actor = actor(CallerClass::Service);
    let first = start_process(&deps, &actor, &org(), &sandbox(), &sleep_60()).await;
    assert_eq!(first.map(|p| p.pid), Ok(11), "the first takes the sandbox's one place");
    let second = start_process(&deps, &actor, &org(), &sandbox(), &sleep_60()).await;
    assert!(is_busy(&second), "while it runs, its place is taken: {second:?}");
    ended.notify_one();
    let third = start_once_free(&deps).await;
    assert_eq!(third.map(|p| p.pid), Ok(12), "once it ended, its place is given back");
}

/// A caller that goes away while the supervisor starts the program: the program runs all
/// the same (the supervisor started it before it answered), so its place in the command
/// quota is held until it ends, as if the caller had stayed for the answer.
#[tokio::test]
async fn a_process_whose_caller_left_during_its_start_holds_its_place_until_it_ends() {
    let (m, ended) = one_place();
    // The program starts at once; the answer takes 300 ms.
    let deps = m.deps_with_slow_start(std::time::Duration::from_millis(300));
    let actor = actor(CallerClass::Service);
    let left = tokio::time::timeout(
        std::time::Duration::from_millis(50),
        start_process(&deps, &actor, &org(), &sandbox(), &sleep_60()),
    )
    .await;
    assert!(left.is_err(), "the caller went away before the answer: {left:?}");
    // Past the answer: the process (pid 11) runs, and holds the one place.
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    let second = start_process(&deps, &actor, &org(), &sandbox(), &sleep_60()).await;
    assert!(is_busy(&second), "the process started for the caller who left holds its place: {second:?}");
    ended.notify_one();
    let third = start_once_free(&deps).await;
    assert_eq!(third.map(|p| p.pid), Ok(12), "once it ended, its place is given back");
}
