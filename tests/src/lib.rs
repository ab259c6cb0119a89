//! sandlane end-to-end test package (tests live in `it/`).
