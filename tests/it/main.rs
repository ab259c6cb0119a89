//! End-to-end tests: the real `sandlane` binary, spawned on a free loopback port, against
//! SQLite and a real Postgres, with the real bubblewrap driver.

mod container;
mod kube;
mod lane;
mod resident;
mod streams;
mod support;
mod token;
mod trust;

/// Runs one test body against both stores.
macro_rules! on_both_stores {
    ($($module:ident :: $name:ident),* $(,)?) => {
        mod sqlite {
            $(#[test] fn $name() { crate::$module::$name(crate::support::Backend::Sqlite) })*
        }
        mod postgres {
            $(#[test] fn $name() { crate::$module::$name(crate::support::Backend::Postgres) })*
        }
    };
}

on_both_stores!(
    lane::routes_auth_and_errors,
    lane::session_lifecycle_tokens_and_audit,
    lane::durability_by_class,
    lane::postures,
    lane::lane_off,
    trust::ownership_by_route,
    trust::revoked_callers,
    trust::disconnect_mid_provision,
);

#[test]
fn kubernetes_streams_files_processes_and_a_restarted_server() {
    kube::streams_files_processes_and_a_restarted_server();
}

#[test]
fn embedded_default_is_private() {
    trust::embedded_default_is_private();
}

#[test]
fn a_killed_server_restarts_and_reattaches() {
    resident::a_killed_server_restarts_and_reattaches();
}

#[test]
fn streams_processes_and_files_on_bubblewrap() {
    streams::streams_end_to_end(streams::Driver::Bubblewrap);
}

#[test]
fn streams_processes_and_files_on_containers() {
    streams::streams_end_to_end(streams::Driver::Container);
}
