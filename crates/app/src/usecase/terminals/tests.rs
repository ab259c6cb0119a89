//! Terminals over mocks: what a start hands the driver (a process on a terminal, the
//! replay's buffer), and tickets: stored by digest only, good once, only for their
//! terminal and sandbox, and only while their caller is not revoked.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use domain::execution::SandboxSubject;
use domain::{
    Actor, CallerClass, ProcessInfo, SandboxId, SandboxState, TerminalId, TerminalRequest, Timestamp,
};
use ports::{TerminalTickets, TicketGrant, TicketStoreError};

use super::*;
use crate::test_support::*;

fn sandbox() -> SandboxId {
    SandboxId::generate(21, 21)
}

fn mocks() -> Mocks {
    let mut m = Mocks::new(true);
    m.first_ensurer_owns(Some(CALLER_ID));
    let record = existing_ready(agent_execution().sandbox_key(), &sandbox());
    assert_eq!(record.state, SandboxState::Ready);
    m.reads_sandbox(record.clone(), Some(CALLER_ID));
    m.registry.expect_get().returning(move |_| Ok(Some(record.clone())));
    m
}

/// The tickets in memory, as the SQL store keeps them: by digest, taken once.
#[derive(Default)]
struct Tickets(Mutex<HashMap<[u8; 32], TicketGrant>>);

#[async_trait]
impl TerminalTickets for Tickets {
    async fn insert(
        &self,
        digest: [u8; 32],
        grant: &TicketGrant,
        _: Timestamp,
    ) -> Result<(), TicketStoreError> {
        self.0.lock().unwrap().insert(digest, grant.clone());
        Ok(())
    }
    async fn take(&self, digest: [u8; 32], now: Timestamp) -> Result<Option<TicketGrant>, TicketStoreError> {
        Ok(self.0.lock().unwrap().remove(&digest).filter(|g| g.expires_at > now))
    }
}

fn terminal_process(pid: u32, id: &TerminalId) -> ProcessInfo {
    ProcessInfo {
        pid,
        argv: vec!["/bin/sh".into()],
        running: true,
        exit_code: None,
        timed_out: false,
        terminal: Some(id.clone()),
    }
}

#[tokio::test]
async fn a_terminal_is_a_process_on_a_terminal_with_the_replay_as_its_buffer() {
    let mut m = mocks();
    m.driver.expect_start_process().times(1).returning(|_, request, caps| {
        let (id, size) = request.terminal().cloned().expect("started on a terminal");
        assert_eq!((size.cols(), size.rows()), (120, 40));
        assert_eq!(caps.buffer_bytes, TERMINAL_BUFFER_BYTES);
        assert!(caps.buffer_bytes >= TERMINAL_REPLAY_BYTES);
        Ok(terminal_process(7, &id))
    });
    // The place in the command quotas is held while the process runs.
    m.driver
        .expect_process_output()
        .returning(|_, _, _| Err(DriverError::NoSuchProcess { sandbox: sandbox(), pid: 7 }));
    let deps = m.deps();
    let request = TerminalRequest::new(None, 120, 40).unwrap();
    let got =
        create_terminal(&deps, &actor(CallerClass::Service), &org(), &sandbox(), &request).await.unwrap();
    assert_eq!(got.process.pid, 7);
    assert!(got.id.as_str().starts_with("term_"));
}

