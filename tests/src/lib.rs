//! sandlane's end-to-end test package (the tests live in `it/`), and the support every
//! test package shares: [`services`], the throwaway PostgreSQL and podman the tests run
//! against.

pub mod services;
