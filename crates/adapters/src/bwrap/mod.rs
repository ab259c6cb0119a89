//! The bubblewrap sandbox driver (issue 5).
