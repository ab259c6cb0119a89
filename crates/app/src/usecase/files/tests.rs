//! A sandbox's file operations take its places on this replica: a listing or a download
//! holds one until it is read to its end (or fails, or is dropped), an upload or a delete
//! for as long as it runs; one more than the cap is refused before the driver is asked.

use std::collections::VecDeque;

use domain::execution::SandboxSubject;
use domain::{CallerClass, DirEntry, EntryKind, SandboxId, SandboxPath, SandboxState};
use ports::{DriverError, EntryStream, ReadOutcome};

use super::*;
use crate::test_support::*;
use crate::usecase::StreamLimits;

fn sandbox() -> SandboxId {
    SandboxId::generate(22, 22)
}

fn path(p: &str) -> SandboxPath {
    SandboxPath::parse(p).unwrap()
}

/// A listing of some batches.
struct Batches(VecDeque<Vec<DirEntry>>);

#[async_trait]
impl EntryStream for Batches {
    async fn next(&mut self) -> Result<Option<Vec<DirEntry>>, DriverError> {
        Ok(self.0.pop_front())
    }
}

fn entry(name: &str) -> DirEntry {
    DirEntry { name: name.into(), kind: EntryKind::File, size: 1 }
}

fn deps(limit: u32) -> LaneDeps {
    let mut m = Mocks::new(true);
    m.first_ensurer_owns(Some(CALLER_ID));
    let record = existing_ready(agent_execution().sandbox_key(), &sandbox());
    assert_eq!(record.state, SandboxState::Ready);
    m.reads_sandbox(record.clone(), Some(CALLER_ID));
    m.registry.expect_get().returning(move |_| Ok(Some(record.clone())));
    m.driver.expect_read_path().returning(|_, p| match p.relative() {
        "broken" => Err(DriverError::Failed("the supervisor broke off".into())),
        _ => Ok(ReadOutcome::Directory(Box::new(Batches(
            [vec![entry("a"), entry("b")], vec![entry("c")]].into(),
        )))),
    });
    m.driver.expect_delete_path().returning(|_, _, _| Ok(()));
    let mut deps = m.deps();
    deps.streams = StreamLimits { max_file_ops_per_sandbox: limit, ..StreamLimits::default() };
    deps
}

async fn listing(deps: &LaneDeps, p: &str) -> Result<Box<dyn EntryStream>, OperationError> {
    let actor = actor(CallerClass::Service);
    match read_path(deps, &actor, &org(), &sandbox(), &path(p)).await? {
        ReadOutcome::Directory(listing) => Ok(listing),
        other => panic!("a directory: {other:?}"),
    }
}

#[tokio::test]
async fn file_operations_are_capped_per_sandbox_while_they_go_on() {
    let deps = deps(2);
    let actor = actor(CallerClass::Service);
    let id = sandbox();
    let mut first = listing(&deps, "d").await.unwrap();
    let second = listing(&deps, "d").await.unwrap();
    assert_eq!(deps.file_ops.held(&id), 2, "a listing handed over holds its place");
    // A third operation of any kind is refused while both go on.
    let busy = |got: &Result<(), OperationError>| matches!(got, Err(OperationError::FilesBusy { limit: 2, sandbox_id }) if *sandbox_id == id);
    let got = listing(&deps, "d").await.map(drop);
    assert!(busy(&got), "{got:?}");
    let got = delete_path(&deps, &actor, &org(), &id, &path("f"), false).await;
    assert!(busy(&got), "{got:?}");
    // Read to its end, a listing gives its place back.
    let mut names = Vec::new();
    while let Some(batch) = first.next().await.unwrap() {
        names.extend(batch.into_iter().map(|e| e.name));
    }
    assert_eq!(names, ["a", "b", "c"]);
    assert_eq!(deps.file_ops.held(&id), 1);
    // An operation that runs to its end holds a place only while it runs.
    delete_path(&deps, &actor, &org(), &id, &path("f"), false).await.unwrap();
    assert_eq!(deps.file_ops.held(&id), 1);
    // A failed one gives its place back; so does a listing dropped half-way.
    let got = listing(&deps, "broken").await;
    assert!(matches!(got, Err(OperationError::Driver(DriverError::Failed(_)))), "{:?}", got.err());
    assert_eq!(deps.file_ops.held(&id), 1);
    drop(second);
    assert_eq!(deps.file_ops.held(&id), 0);
    // The places are free again.
    let _a = listing(&deps, "d").await.unwrap();
    let _b = listing(&deps, "d").await.unwrap();
    assert!(busy(&listing(&deps, "d").await.map(drop)));
}
