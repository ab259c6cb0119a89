//! Adapters: the real implementations of the ports.
