//! Bounded, borrowing reads of JSON envelopes: an object's members as raw values (nothing
//! decoded that the reader does not ask for, nothing copied that it does not keep), strings
//! borrowed when they have no escapes, and refusals that never quote the body.

use std::borrow::Cow;
use std::fmt;

use serde::Deserializer as _;
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use super::reader::{Headers, MAX_ENVELOPE_HEADERS, json_property};
use super::{DeadLetterReason, Rejection};

/// The most members an envelope object may have: the envelope's own fields plus
/// [`MAX_ENVELOPE_HEADERS`] extensions.
pub(crate) const MAX_MEMBERS: usize = MAX_ENVELOPE_HEADERS + 32;

/// A JSON string, borrowed from the body when it has no escapes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Text<'a>(pub(crate) Cow<'a, str>);

impl<'de> serde::Deserialize<'de> for Text<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TextVisitor;
        impl<'de> Visitor<'de> for TextVisitor {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(v)))
            }
        }
        deserializer.deserialize_str(TextVisitor)
    }
}

/// Reads at most `max` elements of a sequence (or members of a map), failing past it.
struct Bounded<T> {
    max: usize,
    what: &'static str,
    _element: std::marker::PhantomData<T>,
}

impl<T> Bounded<T> {
    fn new(max: usize, what: &'static str) -> Self {
        Bounded {
            max,
            what,
            _element: std::marker::PhantomData,
        }
    }

    fn too_many<E: de::Error>(&self) -> E {
        E::custom(format_args!("more than {} {}", self.max, self.what))
    }
}

impl<'de> Visitor<'de> for Bounded<Text<'de>> {
    type Value = Vec<Text<'de>>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of strings")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        while let Some(item) = seq.next_element::<Text<'de>>()? {
            if out.len() == self.max {
                return Err(self.too_many());
            }
            out.push(item);
        }
        Ok(out)
    }
}

impl<'de> Visitor<'de> for Bounded<(Text<'de>, &'de RawValue)> {
    type Value = Vec<(Text<'de>, &'de RawValue)>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        while let Some(key) = map.next_key::<Text<'de>>()? {
            if out.len() == self.max {
                return Err(self.too_many());
            }
            let value = map.next_value::<&'de RawValue>()?;
            out.push((key, value));
        }
        Ok(out)
    }
}

impl<'de, T> DeserializeSeed<'de> for Bounded<T>
where
    Bounded<T>: Visitor<'de>,
{
    type Value = <Self as Visitor<'de>>::Value;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

/// The rejection of a body that is not the JSON the envelope promises: the parser's category
/// and position, never its message (serde_json quotes the offending value).
pub(crate) fn not_json(what: &str, error: &serde_json::Error) -> Rejection {
    let why = if error.is_data() {
        "a value of the wrong type".to_owned()
    } else {
        format!("{:?} error", error.classify())
    };
    Rejection::new(
        DeadLetterReason::InvalidPayload,
        format!(
            "{what}: {why} at line {}, column {}",
            error.line(),
            error.column()
        ),
    )
}

/// The members of the JSON object `body`, at most [`MAX_MEMBERS`], each as raw JSON borrowed
/// from `body`. A key given twice keeps its first value, as a reader looks the first one up.
///
/// # Errors
/// `InvalidPayload` when `body` is not a JSON object or has too many members.
pub(crate) fn members<'a>(
    body: &'a [u8],
    what: &str,
) -> Result<Vec<(Text<'a>, &'a RawValue)>, Rejection> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let members = Bounded::<(Text<'a>, &'a RawValue)>::new(MAX_MEMBERS, "members")
        .deserialize(&mut de)
        .and_then(|members| de.end().map(|()| members))
        .map_err(|e| bounded_error(what, &e))?;
    Ok(members)
}

/// The value of member `name`, if present.
pub(crate) fn member<'a>(members: &[(Text<'a>, &'a RawValue)], name: &str) -> Option<&'a RawValue> {
    members
        .iter()
        .find(|(key, _)| key.0 == name)
        .map(|(_, value)| *value)
}

/// Member `name` as a string: `None` when absent or `null`.
///
/// # Errors
/// `InvalidPayload` naming the member when it is not a string.
pub(crate) fn string<'a>(
    members: &[(Text<'a>, &'a RawValue)],
    name: &str,
    what: &str,
) -> Result<Option<Cow<'a, str>>, Rejection> {
    match member(members, name) {
        None => Ok(None),
        Some(raw) if raw.get() == "null" => Ok(None),
        Some(raw) => serde_json::from_str::<Text<'a>>(raw.get())
            .map(|text| Some(text.0))
            .map_err(|_| {
                Rejection::new(
                    DeadLetterReason::InvalidPayload,
                    format!("{what}: {name} is not a string"),
                )
            }),
    }
}

