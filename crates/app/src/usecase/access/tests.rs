//! The ownership rule through every use case that names a key or a sandbox, with every
//! kind of actor, over mocks. "Allowed" means the call got past authorisation: the next
//! port it reaches (the claim, the live lookup, the driver) is a probe that records the
//! visit and stops there. "Denied" means it reached none of them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use domain::execution::SandboxSubject;
use domain::{
    Actor, AuditOutcome, CallerClass, CallerIdentity, ExecOutput, ExecRequest, IdentityId, OrgId, SandboxId,
    SandboxState,
};
use ports::{KeyOwner, RegistryError};

use crate::test_support::*;
use crate::usecase::{
    AccessError, DeprovisionError, EnsureError, ExecError, OperationError, SessionEnsureOutcome, archive_in,
    archive_out, delete_path, deprovision_sandbox, ensure_session_sandbox_for_execution,
    ensure_workflow_sandbox_for_execution, exec_in_sandbox, exec_stream_in_sandbox, get_process, get_sandbox,
    list_processes, process_output, read_path, recover_workflow_sandbox, signal_process, start_process,
    write_file, write_process_stdin,
};

const OWNER: &str = "u-owner";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    EnsureSession,
    EnsureWorkflow,
    Recover,
    DeprovisionSession,
    Get,
    Exec,
    ExecStream,
    StartProcess,
    ListProcesses,
    GetProcess,
    ProcessOutput,
    ProcessStdin,
    SignalProcess,
    ReadPath,
    WriteFile,
    DeletePath,
    ArchiveOut,
    ArchiveIn,
}

const ROUTES: [Route; 18] = [
    Route::EnsureSession,
    Route::EnsureWorkflow,
    Route::Recover,
    Route::DeprovisionSession,
    Route::Get,
    Route::Exec,
    Route::ExecStream,
    Route::StartProcess,
    Route::ListProcesses,
    Route::GetProcess,
    Route::ProcessOutput,
    Route::ProcessStdin,
    Route::SignalProcess,
    Route::ReadPath,
    Route::WriteFile,
    Route::DeletePath,
    Route::ArchiveOut,
    Route::ArchiveIn,
];

