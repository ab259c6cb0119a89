use super::*;

fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

fn temp_file(text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sandlane.toml");
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

#[test]
fn defaults_are_the_embedded_setup() {
    let (s, sources) = Settings::load_with_sources(None, &HashMap::new()).unwrap();
    assert_eq!(s, Settings::default());
    assert_eq!(s.driver, DriverKind::Bubblewrap);
    assert!(s.lane_enabled);
    assert_eq!(s.listen, "127.0.0.1:7878".parse().unwrap());
    assert_eq!(s.database_url, None, "SQLite in the data dir");
    assert_eq!(s.policy(), DurabilityPolicy::default());
    assert!(sources.values().all(|v| *v == SettingSource::Default), "{sources:?}");
    // Every setting is known, optional ones included.
    for key in ["listen", "http.request_timeout_ms", "bwrap.max_processes", "container.docker_host"] {
        assert_eq!(sources.get(key), Some(&SettingSource::Default), "{key}");
    }
}

#[test]
fn file_then_env_override_with_sources() {
    let (_dir, path) = temp_file(
        "listen = \"127.0.0.1:9000\"\nlane_enabled = false\n[token]\nttl_secs = 600\n[durability]\nservice = \"durable\"\n",
    );
    let (s, sources) = Settings::load_with_sources(
        Some(&path),
        &env(&[("SANDLANE_LISTEN", "127.0.0.1:9001"), ("SANDLANE_HTTP__REQUEST_TIMEOUT_MS", "45000")]),
    )
    .unwrap();
    assert_eq!(s.listen, "127.0.0.1:9001".parse().unwrap(), "env beats the file");
    assert!(!s.lane_enabled, "the file beats the default");
    assert_eq!(s.token.ttl_secs, 600);
    assert_eq!(s.http.request_timeout_ms, 45_000, "nested keys by variable");
    assert_eq!(s.policy().service, Durability::Durable);
    assert_eq!(sources["listen"], SettingSource::Env("SANDLANE_LISTEN".into()));
    assert_eq!(
        sources["http.request_timeout_ms"],
        SettingSource::Env("SANDLANE_HTTP__REQUEST_TIMEOUT_MS".into())
    );
    assert_eq!(sources["lane_enabled"], SettingSource::File(path.clone()));
    assert_eq!(sources["token.ttl_secs"], SettingSource::File(path.clone()));
    assert_eq!(sources["token.issuer"], SettingSource::Default);
    let s = Settings::load(Some(&path), &env(&[("SANDLANE_LANE_ENABLED", "true")])).unwrap();
    assert!(s.lane_enabled);
}

#[test]
fn every_setting_has_a_variable() {
    let defaults = Settings::default().flattened();
    assert!(defaults.len() >= 25, "{defaults:?}");
    for key in defaults.keys() {
        let value = match key.as_str() {
            "listen" => "127.0.0.1:1",
            "driver" => "container",
            "log_format" => "json",
            "database_url" => "postgres://u:p@h/db",
            "lane_enabled" => "false",
            "durability.user" => "ephemeral",
            k if k.starts_with("durability.") => "durable",
            "token.ttl_secs" => "600",
            "http.body_limit_bytes" => "4096",
            "http.request_timeout_ms" => "90000",
            "http.ensure_deadline_ms" => "1000",
            "bwrap.seccomp" => "false",
            "bwrap.required_protections" => "userns,seccomp",
            "bwrap.started_ahead" | "bwrap.forks_ahead" => "3",
            "bwrap.host_dir" => "/srv/sandlane-host",
            "kube.seccomp" => "false",
            "kube.node_selector" => "pool=sandboxes",
            "kube.tolerations" => r#"[{"key":"sandboxes","operator":"Exists"}]"#,
            "kube.cpu_millis" | "kube.supervisor_port" | "kube.uid_base" | "kube.uid_span" => "7",
            "policy.lane_session" | "policy.lane_workflow" => "false",
            "policy.idle_timeout" | "policy.max_lifetime" => "90s",
            "policy.workspace_bytes" => "64MiB",
            "policy.warm_pool" => "3",
            "policy.egress_allow" => "pypi.org:443",
            "policy.snapshot_bytes" => "64MiB",
            // At least the process buffer (1 MiB by default).
            "streams.max_buffered_bytes" => "2000000",
            // The burst stays within the cap (10 and 100 by default).
            "egress.audit_burst" => "7",
            "egress.audit_sandbox_cap" => "70",
            "otlp.endpoint" => "http://collector:4318",
            "webhooks.allow_private" => "true",
            // Within the lease (30 s) and the backoff's cap (600 s).
            "webhooks.timeout_ms" | "webhooks.backoff_initial_ms" => "7",
            "webhooks.lease_ms" => "70000",
            "webhooks.backoff_max_ms" => "70000",
            k if k.contains("secs") || k.contains("ms") || k.contains("max_") || k.contains("bytes") => "7",
            _ => "x",
        };
        let var = env_var(key);
        let (s, sources) = Settings::load_with_sources(None, &env(&[(var.as_str(), value)]))
            .unwrap_or_else(|e| panic!("{var}={value}: {e}"));
        assert_eq!(sources[key], SettingSource::Env(var.clone()), "{var}");
        assert_ne!(s.flattened()[key], defaults[key], "{var} changed nothing");
    }
}

#[test]
fn the_documented_short_variables_keep_working() {
    let s = Settings::load(
        None,
        &env(&[
            ("SANDLANE_DATA_DIR", "/srv/sandlane"),
            ("SANDLANE_DATABASE_URL", "postgres://sandlane:hunter2@db/sandlane"),
            ("SANDLANE_DRIVER", "bwrap"),
            ("SANDLANE_LANE_ENABLED", "off"),
            ("SANDLANE_BWRAP", "/opt/bwrap"),
            ("SANDLANE_LOG_FORMAT", "json"),
            ("SANDLANE_DOCKER_HOST", "unix:///run/podman.sock"),
            ("SANDLANE_CONTAINER_IMAGE", "sandbox:1"),
            ("SANDLANE_CONTAINER_PREFIX", "lane-b"),
            ("SANDLANE_KUBE_API_URL", "https://k8s.example:6443"),
            ("SANDLANE_KUBE_TOKEN_FILE", "/run/token"),
            ("SANDLANE_KUBE_CA_FILE", "/run/ca.pem"),
            ("SANDLANE_KUBE_NAMESPACE", "lanes"),
            ("SANDLANE_KUBE_IMAGE", "tools:2"),
            // Not settings: the sandbox environment's and the test harness's variables.
            ("SANDLANE_TOKEN_FILE", "/run/sandlane/token"),
            ("SANDLANE_TEST_POSTGRES_URL", "postgres://x"),
        ]),
    )
    .unwrap();
    assert_eq!(s.data_dir, PathBuf::from("/srv/sandlane"));
    assert_eq!(
        s.database_url.as_ref().map(DatabaseUrl::expose),
        Some("postgres://sandlane:hunter2@db/sandlane")
    );
    assert_eq!(s.driver, DriverKind::Bubblewrap);
    assert!(!s.lane_enabled);
    assert_eq!(s.bwrap.program, PathBuf::from("/opt/bwrap"));
    assert_eq!(s.log_format, LogFormat::Json);
    assert_eq!(s.container.docker_host.as_deref(), Some("unix:///run/podman.sock"));
    assert_eq!(s.container.image.as_deref(), Some("sandbox:1"));
    assert_eq!(s.container.name_prefix.as_deref(), Some("lane-b"));
    assert_eq!(s.kube.api_url.as_deref(), Some("https://k8s.example:6443"));
    assert_eq!(s.kube.token_file.as_deref(), Some(std::path::Path::new("/run/token")));
    assert_eq!(s.kube.ca_file.as_deref(), Some(std::path::Path::new("/run/ca.pem")));
    assert_eq!(s.kube.namespace, "lanes");
    assert_eq!(s.kube.image.as_deref(), Some("tools:2"));
    // The variable's own name wins over the alias; an empty variable is unset.
    let s = Settings::load(
        None,
        &env(&[("SANDLANE_BWRAP", "/a"), ("SANDLANE_BWRAP__PROGRAM", "/b"), ("SANDLANE_DATABASE_URL", "")]),
    )
    .unwrap();
    assert_eq!(s.bwrap.program, PathBuf::from("/b"));
    assert_eq!(s.database_url, None);
}

#[test]
fn bad_values_name_the_setting_and_its_source() {
    for (name, value) in [
        ("SANDLANE_LANE_ENABLED", "maybe"),
        ("SANDLANE_LISTEN", "localhost"),
        ("SANDLANE_DRIVER", "firecracker"),
        ("SANDLANE_DATABASE_URL", "mysql://x"),
        ("SANDLANE_LOG_FORMAT", "xml"),
        ("SANDLANE_TOKEN__TTL_SECS", "7200"),
        ("SANDLANE_HTTP__REQUEST_TIMEOUT_MS", "soon"),
        ("SANDLANE_HTTP__REQUEST_TIMEOUT", "5"),
        ("SANDLANE_CONTAINER_PREFIX", "Bad_Prefix"),
        ("SANDLANE_HTTP__ENSURE_DEADLINE_MS", "60000"),
        ("SANDLANE_EGRESS__AUDIT_SANDBOX_CAP", "10001"),
        ("SANDLANE_EGRESS__AUDIT_BURST", "101"),
    ] {
        let err = Settings::load(None, &env(&[(name, value)])).unwrap_err();
        assert!(err.to_string().contains(name), "{name}: {err}");
    }
    let (_dir, path) = temp_file("[token]\nttl_secs = 7200\n");
    let err = Settings::load(Some(&path), &HashMap::new()).unwrap_err();
    assert!(err.to_string().contains("token.ttl_secs"), "{err}");
    assert!(err.to_string().contains(&path.display().to_string()), "{err}");
    let (_dir, path) = temp_file("listen_on = \"x\"\n");
    let err = Settings::load(Some(&path), &HashMap::new()).unwrap_err();
    assert!(err.to_string().contains("listen_on"), "{err}");
    let (_dir, path) = temp_file("listen = \n");
    let err = Settings::load(Some(&path), &HashMap::new()).unwrap_err();
    assert!(err.to_string().contains(&path.display().to_string()), "{err}");
    let err = Settings::load(Some(Path::new("/nonexistent/sandlane.toml")), &HashMap::new()).unwrap_err();
    assert!(err.to_string().contains("/nonexistent/sandlane.toml"), "{err}");
}

#[test]
fn the_database_password_never_shows() {
    let url = "postgres://sandlane:hunter2@db:5432/sandlane?sslmode=disable&password=hunter2";
    let (s, sources) = Settings::load_with_sources(None, &env(&[("SANDLANE_DATABASE_URL", url)])).unwrap();
    let db = s.database_url.clone().unwrap();
    assert_eq!(db.expose(), url);
    assert_eq!(db.redacted(), "postgres://sandlane:***@db:5432/sandlane?sslmode=disable&password=***");
    for shown in [
        format!("{s:?}"),
        format!("{db}"),
        s.to_annotated_toml(&sources),
        s.to_json_with_sources(&sources).to_string(),
    ] {
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("sandlane:***@db"), "{shown}");
    }
    assert_eq!(DatabaseUrl::parse("sqlite:/x/y.db").unwrap().redacted(), "sqlite:/x/y.db");
    assert_eq!(DatabaseUrl::parse("postgres://u@h/d").unwrap().redacted(), "postgres://u@h/d");
}

