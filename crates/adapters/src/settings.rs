//! What the drivers' settings share: the error naming a setting a driver cannot use.
//!
//! Each driver defines its own settings (the server's `[bwrap]`, `[container]` and `[kube]`
//! tables) beside the configuration it builds from them; the app reads them as they are.

/// A driver setting whose value the driver cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("setting {key}: {message}")]
pub struct InvalidSetting {
    /// The setting's dotted key (`bwrap.max_processes`).
    pub key: String,
    /// What is wrong.
    pub message: String,
}

impl InvalidSetting {
    /// `key`'s value is wrong: `message` says how.
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self { key: key.into(), message: message.into() }
    }

    /// The first of `limits` (dotted key, value) set to 0, as an error.
    ///
    /// # Errors
    /// When one is 0: "must be greater than 0".
    pub(crate) fn check_positive<'a>(
        limits: impl IntoIterator<Item = (&'a str, Option<u64>)>,
    ) -> Result<(), Self> {
        match limits.into_iter().find(|(_, value)| *value == Some(0)) {
            Some((key, _)) => Err(Self::new(key, "must be greater than 0")),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use super::InvalidSetting;
    use crate::bwrap::{BwrapConfig, BwrapSettings, Protection};
    use crate::container::{ContainerConfig, ContainerSettings, DEFAULT_DOCKER_HOST};
    use crate::kubernetes::{KubeConfig, KubeConnection, KubeSettings};

    #[test]
    fn unset_bwrap_settings_keep_the_drivers_defaults_and_set_ones_apply() {
        let defaults = BwrapConfig::new("/d");
        let unset = BwrapConfig::from_settings(&BwrapSettings::default(), "/d", None);
        assert_eq!(unset, defaults);
        let settings = BwrapSettings {
            program: "/opt/bwrap".into(),
            max_processes: Some(7),
            max_memory_bytes: Some(64 << 20),
            output_cap_bytes: Some(4096),
            seccomp: Some(false),
            host_dir: Some("/srv/host".into()),
            started_ahead: Some(0),
            required_protections: Some("userns, seccomp".into()),
            ..BwrapSettings::default()
        };
        let config = BwrapConfig::from_settings(&settings, "/d", Some("/bin/sup".into()));
        assert_eq!(config.program, PathBuf::from("/opt/bwrap"));
        assert_eq!(config.supervisor, PathBuf::from("/bin/sup"));
        assert_eq!((config.limits.processes, config.limits.memory_bytes), (7, 64 << 20));
        assert_eq!(config.limits.open_files, defaults.limits.open_files, "unset: the default");
        assert_eq!((config.output_cap_bytes, config.seccomp, config.started_ahead), (4096, false, 0));
        assert_eq!(config.host_dir, PathBuf::from("/srv/host"));
        assert_eq!(config.required_protections, Some(vec![Protection::UserNamespaces, Protection::Seccomp]));
    }

    #[test]
    fn bad_bwrap_settings_are_named() {
        let bad = |s: BwrapSettings| s.validate().unwrap_err();
        assert_eq!(
            bad(BwrapSettings { max_cpu_secs: Some(0), ..Default::default() }),
            InvalidSetting::new("bwrap.max_cpu_secs", "must be greater than 0")
        );
        assert_eq!(
            bad(BwrapSettings { host_dir: Some("rel".into()), ..Default::default() }).key,
            "bwrap.host_dir"
        );
        let e = bad(BwrapSettings { required_protections: Some("userns,nope".into()), ..Default::default() });
        assert!(e.key == "bwrap.required_protections" && e.message.contains("\"nope\""), "{e}");
        assert_eq!(bad(BwrapSettings { program: PathBuf::new(), ..Default::default() }).key, "bwrap.program");
        assert_eq!(BwrapSettings::default().validate(), Ok(()));
    }

    #[test]
    fn the_container_endpoint_is_the_setting_then_docker_host_then_the_default() {
        let with = |host: Option<&str>| ContainerSettings {
            docker_host: host.map(str::to_owned),
            image: Some("img:1".into()),
            name_prefix: Some("lane-b".into()),
        };
        let env = Some("unix:///env.sock".to_owned());
        let config = |s: &ContainerSettings, env: Option<String>| {
            ContainerConfig::from_settings(s, env, None, "/state".into()).unwrap()
        };
        assert_eq!(config(&with(Some("unix:///set.sock")), env.clone()).docker_host, "unix:///set.sock");
        assert_eq!(config(&with(Some(" ")), env.clone()).docker_host, "unix:///env.sock");
        assert_eq!(config(&with(None), None).docker_host, DEFAULT_DOCKER_HOST);
        let c = config(&with(None), None);
        assert_eq!((c.image.as_str(), c.name_prefix.as_str()), ("img:1", "lane-b"));
        assert_eq!(c.state_dir, PathBuf::from("/state"));
        let e = ContainerConfig::from_settings(&ContainerSettings::default(), None, None, "/s".into())
            .unwrap_err();
        assert!(e.contains("SANDLANE_CONTAINER_IMAGE"), "{e}");
        let bad = ContainerSettings { name_prefix: Some("Upper".into()), ..with(None) };
        assert_eq!(bad.validate().unwrap_err().key, "container.name_prefix");
    }

    #[test]
    fn kube_settings_apply_over_the_defaults() {
        let settings = KubeSettings {
            image: Some("tools:2".into()),
            cpu_millis: Some(500),
            uid_base: Some(5000),
            start_timeout_ms: Some(1500),
            node_selector: Some("pool=sandboxes, zone = a".into()),
            tolerations: Some(r#"[{"key":"k","operator":"Exists"}]"#.into()),
            ..KubeSettings::default()
        };
        let config = KubeConfig::from_settings(&settings, KubeConnection::InCluster).unwrap();
        let defaults = KubeConfig::new(KubeConnection::InCluster, "sandlane-sandboxes", "tools:2");
        assert_eq!(config.limits.cpu_millis, 500);
        assert_eq!(config.limits.memory_bytes, defaults.limits.memory_bytes, "unset: the default");
        assert_eq!((config.pod_ids.base, config.pod_ids.span), (5000, defaults.pod_ids.span));
        assert_eq!(config.start_timeout, Duration::from_millis(1500));
        assert_eq!(config.node_selector.get("zone").map(String::as_str), Some("a"));
        assert_eq!(config.tolerations[0].key.as_deref(), Some("k"));
        let unset = KubeConfig::from_settings(
            &KubeSettings { image: Some("tools:2".into()), ..Default::default() },
            KubeConnection::InCluster,
        );
        assert_eq!(unset, Ok(defaults));
        let e = KubeConfig::from_settings(&KubeSettings::default(), KubeConnection::InCluster).unwrap_err();
        assert!(e.contains("SANDLANE_KUBE_IMAGE"), "{e}");
        let bad = KubeSettings { tmp_size_bytes: Some(0), ..KubeSettings::default() };
        assert_eq!(bad.validate().unwrap_err().key, "kube.tmp_size_bytes");
        let bad = KubeSettings { node_selector: Some("nokey".into()), ..KubeSettings::default() };
        assert_eq!(bad.validate().unwrap_err().key, "kube.node_selector");
    }
}
