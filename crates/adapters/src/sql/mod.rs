//! The SQLite and Postgres stores (issue 4).