#[test]
fn annotated_toml_reads_back_as_the_same_settings() {
    let (_dir, path) = temp_file("[token]\nttl_secs = 600\n");
    let (s, sources) =
        Settings::load_with_sources(Some(&path), &env(&[("SANDLANE_DRIVER", "container")])).unwrap();
    let shown = s.to_annotated_toml(&sources);
    assert!(shown.contains("driver = \"container\"  # env SANDLANE_DRIVER"), "{shown}");
    assert!(shown.contains(&format!("ttl_secs = 600  # file {}", path.display())), "{shown}");
    assert!(shown.contains("# max_processes = (unset)  # default; SANDLANE_BWRAP__MAX_PROCESSES"), "{shown}");
    let (_dir2, again) = temp_file(&shown);
    assert_eq!(Settings::load(Some(&again), &HashMap::new()).unwrap(), s);
}

#[test]
fn kube_node_selector_and_tolerations_are_checked() {
    let load = |var: &str, value: &str| Settings::load(None, &env(&[(var, value)]));
    let s = load("SANDLANE_KUBE__NODE_SELECTOR", "pool=sandboxes, zone=a").unwrap();
    assert_eq!(s.kube.node_selector_pairs().unwrap().len(), 2);
    let e = load("SANDLANE_KUBE__NODE_SELECTOR", "pool").unwrap_err().to_string();
    assert!(e.contains("kube.node_selector") && e.contains("SANDLANE_KUBE__NODE_SELECTOR"), "{e}");
    let s = load("SANDLANE_KUBE__TOLERATIONS", r#"[{"key":"k","operator":"Exists","effect":"NoSchedule"}]"#)
        .unwrap();
    assert_eq!(s.kube.toleration_list().unwrap()[0].key.as_deref(), Some("k"));
    let e = load("SANDLANE_KUBE__TOLERATIONS", "{not json").unwrap_err().to_string();
    assert!(e.contains("kube.tolerations"), "{e}");
    let e = load("SANDLANE_KUBE__MEMORY_BYTES", "0").unwrap_err().to_string();
    assert!(e.contains("kube.memory_bytes"), "{e}");
}

#[test]
fn the_default_org_policy_comes_from_the_file_and_bad_values_name_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sandlane.toml");
    std::fs::write(
        &file,
        "[policy]\nmax_sandboxes = 10\nworkspace_bytes = \"64MiB\"\nidle_timeout = \"15m\"\n\
         lane_workflow = false\negress_allow = \"pypi.org:443, *.example.com\"\n",
    )
    .unwrap();
    let s = Settings::load(Some(&file), &env(&[("SANDLANE_POLICY__WARM_POOL", "2")])).unwrap();
    let p = s.policy.policy().unwrap();
    assert_eq!(p.max_sandboxes(), Some(10));
    assert_eq!(p.workspace_bytes(), Some(64 << 20));
    assert_eq!(p.idle_timeout_ms(), Some(900_000));
    assert!(!p.lane(domain::SandboxKind::Workflow) && p.lane(domain::SandboxKind::Session));
    assert_eq!(p.warm_pool(), 2);
    assert_eq!(p.egress_allow().len(), 2);
    for (var, value, name) in [
        ("SANDLANE_POLICY__MAX_SANDBOXES", "0", "policy.max_sandboxes (SANDLANE_POLICY__MAX_SANDBOXES)"),
        (
            "SANDLANE_POLICY__WORKSPACE_BYTES",
            "64mb",
            "policy.workspace_bytes (SANDLANE_POLICY__WORKSPACE_BYTES)",
        ),
        ("SANDLANE_POLICY__IDLE_TIMEOUT", "10", "policy.idle_timeout (SANDLANE_POLICY__IDLE_TIMEOUT)"),
        ("SANDLANE_POLICY__EGRESS_ALLOW", "*.com", "policy.egress_allow (SANDLANE_POLICY__EGRESS_ALLOW)"),
    ] {
        let e = Settings::load(None, &env(&[(var, value)])).unwrap_err().to_string();
        assert!(e.starts_with(&format!("setting {name}: ")), "{e}");
    }
}

