//! The `sandlane` binary: argument parsing, logging and signals around the library: `serve`
//! runs [`app::server::Server`]; the other commands open what they need through
//! [`app::compose`].

mod cli;
mod remote;
mod shell;

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use app::config::{LogFormat, Settings};
use app::server::Server;
use app::telemetry::{TraceIdLayer, Traces};
use clap::Parser;
use cli::{
    AuditCommand, CallerCommand, Cli, Command, ConfigCommand, HostCommand, KeysCommand, OrgCommand,
    SecretCommand, ShowFormat,
};
use domain::CallerIdentity;
use ports::{Clock, SystemClock};
use tracing::info;
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    // Before anything is created: keys, the database and sandbox state are private.
    adapters::datadir::restrict_umask();
    let cli = Cli::parse();
    let env: HashMap<String, String> = std::env::vars().filter(|(k, _)| k.starts_with("SANDLANE_")).collect();
    let (mut settings, sources) = match Settings::load_with_sources(cli.config.as_deref(), &env) {
        Ok(loaded) => loaded,
        Err(e) => {
            eprintln!("sandlane: {e}");
            return ExitCode::from(2);
        }
    };
    // Shown as configured, before anything touches the data dir.
    if let Command::Config(ConfigCommand::Show { format }) = cli.command {
        match format {
            ShowFormat::Toml => print!("{}", settings.to_annotated_toml(&sources)),
            ShowFormat::Json => println!("{:#}", settings.to_json_with_sources(&sources)),
        }
        return ExitCode::SUCCESS;
    }
    // A client of a running server: nothing local is touched.
    if let Command::Sandbox(command) = cli.command {
        return remote::run(command, &settings);
    }
    // The host's, not a data dir's: nothing of a data dir is touched.
    if let Command::Host(command) = cli.command {
        return host(command, &settings);
    }
    // Absolute from here on, so no driver or bind ever sees a relative path; and private.
    settings.data_dir = match adapters::datadir::prepare(&settings.data_dir) {
        Ok(dir) => dir,
        Err(e) => {
            eprintln!("sandlane: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sandlane: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    // The exporter's batch processor runs on the runtime: built inside it.
    let traces = match runtime.block_on(async { init_logging(&settings) }) {
        Ok(traces) => traces,
        Err(e) => {
            eprintln!("sandlane: {e}");
            return ExitCode::from(2);
        }
    };
    let code = match runtime.block_on(run(cli.command, settings)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("sandlane: {e:#}");
            ExitCode::from(2)
        }
    };
    if let Some(traces) = traces {
        // What is buffered is sent; the processor's task needs the runtime to do it.
        let _ = runtime.block_on(async move { tokio::task::spawn_blocking(move || traces.shutdown()).await });
    }
    code
}

/// Logging to stderr (human or JSON lines, each with its request's `trace_id`), and the
/// OTLP exporter's layer when `otlp.endpoint` is set (none is built otherwise).
fn init_logging(settings: &Settings) -> Result<Option<Traces>, app::telemetry::TelemetryError> {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let traces = Traces::build(&settings.otlp)?;
    let fmt = if settings.log_format == LogFormat::Json {
        tracing_subscriber::fmt::layer()
            .event_format(app::telemetry::JsonLog)
            .fmt_fields(app::telemetry::json_fields())
            .with_writer(std::io::stderr)
            .boxed()
    } else {
        tracing_subscriber::fmt::layer().with_writer(std::io::stderr).boxed()
    };
    let otel = traces.as_ref().map(Traces::layer);
    tracing_subscriber::registry().with(filter).with(TraceIdLayer).with(fmt).with(otel).init();
    Ok(traces)
}

async fn run(command: Command, settings: Settings) -> anyhow::Result<ExitCode> {
    match command {
        Command::Serve => serve(settings).await,
        Command::Caller(c) => caller(c, settings).await,
        Command::Org(c) => org(c, settings).await,
        Command::Secret(c) => secret(c, settings).await,
        Command::Keys(KeysCommand::Rotate) => {
            let keys = app::compose::open_keys(&settings, Arc::new(SystemClock))?;
            let kid = keys.rotate().context("cannot rotate the signing key")?;
            println!("{kid}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Config(_) => unreachable!("`config show` is answered before the runtime starts"),
        Command::Sandbox(_) => unreachable!("`sandbox` commands are answered before the runtime starts"),
        Command::Host(_) => unreachable!("`host` commands are answered before the runtime starts"),
        Command::Audit(AuditCommand::Verify) => {
            let store = app::compose::open_store(&settings, false).await?;
            let report = store.audit().verify().await.context("cannot read the audit log")?;
            store.close().await;
            match report.first_bad {
                None => {
                    println!(
                        "audit log intact: {} rows, {} seals, {} rows not yet sealed",
                        report.rows, report.seals, report.unsealed
                    );
                    Ok(ExitCode::SUCCESS)
                }
                Some(bad) => {
                    println!("audit log tampered: {}: {}", bad.record, bad.reason);
                    Ok(ExitCode::from(1))
                }
            }
        }
    }
}

async fn caller(command: CallerCommand, settings: Settings) -> anyhow::Result<ExitCode> {
    let store = app::compose::open_store(&settings, true).await?;
    let callers = store.callers();
    let now = SystemClock.now();
    let result = match command {
        CallerCommand::Add(add) => {
            let identity = CallerIdentity::from_wire(add.id, add.class, add.orgs, add.name)?;
            let key = callers.add(&identity, now).await?;
            println!("{}", key.expose());
            Ok(ExitCode::SUCCESS)
        }
        CallerCommand::List => {
            for entry in callers.list().await? {
                let i = &entry.identity;
                let orgs: Vec<_> = i.orgs().iter().map(ToString::to_string).collect();
                println!(
                    "{}\t{}\t{}\t{}\t{}",
                    i.identity_id(),
                    i.class(),
                    orgs.join(","),
                    entry.created_at,
                    entry.revoked_at.map_or_else(|| "active".to_owned(), |t| format!("revoked {t}"))
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        CallerCommand::Revoke { id } => {
            callers.revoke(&id, now).await?;
            println!("revoked {id}");
            Ok(ExitCode::SUCCESS)
        }
    };
    store.close().await;
    result
}

/// `sandlane org set|show`: prints the org's effective policy as JSON.
async fn org(command: OrgCommand, settings: Settings) -> anyhow::Result<ExitCode> {
    let store = app::compose::open_store(&settings, true).await?;
    let policies = app::compose::open_policies(&settings, &store)?;
    let result = match command {
        OrgCommand::Set(set) => {
            let patch = set.patch()?;
            let webhook = set.webhook();
            if patch.is_empty() && webhook.is_none() {
                store.close().await;
                anyhow::bail!("nothing to change: give at least one flag (see `sandlane org set --help`)");
            }
            let policy = if patch.is_empty() {
                Ok(None)
            } else {
                app::usecase::set_org_policy(&policies, &set.org, &patch, SystemClock.now())
                    .await
                    .map(Some)
                    .map_err(anyhow::Error::from)
            };
            match (policy, webhook) {
                (Ok(policy), Some(change)) => {
                    let deps = app::compose::open_webhooks(&settings, &store);
                    let changed = match change {
                        cli::WebhookChange::Set(url) => {
                            app::usecase::webhooks::set_webhook(&deps, &set.org, &url)
                                .await
                                .map(Some)
                                .map_err(anyhow::Error::from)
                        }
                        cli::WebhookChange::Remove => {
                            let removed = app::usecase::webhooks::remove_webhook(&deps, &set.org).await;
                            match removed {
                                Ok(had) => {
                                    eprintln!(
                                        "{}",
                                        if had { "webhook removed" } else { "the org had no webhook" }
                                    );
                                    Ok(None)
                                }
                                Err(e) => Err(anyhow::Error::from(e)),
                            }
                        }
                    };
                    changed.map(|secret| (policy, secret))
                }
                (policy, None) => policy.map(|p| (p, None)),
                (Err(e), Some(_)) => Err(e),
            }
        }
        OrgCommand::Show { org } => app::usecase::show_org_policy(&policies, &org)
            .await
            .map(|p| (Some(p), None))
            .map_err(anyhow::Error::from),
    };
    store.close().await;
    let (policy, secret) = result?;
    if let Some(policy) = policy {
        println!("{:#}", serde_json::to_value(app::http::policy::PolicyBody::from(&policy))?);
    }
    if let Some(secret) = secret {
        // Shown once: the server keeps it sealed and never prints it again.
        println!("{}", secret.expose());
    }
    Ok(ExitCode::SUCCESS)
}

/// `sandlane secret set|list|delete|rotate-key`, as the operator (the server's own caller,
/// who manages every secret); values are read from standard input and never printed.
async fn secret(command: SecretCommand, settings: Settings) -> anyhow::Result<ExitCode> {
    use domain::broker::SecretScope;
    use std::io::Read as _;

    let composition = app::compose::open_operator(&settings).await?;
    let (store, deps) = (&composition.0, &composition.1);
    let operator = domain::Actor::Caller(CallerIdentity::internal());
    let result = async {
        match command {
            SecretCommand::Set(set) => {
                let scope = match (set.identity, set.class, set.org_scope) {
                    (Some(id), None, false) => SecretScope::Identity(id),
                    (None, Some(class), false) => SecretScope::class(class)?,
                    (None, None, true) => SecretScope::Org,
                    _ => anyhow::bail!("give exactly one of --identity, --class or --org"),
                };
                let mut value = String::new();
                std::io::stdin()
                    .read_to_string(&mut value)
                    .context("cannot read the value from standard input")?;
                let value =
                    value.strip_suffix('\n').map(|v| v.strip_suffix('\r').unwrap_or(v)).unwrap_or(&value);
                let request = app::usecase::SecretRequest {
                    value: domain::SecretValue::new(value),
                    hosts: set.hosts,
                    header: set.header,
                    format: set.format,
                    scope,
                    methods: set.methods,
                    paths: set.paths,
                };
                let (_, entry) =
                    app::usecase::set_secret(deps, &operator, &set.org, &set.name, request).await?;
                println!("{:#}", serde_json::to_value(app::http::secrets::SecretBody::from(&entry))?);
            }
            SecretCommand::List { org } => {
                let entries = app::usecase::list_secrets(deps, &operator, &org).await?;
                let body: Vec<_> = entries.iter().map(app::http::secrets::SecretBody::from).collect();
                println!("{:#}", serde_json::to_value(body)?);
            }
            SecretCommand::Delete { org, name } => {
                app::usecase::delete_secret(deps, &operator, &org, &name).await?;
                println!("deleted {name}");
            }
            SecretCommand::RotateKey => {
                let rotation =
                    store.secret_store().rotate_key().await.context("cannot rotate the secret key")?;
                println!("{}", rotation.key_id);
                eprintln!(
                    "sealed {} values again; removed old keys: {}",
                    rotation.resealed,
                    if rotation.removed.is_empty() { "none".to_owned() } else { rotation.removed.join(" ") }
                );
            }
        }
        Ok(ExitCode::SUCCESS)
    }
    .await;
    store.close().await;
    result
}

/// `sandlane host reap [--dry-run]`: prints one line per host uid ended (or that would
/// be) and per sandbox root removed; exit status 1 when something could not be ended, 2
/// when nothing could be looked at (not root, no host directory access).
fn host(command: HostCommand, settings: &Settings) -> ExitCode {
    let HostCommand::Reap { dry_run } = command;
    let config = adapters::bwrap::BwrapConfig::from_settings(&settings.bwrap, &settings.data_dir, None);
    let reaped = match adapters::bwrap::reap_host(&config, dry_run) {
        Ok(reaped) => reaped,
        Err(e) => {
            eprintln!("sandlane: host reap: {e}");
            return ExitCode::from(2);
        }
    };
    let (end, release, remove) = if dry_run {
        ("would end", "would release", "would remove")
    } else {
        ("ended", "released", "removed")
    };
    for s in &reaped.uids {
        let whose = if s.identity.is_empty() {
            String::new()
        } else {
            format!("{} of {}: ", s.identity, s.data_dir.display())
        };
        if s.processes == 0 {
            println!("{release} host uid {} (no process; {whose}{})", s.uid, s.why);
        } else {
            println!("{end} host uid {}: {} processes ({whose}{})", s.uid, s.processes, s.why);
        }
    }
    for r in &reaped.roots {
        println!(
            "{remove} sandbox root {} (its data dir {} is gone)",
            r.root.display(),
            r.data_dir.display()
        );
    }
    for f in &reaped.failures {
        eprintln!("sandlane: host reap: {f}");
    }
    if reaped.uids.is_empty() && reaped.roots.is_empty() && reaped.failures.is_empty() {
        println!("nothing to reap");
    }
    if reaped.failures.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) }
}

async fn serve(settings: Settings) -> anyhow::Result<ExitCode> {
    raise_open_files_limit();
    Server::build(settings).await?.run_until(shutdown_signal()).await?;
    Ok(ExitCode::SUCCESS)
}

/// Raises the soft limit of open files to the hard one, as servers do (a login's soft limit
/// is often 1024): the HTTP listener's default cap on connections is a share of it, and
/// every sandbox's egress and supervisor connections take descriptors too. Said in the log
/// when it cannot.
#[allow(unsafe_code)]
fn raise_open_files_limit() {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the struct it is given, which lives on this stack.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) } != 0
        || limit.rlim_cur >= limit.rlim_max
    {
        return;
    }
    let raised = libc::rlimit { rlim_cur: limit.rlim_max, rlim_max: limit.rlim_max };
    // SAFETY: setrlimit reads the struct it is given and changes this process's limit.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raw const raised) } != 0 {
        tracing::warn!(soft = limit.rlim_cur, hard = limit.rlim_max, error = %std::io::Error::last_os_error(),
            "cannot raise the open-files limit to its hard limit");
    }
}

/// Completes on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        () = ctrl_c => info!("Ctrl-C received"),
        () = term => info!("SIGTERM received"),
    }
}