#[tokio::test]
async fn a_ticket_is_kept_by_its_digest_and_is_good_once_for_its_terminal_only() {
    let (a, b) = (TerminalId::generate(1, 1), TerminalId::generate(1, 2));
    let mut m = mocks();
    let listed = vec![terminal_process(7, &a), terminal_process(8, &b)];
    m.driver.expect_list_processes().returning(move |_| Ok(listed.clone()));
    m.directory.expect_is_revoked().returning(|_| Ok(false));
    let mut deps = m.deps();
    let store = Arc::new(Tickets::default());
    deps.tickets = store.clone();
    let Actor::Caller(caller) = actor(CallerClass::User) else { unreachable!() };
    let ticket = issue_ticket(&deps, &caller, &org(), &sandbox(), &a).await.unwrap();
    assert!(ticket.ticket.starts_with(TICKET_PREFIX) && ticket.ticket.len() > 60);
    {
        let held = store.0.lock().unwrap();
        assert_eq!(held.len(), 1);
        let (digest, grant) = held.iter().next().unwrap();
        assert_eq!(digest, &domain::terminal::ticket_digest(&ticket.ticket), "only the digest is kept");
        assert_eq!(grant.identity, *caller.identity_id());
        assert_eq!(grant.expires_at, ticket.expires_at);
    }
    // Another terminal: refused, and the ticket is used up.
    let got = redeem_ticket(&deps, &ticket.ticket, &org(), &sandbox(), &b).await;
    assert!(matches!(got, Err(TicketError::Refused)), "{got:?}");
    let got = redeem_ticket(&deps, &ticket.ticket, &org(), &sandbox(), &a).await;
    assert!(matches!(got, Err(TicketError::Refused)), "{got:?}");
    // A fresh one: good once for its terminal, as its caller.
    let ticket = issue_ticket(&deps, &caller, &org(), &sandbox(), &a).await.unwrap();
    let got = redeem_ticket(&deps, &ticket.ticket, &org(), &sandbox(), &a).await.unwrap();
    let Actor::Caller(redeemed) = got else { panic!("a caller") };
    assert_eq!((redeemed.identity_id(), redeemed.class()), (caller.identity_id(), caller.class()));
    assert!(matches!(
        redeem_ticket(&deps, &ticket.ticket, &org(), &sandbox(), &a).await,
        Err(TicketError::Refused)
    ));
    // No ticket for a terminal the sandbox does not have.
    let missing = TerminalId::generate(1, 3);
    let got = issue_ticket(&deps, &caller, &org(), &sandbox(), &missing).await;
    assert!(matches!(got, Err(OperationError::NoSuchTerminal { .. })), "{got:?}");
}

#[tokio::test]
async fn a_ticket_of_a_revoked_caller_is_refused() {
    let a = TerminalId::generate(1, 1);
    let mut m = mocks();
    let listed = vec![terminal_process(7, &a)];
    m.driver.expect_list_processes().returning(move |_| Ok(listed.clone()));
    m.directory.expect_is_revoked().returning(|_| Ok(true));
    let mut deps = m.deps();
    deps.tickets = Arc::new(Tickets::default());
    let Actor::Caller(caller) = actor(CallerClass::User) else { unreachable!() };
    let ticket = issue_ticket(&deps, &caller, &org(), &sandbox(), &a).await.unwrap();
    let got = redeem_ticket(&deps, &ticket.ticket, &org(), &sandbox(), &a).await;
    assert!(matches!(got, Err(TicketError::Refused)), "{got:?}");
}

/// Output that never ends: a terminal that runs on.
struct RunsOn;

#[async_trait]
impl ports::OutputStream for RunsOn {
    async fn next(&mut self) -> Result<Option<domain::OutputEvent>, DriverError> {
        std::future::pending().await
    }
}

#[tokio::test]
async fn a_terminal_holds_a_place_in_the_command_quota_as_a_background_process_does() {
    let mut m = mocks();
    m.defaults = m
        .defaults
        .apply(&domain::PolicyPatch { max_commands_per_sandbox: Some(Some(1)), ..Default::default() })
        .unwrap();
    m.leases.expect_lease().returning(|_, _, want, limit, _, _| Ok(want.min(limit)));
    m.driver
        .expect_start_process()
        .times(1)
        .returning(|_, request, _| Ok(terminal_process(7, &request.terminal().expect("a terminal").0)));
    m.driver
        .expect_process_output()
        .returning(|_, _, _| Ok(Box::new(RunsOn) as Box<dyn ports::OutputStream>));
    let deps = m.deps();
    let actor = actor(CallerClass::Service);
    let request = TerminalRequest::new(None, 80, 24).unwrap();
    create_terminal(&deps, &actor, &org(), &sandbox(), &request)
        .await
        .expect("the first takes the one place");
    let second = create_terminal(&deps, &actor, &org(), &sandbox(), &request).await;
    assert!(
        matches!(second, Err(OperationError::Busy(crate::usecase::CommandRefusal::Sandbox { limit: 1, .. }))),
        "{second:?}"
    );
    let process = domain::ProcessRequest::new(vec!["sleep".into(), "9".into()], Vec::new(), None).unwrap();
    let third = crate::usecase::start_process(&deps, &actor, &org(), &sandbox(), &process).await;
    assert!(matches!(third, Err(OperationError::Busy(_))), "one quota for both: {third:?}");
}
