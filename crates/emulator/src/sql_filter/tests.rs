//! Unit tests of the SQL filter subset: constants, comparisons, system properties, NULL, IN,
//! LIKE, three-valued logic, and what lies outside the subset.

use super::*;
use crate::message::PropertyValue;

fn msg() -> BrokerMessage {
    let mut m = BrokerMessage::new("body")
        .with_property("color", "red")
        .with_property("quantity", 10)
        .with_property("price", 2.5)
        .with_property("vip", true)
        .with_property("note", PropertyValue::Null);
    m.subject = Some("order-42".into());
    m.message_id = Some("m1".into());
    m.correlation_id = Some("c1".into());
    m.content_type = Some("application/json".into());
    m.to = Some("shipping".into());
    m
}

fn eval(text: &str) -> bool {
    SqlFilter::parse(text)
        .unwrap_or_else(|e| panic!("{text}: {e}"))
        .matches(&msg())
}

#[test]
fn constants_and_trivial_filters() {
    assert!(eval("1=1"));
    assert!(!eval("1=0"));
    assert!(eval("TRUE"));
    assert!(!eval("FALSE"));
    assert!(eval("true OR false"));
    assert!(eval("NOT (1 = 0)"));
}

#[test]
fn comparisons() {
    let yes = [
        "color = 'red'",
        "color <> 'blue'",
        "color != 'blue'",
        "quantity > 5",
        "quantity >= 10",
        "quantity < 10.5",
        "quantity <= 10",
        "price = 2.5",
        "price > 2",
        "vip = TRUE",
        "quantity = 10 AND color = 'red'",
        "quantity = 1 OR color = 'red'",
        "NOT color = 'blue'",
        "(color = 'blue' OR color = 'red') AND quantity > -1",
        "user.color = 'red'",
        "[color] = 'red'",
    ];
    for text in yes {
        assert!(eval(text), "{text}");
    }
    let no = [
        "color = 'Red'",
        "quantity > 10",
        "vip = FALSE",
        "color = 10",
        "missing = 'x'",
        "missing <> 'x'",
        "NOT missing = 'x'",
        "vip > FALSE",
    ];
    for text in no {
        assert!(!eval(text), "{text}");
    }
}

#[test]
fn system_properties() {
    assert!(eval("sys.Label = 'order-42'"));
    assert!(eval("sys.label = 'order-42'"));
    assert!(eval("sys.Subject = 'order-42'"));
    assert!(eval("sys.MessageId = 'm1'"));
    assert!(eval("sys.CorrelationId = 'c1'"));
    assert!(eval("sys.ContentType = 'application/json'"));
    assert!(eval("sys.To = 'shipping'"));
    assert!(eval("sys.ReplyTo IS NULL"));
    assert!(eval("sys.SessionId IS NULL"));
}

#[test]
fn null_in_and_like() {
    assert!(eval("missing IS NULL"));
    assert!(eval("note IS NULL"));
    assert!(eval("color IS NOT NULL"));
    assert!(eval("color IN ('blue', 'red')"));
    assert!(eval("quantity IN (1, 10)"));
    assert!(eval("color NOT IN ('blue', 'green')"));
    assert!(!eval("missing IN ('x')"));
    assert!(!eval("missing NOT IN ('x')"));
    assert!(eval("sys.Label LIKE 'order-%'"));
    assert!(eval("sys.Label LIKE 'order-__'"));
    assert!(!eval("sys.Label LIKE 'order-_'"));
    assert!(eval("sys.Label LIKE '%42'"));
    assert!(eval("sys.Label LIKE '%r%4%'"));
    assert!(eval("sys.Label NOT LIKE 'x%'"));
    assert!(eval("'50%' LIKE '50!%' ESCAPE '!'"));
    assert!(!eval("'500' LIKE '50!%' ESCAPE '!'"));
    assert!(eval("'it''s' = 'it''s'"));
}

#[test]
fn three_valued_logic() {
    // Unknown OR true is true; unknown AND false is false; NOT unknown is unknown.
    assert!(eval("missing = 1 OR 1 = 1"));
    assert!(!eval("missing = 1 AND 1 = 1"));
    assert!(!eval("NOT (missing = 1)"));
    assert!(eval("NOT (missing = 1 AND 1 = 0)"));
}

#[test]
fn rejects_outside_the_subset() {
    let cases = [
        ("", "expected a literal"),
        ("color", "expected a comparison"),
        ("color = ", "expected a literal"),
        ("color = 'red", "unterminated string"),
        ("sys.Foo = 1", "unsupported system property"),
        ("a = 1 +", "unexpected character '+'"),
        ("EXISTS(a)", "expected a comparison"),
        ("a IN ()", "expected a literal"),
        ("a LIKE 5", "LIKE needs a string pattern"),
        ("(a = 1", "expected ')'"),
        ("a = 1 b = 2", "unexpected identifier"),
        ("a IS 1", "expected NULL"),
        ("SET a = 1", "expected a comparison"),
    ];
    for (text, expected) in cases {
        let e = SqlFilter::parse(text).expect_err(text);
        assert!(
            e.to_string().contains(expected),
            "{text:?}: {e} (wanted {expected:?})"
        );
    }
    let e = SqlFilter::parse("a = 1 AND b ~ 2").unwrap_err();
    assert_eq!(e.offset, 12);
}
