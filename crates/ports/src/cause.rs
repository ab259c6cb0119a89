//! [`Cause`]: the infrastructure error behind a port's error (a database's, a key file's),
//! kept whole as its `#[source]` so the chain reaches the log, and comparable by its text so
//! the ports' errors stay `PartialEq` for tests.

use std::error::Error;
use std::fmt;
use std::sync::Arc;

/// An adapter's own error, carried by a port error as its source.
#[derive(Clone)]
pub struct Cause(Arc<dyn Error + Send + Sync + 'static>);

impl Cause {
    /// Wraps an adapter's error.
    pub fn new(error: impl Error + Send + Sync + 'static) -> Self {
        Self(Arc::new(error))
    }

    /// A cause the adapter states itself (no error value below it).
    pub fn msg(text: impl Into<String>) -> Self {
        Self(Arc::new(Message(text.into())))
    }

    /// An adapter's error with what the adapter was doing: it reads `context: error`, and
    /// `error` stays whole as its source.
    pub fn context(context: impl Into<String>, error: impl Error + Send + Sync + 'static) -> Self {
        Self(Arc::new(Context { context: context.into(), error: Box::new(error) }))
    }
}

impl fmt::Debug for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl Error for Cause {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.0.source()
    }
}

/// Two causes are equal when they say the same.
impl PartialEq for Cause {
    fn eq(&self, other: &Self) -> bool {
        self.to_string() == other.to_string()
    }
}

impl Eq for Cause {}

impl From<String> for Cause {
    fn from(text: String) -> Self {
        Self::msg(text)
    }
}

impl From<&str> for Cause {
    fn from(text: &str) -> Self {
        Self::msg(text)
    }
}

#[derive(Debug)]
struct Message(String);

impl fmt::Display for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Error for Message {}

/// What [`Cause::context`] keeps.
#[derive(Debug)]
struct Context {
    context: String,
    error: Box<dyn Error + Send + Sync + 'static>,
}

impl fmt::Display for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.context, self.error)
    }
}

impl Error for Context {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(self.error.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] Inner);

    #[derive(Debug, thiserror::Error)]
    #[error("inner")]
    struct Inner;

    #[test]
    fn a_cause_keeps_its_chain_and_compares_by_text() {
        let cause = Cause::new(Outer(Inner));
        assert_eq!(cause.to_string(), "outer");
        assert_eq!(cause.source().map(ToString::to_string).as_deref(), Some("inner"));
        assert_eq!(cause, Cause::msg("outer"));
        assert_ne!(cause, Cause::msg("other"));
        assert_eq!(Cause::from("x"), Cause::msg("x".to_owned()));
    }

    #[test]
    fn a_cause_with_context_says_both_and_keeps_the_error_as_its_source() {
        let cause = Cause::context("cannot open /x", std::io::Error::other("denied"));
        assert_eq!(cause.to_string(), "cannot open /x: denied");
        let source = cause.source().unwrap();
        assert_eq!(source.to_string(), "denied");
        assert!(source.downcast_ref::<std::io::Error>().is_some(), "{source:?}");
        assert_eq!(cause, Cause::msg("cannot open /x: denied"));
    }
}
