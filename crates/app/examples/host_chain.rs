//! How a host server composes sandlane's ensure steps into its own create chain.
//!
//! The host has a create chain for agent executions (validate, persist, …). It builds the
//! lane's dependencies once through sandlane's composition root (`app::compose`), then plugs `EnsureSessionSandboxStep` into
//! the chain. The step receives the chain's whole `CallerIdentity` and hands the ensure
//! body only the `SandboxCaller` cut from it. Run it with
//! `cargo run -p app --example host_chain` (needs bubblewrap; the data lives in a temp dir).

use app::compose::Composition;
use app::config::Settings;
use app::{CreateContext, CreateStep, EnsureSessionSandboxStep, StepError};
use async_trait::async_trait;
use domain::{AgentExecution, CallerClass, CallerIdentity, ExecutionId, IdentityId, OrgId, Phase, SessionId};

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
    adapters::datadir::restrict_umask();

    // Built once, at the host's start-up, from sandlane's settings (defaults, then
    // SANDLANE_* variables): the lane's composition root builds every adapter.
    let env = std::env::vars().filter(|(k, _)| k.starts_with("SANDLANE_")).collect();
    let mut settings = Settings::load(None, &env)?;
    settings.data_dir = adapters::datadir::prepare(&data)?;
    // Sandboxes run `sandlane-supervisor` as their supervisor, looked for beside the
    // running program; this example lives in `examples/`, so it names it (built by cargo).
    if settings.supervisor_program.is_none() {
        let exe = std::env::current_exe()?;
        settings.supervisor_program =
            exe.parent().and_then(|d| d.parent()).map(|d| d.join(supervisor::PROGRAM));
    }
    let Composition { store, state, .. } = app::compose::compose(&settings).await?;
    let deps = state.deps.clone();

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
    // The example's own clean-up: the host moves the execution to FAILED, which
    // deprovisions its sandbox (a resident sandbox outlives the process otherwise).
    let internal = domain::Actor::Caller(CallerIdentity::internal());
    app::usecase::apply_phase_move(&deps, &ctx.new_state, Phase::InProgress, Phase::Failed, &internal)
        .await?;
    store.close().await;
    std::fs::remove_dir_all(&data)?;
    Ok(())
}
