//! Ports.
