//! End-to-end tests: the real `sandlane` binary against real stores and drivers.
