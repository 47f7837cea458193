//! The ports' one error vocabulary: [`Cause`], the underlying error every broker port error
//! keeps as its `source`, whatever the port (receive, settle, send) and the same three words
//! for what the caller may do: *transient* (try again), *permanent* (do not), *lock lost*
//! (nothing can settle this delivery any more).

use std::error::Error;
use std::fmt;
use std::sync::Arc;

/// The error underneath a port error: the adapter's typed error (a Service Bus error, an AMQP
/// error, an I/O error), kept whole as the port error's `source`, or a plain text where the
/// adapter has no typed error (a timeout it measured itself, an injected test failure).
///
/// Cheap to clone (shared). Two causes are equal when they read the same, so port errors stay
/// comparable in tests.
///
/// # Examples
/// ```
/// use sb_inbox::ports::Cause;
/// let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "connection reset");
/// let cause = Cause::new(io);
/// assert_eq!(cause.to_string(), "connection reset");
/// assert!(cause.downcast_ref::<std::io::Error>().is_some());
/// assert_eq!(Cause::from("connection reset"), cause);
/// ```
#[derive(Clone)]
pub struct Cause(Arc<dyn Error + Send + Sync + 'static>);

impl Cause {
    /// Keeps `error` as the cause.
    pub fn new(error: impl Error + Send + Sync + 'static) -> Self {
        Cause(Arc::new(error))
    }

    /// A cause that is only a text.
    pub fn text(text: impl Into<String>) -> Self {
        Cause(Arc::new(Text(text.into())))
    }

    /// The typed error, if it is an `E`.
    pub fn downcast_ref<E: Error + 'static>(&self) -> Option<&E> {
        self.0.downcast_ref::<E>()
    }

    /// The underlying error.
    pub fn get_ref(&self) -> &(dyn Error + Send + Sync + 'static) {
        &*self.0
    }
}

impl fmt::Debug for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.0, f)
    }
}

impl Error for Cause {
    // Transparent: the chain goes on with the typed error's own source.
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.0.source()
    }
}

impl PartialEq for Cause {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.to_string() == other.to_string()
    }
}

impl Eq for Cause {}

impl From<&str> for Cause {
    fn from(text: &str) -> Self {
        Cause::text(text)
    }
}

impl From<String> for Cause {
    fn from(text: String) -> Self {
        Cause::text(text)
    }
}

/// A cause without a typed error.
#[derive(Debug)]
struct Text(String);

impl fmt::Display for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Error for Text {}

/// The constructors and predicates of a port error whose variants are `Transient(Cause)` and
/// `Permanent(Cause)` (receive and send errors): written once so the two read the same.
macro_rules! transient_or_permanent {
    ($error:ident) => {
        impl $error {
            /// A transient failure caused by `cause` (a typed error, or a text): trying again
            /// may succeed.
            pub fn transient(cause: impl Into<$crate::ports::Cause>) -> Self {
                $error::Transient(cause.into())
            }

            /// A permanent failure caused by `cause` (a typed error, or a text): trying again
            /// gets the same answer.
            pub fn permanent(cause: impl Into<$crate::ports::Cause>) -> Self {
                $error::Permanent(cause.into())
            }

            /// True when trying again may succeed.
            pub fn is_transient(&self) -> bool {
                matches!(self, $error::Transient(_))
            }

            /// The underlying error.
            pub fn cause(&self) -> &$crate::ports::Cause {
                match self {
                    $error::Transient(cause) | $error::Permanent(cause) => cause,
                }
            }
        }
    };
}
pub(super) use transient_or_permanent;
