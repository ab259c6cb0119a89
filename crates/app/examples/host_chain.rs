//! How a host server composes sandlane's ensure steps into its own create chain.
//!
//! The host has a create chain for agent executions (validate, persist, …). It builds the
//! lane's dependencies from real adapters once, then plugs `EnsureSessionSandboxStep` into
//! the chain. The step receives the chain's whole `CallerIdentity` and hands the ensure
//! body only the `SandboxCaller` cut from it. Run it with
//! `cargo run -p app --example host_chain` (needs bubblewrap; the data lives in a temp dir).

use std::sync::Arc;

use adapters::bwrap::{BwrapConfig, BwrapDriver};
use adapters::jwt::{JwtConfig, JwtMinter, KeyStore};
use adapters::sql::Store;
use app::usecase::{CommandGate, LaneDeps, Policies};
use app::{CreateContext, CreateStep, EnsureSessionSandboxStep, StepError};
use async_trait::async_trait;
use domain::{
    AgentExecution, CallerClass, CallerIdentity, DurabilityPolicy, ExecutionId, IdentityId, OrgId, OrgPolicy,
    Phase, SessionId,
};
use ports::{Clock, StaticLane, SystemClock};

/// The host's own first step: refuse executions of orgs the caller cannot act in.
struct Authorize;

#[async_trait]
impl CreateStep<AgentExecution> for Authorize {
    fn name(&self) -> &'static str {
        "authorize"
    }
    async fn run(&self, ctx: &mut CreateContext<AgentExecution>) -> Result<(), StepError> {
        if ctx.caller_identity.may_act_in(&ctx.new_state.org) {
            Ok(())
        } else {
            Err(StepError::Unavailable(format!("caller may not act in {}", ctx.new_state.org)))
        }
    }
}

/// The host's last step: mark the execution as started.
struct Start;

#[async_trait]
impl CreateStep<AgentExecution> for Start {
    fn name(&self) -> &'static str {
        "start"
    }
    async fn run(&self, ctx: &mut CreateContext<AgentExecution>) -> Result<(), StepError> {
        ctx.new_state.phase = Phase::InProgress;
        Ok(())
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let data = std::env::temp_dir().join(format!("sandlane-host-example-{}", std::process::id()));
    std::fs::create_dir_all(&data)?;

    // Built once, at the host's start-up: the host's composition root.
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let store = Store::connect(None, &data).await?;
    let keys = Arc::new(KeyStore::load_or_create(&data, clock.clone())?);
    let minter = Arc::new(JwtMinter::new(
        JwtConfig::default(),
        keys,
        store.registry(),
        store.callers(),
        clock.clone(),
    )?);
    let deps = Arc::new(LaneDeps {
        lane: Arc::new(StaticLane(true)),
        minter,
        driver: Arc::new(BwrapDriver::new(BwrapConfig::new(&data))?),
        registry: store.registry(),
        audit: store.audit(),
        clock: clock.clone(),
        policy: DurabilityPolicy::default(),
        replica_id: "host-example".into(),
        lease_ms: 60_000,
        wait_poll_ms: 5,
        ensure_deadline: std::time::Duration::from_secs(30),
        directory: store.callers(),
        // The org policies (lane per org and kind, quotas, timeouts, warm pools) with the
        // built-in defaults; a host sets its own defaults here.
        policies: Arc::new(Policies::new(store.policies(), OrgPolicy::builtin())),
        activity: Arc::default(),
        commands: Arc::new(CommandGate::new(store.leases(), clock, "host-example")),
    });

    // The host's chain with the lane's step composed in.
    let chain: Vec<Box<dyn CreateStep<AgentExecution>>> =
        vec![Box::new(Authorize), Box::new(EnsureSessionSandboxStep::new(deps.clone())), Box::new(Start)];

    // One request, as the host's transport would hand it over.
    let org = OrgId::parse("acme")?;
    let caller = CallerIdentity::from_wire(
        IdentityId::parse("user-ada")?,
        CallerClass::User,
        vec![org.clone()],
        None,
    )?;
    let execution = AgentExecution {
        org,
        session_id: SessionId::parse("session-1")?,
        execution_id: ExecutionId::parse("exec-1")?,
        phase: Phase::Pending,
    };
    let mut ctx = CreateContext::new(execution, caller);
    for step in &chain {
        step.run(&mut ctx).await?;
        println!("step {:<24} ok", step.name());
    }
    println!("execution {} is {}", ctx.new_state.execution_id, ctx.new_state.phase);
    for warning in &ctx.warnings {
        println!("warning (non-critical): {warning}");
    }
    store.close().await;
    std::fs::remove_dir_all(&data)?;
    Ok(())
}
