//! A small XML tree for the Atom bodies clients send: elements by local name (namespace
//! prefixes dropped), the `i:type` attribute, and text. Enough for `QueueDescription`,
//! `TopicDescription`, `SubscriptionDescription` and `RuleDescription`; nothing is validated
//! against a schema.

use quick_xml::Reader;
use quick_xml::events::{BytesStart, Event};

/// An element: its local name, its `type` attribute (`i:type="SqlFilter"`, local part), its
/// text and children.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Element {
    pub(crate) name: String,
    pub(crate) xsi_type: Option<String>,
    pub(crate) text: String,
    pub(crate) children: Vec<Element>,
}

impl Element {
    /// The first child named `name` (case-sensitive, as the service's contract is).
    pub(crate) fn child(&self, name: &str) -> Option<&Element> {
        self.children.iter().find(|c| c.name == name)
    }

    /// The first descendant named `name`, depth first.
    pub(crate) fn find(&self, name: &str) -> Option<&Element> {
        self.children.iter().find_map(|c| {
            if c.name == name {
                Some(c)
            } else {
                c.find(name)
            }
        })
    }

    /// The trimmed text of child `name`, when present and not empty.
    pub(crate) fn text_of(&self, name: &str) -> Option<&str> {
        self.child(name)
            .map(|c| c.text.trim())
            .filter(|t| !t.is_empty())
    }
}

/// Why a body is not XML.
#[derive(Debug, thiserror::Error)]
#[error("the request body is not well-formed XML: {0}")]
pub(crate) struct XmlError(String);

fn local(name: &[u8]) -> String {
    let name = String::from_utf8_lossy(name);
    match name.rsplit_once(':') {
        Some((_, local)) => local.to_owned(),
        None => name.into_owned(),
    }
}

fn start(e: &BytesStart<'_>) -> Element {
    let xsi_type = e.attributes().flatten().find_map(|a| {
        (local(a.key.as_ref()) == "type").then(|| {
            let v = String::from_utf8_lossy(&a.value).into_owned();
            match v.rsplit_once(':') {
                Some((_, l)) => l.to_owned(),
                None => v,
            }
        })
    });
    Element {
        name: local(e.name().as_ref()),
        xsi_type,
        ..Element::default()
    }
}

/// Parses `body` into its root element.
pub(crate) fn parse(body: &[u8]) -> Result<Element, XmlError> {
    let mut reader = Reader::from_reader(body);
    let mut stack: Vec<Element> = vec![Element::default()];
    let mut buf = Vec::new();
    loop {
        let event = reader
            .read_event_into(&mut buf)
            .map_err(|e| XmlError(e.to_string()))?;
        match event {
            Event::Start(e) => stack.push(start(&e)),
            Event::Empty(e) => {
                let el = start(&e);
                if let Some(parent) = stack.last_mut() {
                    parent.children.push(el);
                }
            }
            Event::End(_) => {
                let el = stack
                    .pop()
                    .ok_or_else(|| XmlError("unbalanced end tag".into()))?;
                match stack.last_mut() {
                    Some(parent) => parent.children.push(el),
                    None => return Err(XmlError("unbalanced end tag".into())),
                }
            }
            Event::Text(t) => {
                let text = t.decode().map_err(|e| XmlError(e.to_string()))?;
                let text =
                    quick_xml::escape::unescape(&text).map_err(|e| XmlError(e.to_string()))?;
                if let Some(el) = stack.last_mut() {
                    el.text.push_str(&text);
                }
            }
            Event::CData(t) => {
                if let Some(el) = stack.last_mut() {
                    el.text.push_str(&String::from_utf8_lossy(&t));
                }
            }
            Event::GeneralRef(r) => {
                // `&amp;` and friends arrive as references in quick-xml 0.38.
                let name = String::from_utf8_lossy(&r).into_owned();
                let resolved = quick_xml::escape::unescape(&format!("&{name};"))
                    .map_err(|e| XmlError(e.to_string()))?
                    .into_owned();
                if let Some(el) = stack.last_mut() {
                    el.text.push_str(&resolved);
                }
            }
            Event::Eof => break,
            _ => {}
        }
        buf.clear();
    }
    if stack.len() != 1 {
        return Err(XmlError("unclosed element".into()));
    }
    stack
        .pop()
        .and_then(|doc| doc.children.into_iter().next())
        .ok_or_else(|| XmlError("no root element".into()))
}

/// `text` with `&`, `<`, `>`, `"` and `'` escaped.
pub(crate) fn escape(text: &str) -> String {
    quick_xml::escape::escape(text).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_local_names_types_and_escaped_text() {
        let doc = parse(
            br#"<?xml version="1.0" encoding="utf-8"?>
<entry xmlns="http://www.w3.org/2005/Atom"><content type="application/xml">
<RuleDescription xmlns:i="http://www.w3.org/2001/XMLSchema-instance" xmlns="http://schemas.microsoft.com/netservices/2010/10/servicebus/connect">
<Filter i:type="SqlFilter"><SqlExpression>a &lt; 3 AND b = 'x&amp;y'</SqlExpression></Filter><Action i:type="EmptyRuleAction"/>
</RuleDescription></content></entry>"#,
        )
        .unwrap();
        assert_eq!(doc.name, "entry");
        let rule = doc.find("RuleDescription").unwrap();
        let filter = rule.child("Filter").unwrap();
        assert_eq!(filter.xsi_type.as_deref(), Some("SqlFilter"));
        assert_eq!(filter.text_of("SqlExpression"), Some("a < 3 AND b = 'x&y'"));
        assert_eq!(
            rule.child("Action").unwrap().xsi_type.as_deref(),
            Some("EmptyRuleAction")
        );
        assert!(parse(b"<a><b></a>").is_err());
        assert_eq!(escape("a<b&'c'"), "a&lt;b&amp;&apos;c&apos;");
    }
}