/// The JSON array of strings `raw`, at most `max` of them.
///
/// # Errors
/// `InvalidPayload` when it is not an array of strings or is longer.
pub(crate) fn strings<'a>(
    raw: &'a RawValue,
    max: usize,
    what: &str,
) -> Result<Vec<Cow<'a, str>>, Rejection> {
    let mut de = serde_json::Deserializer::from_str(raw.get());
    let texts = (&mut de)
        .deserialize_seq(Bounded::<Text<'a>>::new(max, "types"))
        .map_err(|e| bounded_error(what, &e))?;
    Ok(texts.into_iter().map(|text| text.0).collect())
}

/// The JSON object `raw` as headers, at most [`MAX_ENVELOPE_HEADERS`], values through
/// [`json_property`] (`null` values left out).
///
/// # Errors
/// `InvalidPayload` when it is not an object or has more members.
pub(crate) fn headers(raw: &RawValue, what: &str) -> Result<Headers, Rejection> {
    let mut de = serde_json::Deserializer::from_str(raw.get());
    let members = (&mut de)
        .deserialize_map(Bounded::<(Text<'_>, &RawValue)>::new(
            MAX_ENVELOPE_HEADERS,
            "headers",
        ))
        .map_err(|e| bounded_error(what, &e))?;
    let mut headers = Headers::new();
    for (key, value) in members {
        let value: serde_json::Value =
            serde_json::from_str(value.get()).map_err(|e| not_json(what, &e))?;
        if let Some(value) = json_property(&value) {
            headers.insert(key.0.into_owned(), value);
        }
    }
    Ok(headers)
}

/// A refusal from a bounded read: our own limit's message (it names no value), else the
/// parser's position.
fn bounded_error(what: &str, error: &serde_json::Error) -> Rejection {
    let text = error.to_string();
    if text.starts_with("more than ") {
        // Our own message from `Bounded::too_many`: a number and a noun, no payload.
        let limit = text.split(" at line").next().unwrap_or(&text);
        return Rejection::new(DeadLetterReason::InvalidPayload, format!("{what}: {limit}"));
    }
    not_json(what, error)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn members_borrow_and_are_bounded() {
        let body = br#"{"a":"x","b":{"c":[1,2]},"e":"q\"uote"}"#;
        let members = members(body, "envelope").unwrap();
        assert!(matches!(
            string(&members, "a", "e").unwrap(),
            Some(Cow::Borrowed("x"))
        ));
        assert_eq!(member(&members, "b").unwrap().get(), r#"{"c":[1,2]}"#);
        assert_eq!(string(&members, "e", "e").unwrap().unwrap(), "q\"uote");
        assert_eq!(string(&members, "z", "e").unwrap(), None);
        let rejection = string(&members, "b", "envelope").unwrap_err();
        assert_eq!(rejection.description, "envelope: b is not a string");

        let many: String = (0..=MAX_MEMBERS).map(|i| format!("\"k{i}\":1,")).collect();
        let body = format!("{{{}}}", many.trim_end_matches(','));
        let rejection = super::members(body.as_bytes(), "envelope").unwrap_err();
        assert_eq!(rejection.reason, DeadLetterReason::InvalidPayload);
        assert!(
            rejection.description.contains("more than"),
            "{}",
            rejection.description
        );
    }

    #[test]
    fn refusals_never_quote_the_body() {
        for body in [
            &b"{\"a\": secret}"[..],
            b"[\"secret\"]",
            b"{\"a\":1} secret",
            b"\"secret\"",
        ] {
            let rejection = members(body, "envelope").unwrap_err();
            assert_eq!(rejection.reason, DeadLetterReason::InvalidPayload);
            assert!(
                !rejection.description.contains("secret"),
                "{}",
                rejection.description
            );
        }
        let raw: Box<RawValue> = serde_json::from_str(r#"["a", {"secret": 1}]"#).unwrap();
        let rejection = strings(&raw, 4, "messageType").unwrap_err();
        assert!(
            !rejection.description.contains("secret"),
            "{}",
            rejection.description
        );
        let raw: Box<RawValue> = serde_json::from_str(r#"["a","b","c"]"#).unwrap();
        assert_eq!(strings(&raw, 3, "t").unwrap(), ["a", "b", "c"]);
        assert!(
            strings(&raw, 2, "t")
                .unwrap_err()
                .description
                .contains("more than 2")
        );
    }

    #[test]
    fn headers_keep_scalars_and_bound_the_rest() {
        let raw: Box<RawValue> =
            serde_json::from_str(r#"{"s":"v","n":3,"f":1.5,"b":true,"o":{"x":1},"z":null}"#)
                .unwrap();
        let headers = headers(&raw, "headers").unwrap();
        use crate::ports::PropertyValue as P;
        assert_eq!(headers.get("s"), Some(&P::String("v".into())));
        assert_eq!(headers.get("n"), Some(&P::Long(3)));
        assert_eq!(headers.get("f"), Some(&P::Double(1.5)));
        assert_eq!(headers.get("b"), Some(&P::Bool(true)));
        assert_eq!(headers.get("o"), Some(&P::String(r#"{"x":1}"#.into())));
        assert_eq!(headers.get("z"), None);
    }
}