#[test]
fn the_listener_settings_and_the_default_connection_cap() {
    let s = Settings::load(
        None,
        &env(&[
            ("SANDLANE_HTTP__HEADER_TIMEOUT_MS", "1000"),
            ("SANDLANE_HTTP__IDLE_TIMEOUT_MS", "5000"),
            ("SANDLANE_HTTP__MAX_CONNECTIONS", "3000"),
        ]),
    )
    .unwrap();
    assert_eq!((s.http.header_timeout_ms, s.http.idle_timeout_ms), (1000, 5000));
    assert_eq!(s.http.effective_max_connections(1024), 3000, "a setting is taken as it is");
    let default = HttpSettings::default();
    assert_eq!(
        (default.header_timeout_ms, default.idle_timeout_ms, default.max_connections),
        (10_000, 60_000, None)
    );
    assert_eq!(default.effective_max_connections(20_000), 5_000, "a quarter of the open files");
    assert_eq!(default.effective_max_connections(100), HttpSettings::MIN_DEFAULT_CONNECTIONS);
    assert_eq!(default.effective_max_connections(u64::MAX), u32::MAX);
    for name in [
        "SANDLANE_HTTP__HEADER_TIMEOUT_MS",
        "SANDLANE_HTTP__IDLE_TIMEOUT_MS",
        "SANDLANE_HTTP__MAX_CONNECTIONS",
    ] {
        let err = Settings::load(None, &env(&[(name, "0")])).unwrap_err();
        assert!(err.to_string().contains(name) && err.to_string().contains("greater than 0"), "{err}");
    }
}
