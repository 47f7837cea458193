//! [`setters!`]: the `name(mut self, value) -> Self` setters the option builders share
//! ([`crate::SenderOptions`], [`crate::ReceiverOptions`], [`crate::LinkAnswer`]).

/// Writes one builder setter per line, named for the field it stores into.
///
/// - `field(T);` stores the value as is;
/// - `field(T) => Some;` stores `Some(value)` in an optional field;
/// - `field(into T) => Some;` takes any `impl Into<T>` and stores `Some(value.into())`.
///
/// Doc comments in front of a line document the setter; every setter is `#[must_use]`.
macro_rules! setters {
    () => {};
    (@fn $(#[$doc:meta])* $field:ident($ty:ty) |$value:ident| $store:expr) => {
        $(#[$doc])*
        #[must_use]
        pub fn $field(mut self, $value: $ty) -> Self {
            self.$field = $store;
            self
        }
    };
    // `into` before the others: their `$ty:ty` would fail hard on `into T`.
    ($(#[$doc:meta])* $field:ident(into $ty:ty) => Some; $($rest:tt)*) => {
        $crate::builder::setters!(@fn $(#[$doc])* $field(impl Into<$ty>) |value| Some(value.into()));
        $crate::builder::setters!($($rest)*);
    };
    ($(#[$doc:meta])* $field:ident($ty:ty) => Some; $($rest:tt)*) => {
        $crate::builder::setters!(@fn $(#[$doc])* $field($ty) |value| Some(value));
        $crate::builder::setters!($($rest)*);
    };
    ($(#[$doc:meta])* $field:ident($ty:ty); $($rest:tt)*) => {
        $crate::builder::setters!(@fn $(#[$doc])* $field($ty) |value| value);
        $crate::builder::setters!($($rest)*);
    };
}

pub(crate) use setters;
