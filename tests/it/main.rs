//! End-to-end tests: the real `sandlane` binary, spawned on a free loopback port, against
//! SQLite and a real Postgres, with the real bubblewrap driver.

mod anonymous;
mod broker;
mod browser;
mod console;
mod container;
mod egress;
mod files;
mod host;
mod kube;
mod lane;
mod policy;
mod preview;
mod resident;
mod secrets;
mod snapshots;
mod streams;
mod support;
mod terminals;
mod token;
mod traces;
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
    policy::two_orgs_with_different_policies,
    policy::quota_hits_follow_the_posture,
    policy::the_org_command_quota_spans_sandboxes,
    policy::an_idle_sandbox_is_suspended_and_resumed,
    policy::a_sandbox_past_its_lifetime_is_deprovisioned,
    policy::warm_sandboxes_are_adopted_and_refilled,
    policy::streams_processes_and_files_resume_and_count_as_activity,
    console::sandboxes_are_listed_a_page_at_a_time_and_the_verdict_follows_the_log,
);

#[test]
fn the_console_in_a_browser() {
    console::the_console_in_a_browser();
}

#[test]
fn kubernetes_streams_files_processes_and_a_restarted_server() {
    kube::streams_files_processes_and_a_restarted_server();
}

#[test]
fn a_write_past_the_workspace_quota_fails_inside() {
    policy::a_write_past_the_workspace_quota_fails_inside();
}

#[test]
fn streams_and_processes_take_command_places() {
    policy::streams_and_processes_take_command_places();
}

#[test]
fn file_writes_and_archives_obey_the_workspace_quota() {
    policy::file_writes_and_archives_obey_the_workspace_quota();
}

#[test]
fn a_change_on_one_replica_is_obeyed_by_another() {
    policy::a_change_on_one_replica_is_obeyed_by_another();
}

#[test]
fn a_preview_link_in_a_real_browser() {
    browser::a_preview_link_in_a_real_browser();
}

#[test]
fn preview_ports_on_bubblewrap() {
    preview::on_bubblewrap();
}

#[test]
fn preview_ports_on_containers() {
    preview::on_containers();
}

#[test]
fn a_sandbox_at_its_preview_cap() {
    preview::a_sandbox_at_its_preview_cap();
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
fn twenty_listings_of_a_big_directory_cost_the_server_little() {
    files::twenty_listings_of_a_big_directory_cost_the_server_little();
}

#[test]
fn brokered_secrets_on_bubblewrap() {
    broker::brokered_secrets_on_bubblewrap();
}

#[test]
fn brokered_secrets_on_containers() {
    broker::brokered_secrets_on_containers();
}

#[test]
fn snapshots_forks_and_restore_on_bubblewrap() {
    snapshots::snapshots_forks_and_restore(snapshots::Driver::Bubblewrap);
}

#[test]
fn snapshots_forks_and_restore_on_containers() {
    snapshots::snapshots_forks_and_restore(snapshots::Driver::Container);
}

#[test]
fn egress_on_bubblewrap() {
    egress::egress_on_bubblewrap();
}

#[test]
fn streams_processes_and_files_on_bubblewrap() {
    streams::streams_end_to_end(streams::Driver::Bubblewrap);
}

#[test]
fn streams_processes_and_files_on_containers() {
    streams::streams_end_to_end(streams::Driver::Container);
}

#[test]
fn terminals_on_bubblewrap() {
    terminals::terminals_end_to_end(terminals::Driver::Bubblewrap);
}

#[test]
fn terminals_on_containers() {
    terminals::terminals_end_to_end(terminals::Driver::Container);
}

#[test]
fn half_sent_requests_are_cut_at_the_header_timeout() {
    anonymous::half_sent_requests_are_cut_at_the_header_timeout();
}

#[test]
fn past_the_connection_cap_a_client_waits_for_a_place() {
    anonymous::past_the_connection_cap_a_client_waits_for_a_place();
}

#[test]
fn metrics_show_no_org_without_a_key_and_only_the_callers_orgs_with_one() {
    anonymous::metrics_show_no_org_without_a_key_and_only_the_callers_orgs_with_one();
}

#[test]
fn a_clone_under_a_private_home_serves() {
    host::a_clone_under_a_private_home_serves();
}

#[test]
fn a_deep_working_directory_serves() {
    host::a_deep_working_directory_serves();
}

#[test]
fn two_data_dirs_never_share_a_host_uid() {
    host::two_data_dirs_never_share_a_host_uid();
}

#[test]
fn sandboxes_of_a_data_dir_that_is_gone_are_ended() {
    host::sandboxes_of_a_data_dir_that_is_gone_are_ended();
}

#[test]
fn secret_commands_read_the_value_from_stdin_and_rotate_the_key() {
    secrets::secret_commands_read_the_value_from_stdin_and_rotate_the_key();
}

#[test]
fn secrets_through_the_api_of_the_real_server() {
    secrets::secrets_through_the_api_of_the_real_server();
}