/// The routes of what an agent does inside its sandbox, open to its own token.
fn inside(route: Route) -> bool {
    use Route::*;
    matches!(
        route,
        Exec | ExecStream
            | StartProcess
            | ListProcesses
            | GetProcess
            | ProcessOutput
            | ProcessStdin
            | SignalProcess
            | ReadPath
            | WriteFile
            | DeletePath
            | ArchiveOut
            | ArchiveIn
    )
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Who {
    Owner,
    OtherUser,
    Service,
    ServiceOfOtherOrg,
    Internal,
    OwnToken,
    TokenOfOtherSandbox,
}

const EVERYONE: [Who; 7] = [
    Who::Owner,
    Who::OtherUser,
    Who::Service,
    Who::ServiceOfOtherOrg,
    Who::Internal,
    Who::OwnToken,
    Who::TokenOfOtherSandbox,
];

/// The expected answer, written out as a table: which routes each actor may use on a key
/// (and its sandbox) owned by [`OWNER`].
fn allowed(who: Who, route: Route) -> bool {
    match who {
        Who::Owner | Who::Service | Who::Internal => true,
        Who::OtherUser | Who::ServiceOfOtherOrg | Who::TokenOfOtherSandbox => false,
        Who::OwnToken => inside(route),
    }
}

fn the_sandbox() -> SandboxId {
    SandboxId::generate(11, 11)
}

fn actor_of(who: Who) -> Actor {
    let user = |id: &str, class, org: &str| {
        Actor::Caller(
            CallerIdentity::from_wire(
                IdentityId::parse(id).unwrap(),
                class,
                vec![OrgId::parse(org).unwrap()],
                None,
            )
            .unwrap(),
        )
    };
    match who {
        Who::Owner => user(OWNER, CallerClass::User, "acme"),
        Who::OtherUser => user("u-mallory", CallerClass::User, "acme"),
        Who::Service => user("svc", CallerClass::Service, "acme"),
        Who::ServiceOfOtherOrg => user("svc", CallerClass::Service, "other"),
        Who::Internal => Actor::Caller(CallerIdentity::internal()),
        Who::OwnToken => Actor::SandboxToken {
            org: org(),
            sandbox_id: the_sandbox(),
            subject: IdentityId::parse(OWNER).unwrap(),
        },
        Who::TokenOfOtherSandbox => Actor::SandboxToken {
            org: org(),
            sandbox_id: SandboxId::generate(12, 12),
            subject: IdentityId::parse(OWNER).unwrap(),
        },
    }
}

/// Mocks where the key's owner is [`OWNER`], the sandbox exists (ready) in `acme`, and
/// every port past authorisation is a probe counting visits.
fn mocks(visits: &Arc<AtomicUsize>, denials: &Arc<Mutex<Vec<domain::AuditEvent>>>) -> Mocks {
    let mut m = Mocks::new(true);
    let owner = KeyOwner {
        identity_id: IdentityId::parse(OWNER).unwrap(),
        class: CallerClass::User,
        since: domain::Timestamp::from_unix_millis(NOW - 1),
    };
    let o = owner.clone();
    m.registry.expect_claim_owner().returning(move |_, _, _| Ok(o.clone()));
    let o = owner.clone();
    m.registry.expect_owner().returning(move |_| Ok(Some(o.clone())));
    let record = existing_ready(agent_execution().sandbox_key(), &the_sandbox());
    let r = record.clone();
    m.registry
        .expect_get_with_owner()
        .returning(move |id| Ok((id == &the_sandbox()).then(|| (r.clone(), Some(owner.clone())))));
    m.registry.expect_get().returning(move |id| Ok((id == &the_sandbox()).then(|| record.clone())));
    let v = visits.clone();
    m.registry.expect_claim().returning(move |_| {
        v.fetch_add(1, Ordering::SeqCst);
        Err(RegistryError::Store("probe: past authorisation".into()))
    });
    let v = visits.clone();
    m.registry.expect_get_live().returning(move |_| {
        v.fetch_add(1, Ordering::SeqCst);
        Err(RegistryError::Store("probe: past authorisation".into()))
    });
    let v = visits.clone();
    m.driver.expect_exec().returning(move |_, _| {
        v.fetch_add(1, Ordering::SeqCst);
        Ok(ExecOutput {
            exit_code: 0,
            stdout: b"probe".to_vec(),
            stderr: Vec::new(),
            timed_out: false,
            truncated: false,
        })
    });
    // Every operation inside the sandbox: a probe.
    fn probe<T>(v: &AtomicUsize) -> Result<T, ports::DriverError> {
        v.fetch_add(1, Ordering::SeqCst);
        Err(ports::DriverError::Failed("probe: past authorisation".into()))
    }
    let v = visits.clone();
    m.driver.expect_exec_stream().returning(move |_, _| probe(&v));
    let v = visits.clone();
    m.driver.expect_start_process().returning(move |_, _, _| probe(&v));
    let v = visits.clone();
    m.driver.expect_list_processes().returning(move |_| probe(&v));
    let v = visits.clone();
    m.driver.expect_process().returning(move |_, _| probe(&v));
    let v = visits.clone();
    m.driver.expect_process_output().returning(move |_, _, _| probe(&v));
    let v = visits.clone();
    m.driver.expect_write_stdin().returning(move |_, _, _, _| probe(&v));
    let v = visits.clone();
    m.driver.expect_signal_process().returning(move |_, _, _| probe(&v));
    let v = visits.clone();
    m.driver.expect_read_path().returning(move |_, _| probe(&v));
    let v = visits.clone();
    m.driver.expect_write_file().returning(move |_, _, _| probe(&v));
    let v = visits.clone();
    m.driver.expect_delete_path().returning(move |_, _, _| probe(&v));
    let v = visits.clone();
    m.driver.expect_archive_out().returning(move |_, _| probe(&v));
    let v = visits.clone();
    m.driver.expect_archive_in().returning(move |_, _, _| probe(&v));
    let sink = denials.clone();
    m.audit.expect_append().returning(move |e| {
        sink.lock().unwrap().push(e.clone());
        Ok(1)
    });
    m
}

/// Runs `route` as `who`; `Ok(())` when it got past authorisation, `Err` with the access
/// error otherwise.
async fn run(who: Who, route: Route) -> (Result<(), AccessError>, usize, Vec<domain::AuditEvent>) {
    let visits = Arc::new(AtomicUsize::new(0));
    let events = Arc::new(Mutex::new(Vec::new()));
    let deps = mocks(&visits, &events).deps();
    let actor = actor_of(who);
    let result = match route {
        Route::EnsureSession => {
            ensure_session_sandbox_for_execution(&deps, &actor, &agent_execution()).await.map(|o| {
                assert!(matches!(o, SessionEnsureOutcome::Failed(_)), "{o:?}");
            })
        }
        Route::EnsureWorkflow => {
            match ensure_workflow_sandbox_for_execution(&deps, &actor, &workflow_execution()).await {
                Err(EnsureError::Access(e)) => Err(e),
                other => {
                    assert!(matches!(other, Err(EnsureError::Provisioning(_))), "{other:?}");
                    Ok(())
                }
            }
        }
        Route::Recover => match recover_workflow_sandbox(&deps, &actor, &workflow_execution()).await {
            Err(EnsureError::Access(e)) => Err(e),
            other => {
                assert!(matches!(other, Err(EnsureError::Provisioning(_))), "{other:?}");
                Ok(())
            }
        },
        Route::DeprovisionSession => {
            match deprovision_sandbox(&deps, &actor, &agent_execution().sandbox_key()).await {
                Err(DeprovisionError::Access(e)) => Err(e),
                other => {
                    assert!(matches!(other, Err(DeprovisionError::Registry(_))), "{other:?}");
                    Ok(())
                }
            }
        }
        Route::Get => get_sandbox(&deps, &actor, &org(), &the_sandbox()).await.map(|view| {
            assert_eq!(view.id, the_sandbox());
            visits.fetch_add(1, Ordering::SeqCst);
        }),
        Route::Exec => {
            let request = ExecRequest::new(vec!["true".into()], Vec::new(), None).unwrap();
            match exec_in_sandbox(&deps, &actor, &org(), &the_sandbox(), &request).await {
                Ok(out) => {
                    assert_eq!(out.stdout, b"probe");
                    Ok(())
                }
                Err(ExecError::Access(e)) => Err(e),
                Err(other) => panic!("{other:?}"),
            }
        }
        Route::ExecStream => {
            let request = ExecRequest::new(vec!["true".into()], Vec::new(), None).unwrap();
            match exec_stream_in_sandbox(&deps, &actor, &org(), &the_sandbox(), &request).await {
                Err(ExecError::Access(e)) => Err(e),
                Err(ExecError::Driver(_)) => Ok(()),
                Err(other) => panic!("{other:?}"),
                Ok(_) => panic!("the probe fails"),
            }
        }
        other => operation(&deps, &actor, other).await,
    };
    let visited = visits.load(Ordering::SeqCst);
    let events = events.lock().unwrap().clone();
    (result, visited, events)
}

/// Runs one of the operations inside a sandbox: `Ok` when it reached the driver's probe.
async fn operation(deps: &crate::usecase::LaneDeps, actor: &Actor, route: Route) -> Result<(), AccessError> {
    let (org, id) = (org(), the_sandbox());
    let path = domain::SandboxPath::parse("/workspace/f").unwrap();
    let request = domain::ProcessRequest::new(vec!["sleep".into()], Vec::new(), None).unwrap();
    let upload = || ChunkSource::of(&[]) as Box<dyn ports::ByteSource>;
    let result = match route {
        Route::StartProcess => start_process(deps, actor, &org, &id, &request).await.map(drop),
        Route::ListProcesses => list_processes(deps, actor, &org, &id).await.map(drop),
        Route::GetProcess => get_process(deps, actor, &org, &id, 7).await.map(drop),
        Route::ProcessOutput => process_output(deps, actor, &org, &id, 7, true).await.map(drop),
        Route::ProcessStdin => write_process_stdin(deps, actor, &org, &id, 7, b"x", false).await,
        Route::SignalProcess => signal_process(deps, actor, &org, &id, 7, domain::Signal::Term).await,
        Route::ReadPath => read_path(deps, actor, &org, &id, &path).await.map(drop),
        Route::WriteFile => write_file(deps, actor, &org, &id, &path, upload(), None).await.map(drop),
        Route::DeletePath => delete_path(deps, actor, &org, &id, &path, true).await,
        Route::ArchiveOut => archive_out(deps, actor, &org, &id, &path).await.map(drop),
        Route::ArchiveIn => archive_in(deps, actor, &org, &id, &path, upload(), None).await.map(drop),
        other => panic!("{other:?} is not an operation inside"),
    };
    match result {
        Err(OperationError::Access(e)) => Err(e),
        Err(OperationError::Driver(ports::DriverError::Failed(probe)))
            if probe.to_string().starts_with("probe") =>
        {
            Ok(())
        }
        other => panic!("{route:?}: {:?}", other.map(|()| "ok")),
    }
}

#[tokio::test]
async fn every_route_with_every_kind_of_actor() {
    for route in ROUTES {
        for who in EVERYONE {
            let (result, visits, events) = run(who, route).await;
            let expected = allowed(who, route);
            assert_eq!(result.is_ok(), expected, "{who:?} on {route:?}: {result:?}");
            if expected {
                assert!(visits >= 1, "{who:?} on {route:?} was allowed but reached nothing");
            } else {
                assert_eq!(
                    visits, 0,
                    "{who:?} on {route:?} was denied but reached a port past authorisation"
                );
                let err = result.unwrap_err();
                match (route, &err) {
                    // Whoever may not read a sandbox does not learn that it exists.
                    (Route::Get, AccessError::NotFound { .. })
                        if !matches!(who, Who::OwnToken | Who::TokenOfOtherSandbox) => {}
                    (_, AccessError::Denied(_)) => {}
                    other => panic!("{who:?} on {route:?}: unexpected {other:?}"),
                }
                // A member of the org refused by the owner rule on an audited route is
                // audited; outsiders and tokens are not (they cannot flood the org's log).
                let audited_route = matches!(
                    route,
                    Route::EnsureSession | Route::EnsureWorkflow | Route::Recover | Route::DeprovisionSession
                );
                let denied_events: Vec<_> =
                    events.iter().filter(|e| e.outcome == AuditOutcome::Denied).collect();
                if audited_route && who == Who::OtherUser {
                    assert_eq!(denied_events.len(), 1, "{who:?} on {route:?}: {events:?}");
                    assert_eq!(denied_events[0].caller_id.as_str(), "u-mallory");
                    assert!(denied_events[0].message.contains("does not own"), "{:?}", denied_events[0]);
                } else {
                    assert!(denied_events.is_empty(), "{who:?} on {route:?}: {events:?}");
                }
            }
        }
    }
}

#[tokio::test]
async fn the_first_ensurer_becomes_the_owner_and_a_second_user_is_refused() {
    // Nobody owns the key: the claim records the caller; the registry answers the winner.
    let winner: Arc<Mutex<Option<KeyOwner>>> = Arc::new(Mutex::new(None));
    let mut m = Mocks::new(true);
    let w = winner.clone();
    m.registry.expect_claim_owner().returning(move |_, caller, now| {
        let mut w = w.lock().unwrap();
        Ok(w.get_or_insert_with(|| KeyOwner {
            identity_id: caller.identity_id().clone(),
            class: caller.class(),
            since: now,
        })
        .clone())
    });
    m.registry.expect_claim().returning(|_| Err(RegistryError::Store("stop here".into())));
    let events = recording_audit(&mut m.audit);
    let deps = m.deps();
    let first = ensure_session_sandbox_for_execution(&deps, &actor_of(Who::Owner), &agent_execution()).await;
    assert!(matches!(first, Ok(SessionEnsureOutcome::Failed(_))), "{first:?}");
    assert_eq!(winner.lock().unwrap().as_ref().unwrap().identity_id.as_str(), OWNER);
    let second =
        ensure_session_sandbox_for_execution(&deps, &actor_of(Who::OtherUser), &agent_execution()).await;
    assert!(matches!(second, Err(AccessError::Denied(_))), "{second:?}");
    let outcomes: Vec<_> = events.lock().unwrap().iter().map(|e| e.outcome).collect();
    assert_eq!(outcomes, vec![AuditOutcome::Failed, AuditOutcome::Denied]);
}

#[tokio::test]
async fn a_missing_sandbox_and_one_in_another_org_are_not_found() {
    let visits = Arc::new(AtomicUsize::new(0));
    let events = Arc::new(Mutex::new(Vec::new()));
    let deps = mocks(&visits, &events).deps();
    let svc = actor_of(Who::Service);
    let missing = SandboxId::generate(99, 99);
    assert!(matches!(get_sandbox(&deps, &svc, &org(), &missing).await, Err(AccessError::NotFound { .. })));
    let other_org = Actor::Caller(
        CallerIdentity::from_wire(
            IdentityId::parse("svc").unwrap(),
            CallerClass::Service,
            vec![OrgId::parse("other").unwrap()],
            None,
        )
        .unwrap(),
    );
    // The sandbox exists in acme; named under `other` it is not there.
    let got = get_sandbox(&deps, &other_org, &OrgId::parse("other").unwrap(), &the_sandbox()).await;
    assert!(matches!(got, Err(AccessError::NotFound { .. })), "{got:?}");
    let request = ExecRequest::new(vec!["true".into()], Vec::new(), None).unwrap();
    let got = exec_in_sandbox(&deps, &svc, &org(), &missing, &request).await;
    assert!(matches!(got, Err(ExecError::Access(AccessError::NotFound { .. }))), "{got:?}");
    assert_eq!(visits.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn exec_needs_a_ready_sandbox() {
    let mut m = Mocks::new(true);
    m.first_ensurer_owns(Some(OWNER));
    let mut record = existing_ready(agent_execution().sandbox_key(), &the_sandbox());
    record.state = SandboxState::Provisioning;
    m.reads_sandbox(record.clone(), Some(OWNER));
    m.registry.expect_get().returning(move |_| Ok(Some(record.clone())));
    m.driver.expect_exec().never();
    let deps = m.deps();
    let request = ExecRequest::new(vec!["true".into()], Vec::new(), None).unwrap();
    let got = exec_in_sandbox(&deps, &actor_of(Who::Owner), &org(), &the_sandbox(), &request).await;
    assert_eq!(
        got,
        Err(ExecError::NotReady { sandbox_id: the_sandbox(), state: SandboxState::Provisioning })
    );
}

#[tokio::test]
async fn an_unreadable_registry_decides_nothing() {
    let mut m = Mocks::new(true);
    m.registry
        .expect_claim_owner()
        .returning(|_, _, _| Err(RegistryError::Store("connection refused".into())));
    m.registry.expect_claim().never();
    m.driver.expect_provision().never();
    let deps = m.deps();
    let got = ensure_session_sandbox_for_execution(&deps, &actor_of(Who::Owner), &agent_execution()).await;
    assert!(matches!(got, Err(AccessError::Unavailable(_))), "{got:?}");
}
