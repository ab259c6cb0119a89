//! End-to-end tests: the real `sandlane` binary, spawned on a free loopback port, against
//! SQLite and a real Postgres, with the real bubblewrap driver.

mod container;
mod lane;
mod support;
mod token;

/// Runs one test body against both stores.
macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(#[test] fn $name() { crate::lane::$name(crate::support::Backend::Sqlite) })*
        }
        mod postgres {
            $(#[test] fn $name() { crate::lane::$name(crate::support::Backend::Postgres) })*
        }
    };
}

on_both_stores!(
    routes_auth_and_errors,
    session_lifecycle_tokens_and_audit,
    durability_by_class,
    postures,
    lane_off
);
