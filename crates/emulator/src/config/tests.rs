//! Unit tests of `Config.json` parsing and validation: the sample file, defaults, and every
//! invalid case naming its JSON path.

use super::*;

use std::time::Duration;

use crate::filter::Filter;
use crate::message::PropertyValue;

/// A configuration in the shape of Microsoft's sample `Config.json`.
const SAMPLE: &str = r#"{
  "UserConfig": {
    "Namespaces": [
      {
        "Name": "sbemulatorns",
        "Queues": [
          {
            "Name": "queue.1",
            "Properties": {
              "DeadLetteringOnMessageExpiration": false,
              "DefaultMessageTimeToLive": "PT1H",
              "DuplicateDetectionHistoryTimeWindow": "PT20S",
              "ForwardDeadLetteredMessagesTo": "",
              "ForwardTo": "",
              "LockDuration": "PT1M",
              "MaxDeliveryCount": 3,
              "RequiresDuplicateDetection": false,
              "RequiresSession": false
            }
          },
          { "Name": "minimal" }
        ],
        "Topics": [
          {
            "Name": "topic.1",
            "Properties": {
              "DefaultMessageTimeToLive": "PT1H",
              "DuplicateDetectionHistoryTimeWindow": "PT20S",
              "RequiresDuplicateDetection": false
            },
            "Subscriptions": [
              {
                "Name": "subscription.1",
                "Properties": {
                  "DeadLetteringOnMessageExpiration": false,
                  "DefaultMessageTimeToLive": "PT1H",
                  "LockDuration": "PT1M",
                  "MaxDeliveryCount": 3,
                  "ForwardDeadLetteredMessagesTo": "",
                  "ForwardTo": "",
                  "RequiresSession": false
                },
                "Rules": [
                  {
                    "Name": "app-prop-filter-1",
                    "Properties": {
                      "FilterType": "Correlation",
                      "CorrelationFilter": {
                        "ContentType": "application/text",
                        "CorrelationId": "id1",
                        "Label": "subject1",
                        "MessageId": "msgid1",
                        "ReplyTo": "someQueue",
                        "ReplyToSessionId": "sessionId",
                        "SessionId": "session1",
                        "To": "xyz",
                        "Properties": { "prop3": "value3", "n": 5 }
                      }
                    }
                  }
                ]
              },
              {
                "Name": "subscription.2",
                "Properties": { "LockDuration": "PT1S", "MaxDeliveryCount": 1 },
                "Rules": [
                  {
                    "Name": "sql-filter-1",
                    "Properties": {
                      "FilterType": "Sql",
                      "SqlFilter": { "SqlExpression": "sys.MessageId = '123456' AND userProp1 = 'value1'" },
                      "Action": { "SqlExpression": "SET sys.To = 'Entity'" }
                    }
                  }
                ]
              },
              { "Name": "subscription.3", "Rules": [] }
            ]
          }
        ]
      }
    ],
    "Logging": { "Type": "File" }
  }
}"#;

/// Wraps a queue definition in a full document.
fn with_queue(queue: &str) -> String {
    format!(
        r#"{{"UserConfig":{{"Namespaces":[{{"Name":"ns","Queues":[{{"Name":"ok"}},{queue}],"Topics":[]}}],"Logging":{{"Type":"File"}}}}}}"#
    )
}

/// Wraps a subscription definition in a full document.
fn with_subscription(sub: &str) -> String {
    format!(
        r#"{{"UserConfig":{{"Namespaces":[{{"Name":"ns","Queues":[{{"Name":"q"}}],"Topics":[{{"Name":"t","Subscriptions":[{sub}]}}]}}]}}}}"#
    )
}

fn error(text: &str) -> String {
    Config::from_json(text).expect_err(text).to_string()
}

#[test]
fn parses_the_sample() {
    let c = Config::from_json(SAMPLE).unwrap();
    assert_eq!(c.namespace.name, "sbemulatorns");
    assert_eq!(c.logging.as_deref(), Some("File"));
    let q = &c.namespace.queues[0];
    assert_eq!(q.name, "queue.1");
    assert_eq!(q.properties.lock_duration, Duration::from_secs(60));
    assert_eq!(q.properties.max_delivery_count, 3);
    assert_eq!(
        q.properties.default_message_time_to_live,
        Duration::from_secs(3_600)
    );
    assert_eq!(q.properties.forward_to, None);
    assert_eq!(q.properties.forward_dead_lettered_messages_to, None);
    assert_eq!(
        c.namespace.queues[1].properties,
        EntityProperties::default()
    );
    let t = &c.namespace.topics[0];
    assert_eq!(t.subscriptions.len(), 3);
    let s1 = &t.subscriptions[0];
    let Filter::Correlation(f) = &s1.rules[0].filter else {
        panic!("expected a correlation filter");
    };
    assert_eq!(f.label.as_deref(), Some("subject1"));
    assert_eq!(f.properties.get("n"), Some(&PropertyValue::Long(5)));
    let s2 = &t.subscriptions[1];
    assert_eq!(s2.properties.lock_duration, Duration::from_secs(1));
    assert_eq!(s2.properties.max_delivery_count, 1);
    assert!(matches!(s2.rules[0].filter, Filter::Sql(_)));
    assert_eq!(
        s2.rules[0]
            .action
            .as_ref()
            .map(crate::SqlRuleAction::expression),
        Some("SET sys.To = 'Entity'")
    );
    assert!(t.subscriptions[2].rules.is_empty());
}

#[test]
fn defaults_follow_microsofts_emulator_schema() {
    let p = EntityProperties::default();
    assert_eq!(p.lock_duration, Duration::from_secs(60));
    assert_eq!(p.max_delivery_count, 3);
    assert_eq!(p.default_message_time_to_live, Duration::from_secs(3_600));
    assert_eq!(
        p.duplicate_detection_history_time_window,
        Duration::from_secs(20)
    );
    assert!(!p.dead_lettering_on_message_expiration);
    assert!(!p.requires_duplicate_detection);
    assert!(!p.requires_session);
    assert_eq!(p.max_message_size, 256 * 1024);
}

#[test]
fn relaxes_minimums() {
    let c = Config::from_json(&with_queue(
        r#"{"Name":"fast","Properties":{"LockDuration":"PT1S","DefaultMessageTimeToLive":"PT0.5S","DuplicateDetectionHistoryTimeWindow":"PT1S","MaxDeliveryCount":50,"MaxMessageSizeInKilobytes":1024}}"#,
    ))
    .unwrap();
    let p = &c.namespace.queues[1].properties;
    assert_eq!(p.lock_duration, Duration::from_secs(1));
    assert_eq!(p.default_message_time_to_live, Duration::from_millis(500));
    assert_eq!(p.max_delivery_count, 50);
    assert_eq!(p.max_message_size, 1024 * 1024);
}

#[test]
fn invalid_duration_names_its_path() {
    assert_eq!(
        error(&with_queue(
            r#"{"Name":"q","Properties":{"LockDuration":"1 minute"}}"#
        )),
        r#"UserConfig.Namespaces[0].Queues[1].Properties.LockDuration: invalid ISO-8601 duration "1 minute""#
    );
}

#[test]
fn each_invalid_case_names_its_path() {
    let q = "UserConfig.Namespaces[0].Queues[1]";
    let s = "UserConfig.Namespaces[0].Topics[0].Subscriptions[0]";
    let cases: Vec<(String, String, &str)> = vec![
        (
            with_queue(r#"{"Name":"q","Properties":{"LockDuration":"PT0S"}}"#),
            format!("{q}.Properties.LockDuration"),
            "greater than zero",
        ),
        (
            with_queue(r#"{"Name":"q","Properties":{"MaxDeliveryCount":0}}"#),
            format!("{q}.Properties.MaxDeliveryCount"),
            "at least 1",
        ),
        (
            with_queue(r#"{"Name":"q","Properties":{"MaxDeliveryCount":-1}}"#),
            format!("{q}.Properties.MaxDeliveryCount"),
            "non-negative integer",
        ),
        (
            with_queue(r#"{"Name":"q","Properties":{"MaxDeliveryCount":"3"}}"#),
            format!("{q}.Properties.MaxDeliveryCount"),
            "expected an integer, found a string",
        ),
        (
            with_queue(r#"{"Name":"q","Properties":{"RequiresSession":"false"}}"#),
            format!("{q}.Properties.RequiresSession"),
            "expected a boolean",
        ),
        (
            with_queue(r#"{"Name":"q","Properties":{"LockDuraton":"PT1M"}}"#),
            format!("{q}.Properties.LockDuraton"),
            "unknown field",
        ),
        (
            with_queue(r#"{"Name":"q","Properties":{"DefaultMessageTimeToLive":"P"}}"#),
            format!("{q}.Properties.DefaultMessageTimeToLive"),
            "invalid ISO-8601",
        ),
        (
            with_queue(r#"{"Name":"q","Properties":{"ForwardTo":"nowhere"}}"#),
            format!("{q}.Properties.ForwardTo"),
            "unknown forwarding target",
        ),
        (
            with_queue(r#"{"Name":"q","Properties":{"ForwardTo":"Q"}}"#),
            format!("{q}.Properties.ForwardTo"),
            "cannot forward to itself",
        ),
        (
            with_queue(r#"{"Name":"q","Properties":{"ForwardDeadLetteredMessagesTo":"nowhere"}}"#),
            format!("{q}.Properties.ForwardDeadLetteredMessagesTo"),
            "unknown forwarding target",
        ),
        (
            with_queue(r#"{"Name":"OK"}"#),
            format!("{q}.Name"),
            "duplicate entity name",
        ),
        (
            with_queue(r#"{"Name":"-bad"}"#),
            format!("{q}.Name"),
            "invalid name",
        ),
        (
            with_queue(r#"{"Properties":{}}"#),
            format!("{q}.Name"),
            "missing required field",
        ),
        (
            with_queue(r#"{"Name":"q","Extra":1}"#),
            format!("{q}.Extra"),
            "unknown field",
        ),
        (
            with_queue(r#""q""#),
            q.to_owned(),
            "expected an object, found a string",
        ),
        (
            with_subscription(r#"{"Name":"s","Properties":{"RequiresDuplicateDetection":true}}"#),
            format!("{s}.Properties.RequiresDuplicateDetection"),
            "unknown field",
        ),
        (
            with_subscription(r#"{"Name":"s","Properties":{"ForwardTo":"t"}}"#),
            format!("{s}.Properties.ForwardTo"),
            "cannot forward to itself",
        ),
        (
            with_subscription(r#"{"Name":"s"},{"Name":"S"}"#),
            "UserConfig.Namespaces[0].Topics[0].Subscriptions[1].Name".to_owned(),
            "duplicate subscription name",
        ),
        (
            with_subscription(
                r#"{"Name":"s","Rules":[{"Name":"r","Properties":{"FilterType":"Sql","SqlFilter":{"SqlExpression":"a ~ 1"}}}]}"#,
            ),
            format!("{s}.Rules[0].Properties.SqlFilter.SqlExpression"),
            "invalid SQL filter \"a ~ 1\": unexpected character '~' at offset 2",
        ),
        (
            with_subscription(
                r#"{"Name":"s","Rules":[{"Name":"r","Properties":{"FilterType":"Sql"}}]}"#,
            ),
            format!("{s}.Rules[0].Properties.SqlFilter"),
            "missing required field",
        ),
        (
            with_subscription(
                r#"{"Name":"s","Rules":[{"Name":"r","Properties":{"FilterType":"Boolean"}}]}"#,
            ),
            format!("{s}.Rules[0].Properties.FilterType"),
            "invalid filter type",
        ),
        (
            with_subscription(
                r#"{"Name":"s","Rules":[{"Name":"r","Properties":{"FilterType":"Correlation","CorrelationFilter":{}}}]}"#,
            ),
            format!("{s}.Rules[0].Properties.CorrelationFilter"),
            "at least one field",
        ),
        (
            with_subscription(
                r#"{"Name":"s","Rules":[{"Name":"r","Properties":{"FilterType":"Correlation","CorrelationFilter":{"Subject":"x"}}}]}"#,
            ),
            format!("{s}.Rules[0].Properties.CorrelationFilter.Subject"),
            "unknown field",
        ),
        (
            with_subscription(
                r#"{"Name":"s","Rules":[{"Name":"r","Properties":{"FilterType":"Correlation","CorrelationFilter":{"Properties":{"a":[1]}}}}]}"#,
            ),
            format!("{s}.Rules[0].Properties.CorrelationFilter.Properties.a"),
            "expected a string, number or boolean",
        ),
        (
            with_subscription(
                r#"{"Name":"s","Rules":[{"Name":"r","Properties":{"FilterType":"Correlation","CorrelationFilter":{"To":"x"},"SqlFilter":{"SqlExpression":"1=1"}}}]}"#,
            ),
            format!("{s}.Rules[0].Properties.SqlFilter"),
            "not allowed",
        ),
        (
            with_subscription(
                r#"{"Name":"s","Rules":[{"Name":"r","Properties":{"FilterType":"Sql","SqlFilter":{"SqlExpression":"1=1"}}},{"Name":"R","Properties":{"FilterType":"Sql","SqlFilter":{"SqlExpression":"1=1"}}}]}"#,
            ),
            format!("{s}.Rules[1].Name"),
            "duplicate rule name",
        ),
        (
            r#"{"UserConfig":{"Namespaces":[]}}"#.to_owned(),
            "UserConfig.Namespaces".to_owned(),
            "exactly one namespace",
        ),
        (
            r#"{"UserConfig":{}}"#.to_owned(),
            "UserConfig.Namespaces".to_owned(),
            "missing required field",
        ),
        (
            r#"{"UserConfig":{"Namespaces":[{"Name":"ns"}],"Logging":{"Type":"Syslog"}}}"#
                .to_owned(),
            "UserConfig.Logging.Type".to_owned(),
            "invalid logging type",
        ),
        (
            r#"{"UserConfig":{"Namespaces":[{"Name":"ns","Queue":[]}]}}"#.to_owned(),
            "UserConfig.Namespaces[0].Queue".to_owned(),
            "unknown field",
        ),
        (
            r#"{"Config":{}}"#.to_owned(),
            "Config".to_owned(),
            "unknown field",
        ),
        ("[]".to_owned(), "$".to_owned(), "expected an object"),
    ];
    for (text, path, message) in cases {
        let err = Config::from_json(&text).expect_err(&text);
        assert_eq!(err.path(), Some(path.as_str()), "{text}: {err}");
        assert!(
            err.to_string().contains(message),
            "{text}: {err} (wanted {message:?})"
        );
    }
}

#[test]
fn malformed_json_reports_line_and_column() {
    let err = Config::from_json("{\n  \"UserConfig\": ").unwrap_err();
    assert!(matches!(err, ConfigError::Json { line: 2, .. }), "{err}");
}

#[test]
fn forward_targets_may_be_topics() {
    let c = Config::from_json(
        r#"{"UserConfig":{"Namespaces":[{"Name":"ns","Queues":[{"Name":"q","Properties":{"ForwardTo":"T"}}],
        "Topics":[{"Name":"t","Subscriptions":[{"Name":"s","Properties":{"ForwardDeadLetteredMessagesTo":"q"}}]}]}]}}"#,
    )
    .unwrap();
    assert_eq!(
        c.namespace.queues[0].properties.forward_to.as_deref(),
        Some("T")
    );
}

#[test]
fn builder_configs_are_validated_too() {
    let c = Config::new("ns").with_queue(QueueConfig::new("q").with_properties(EntityProperties {
        lock_duration: Duration::ZERO,
        ..Default::default()
    }));
    assert_eq!(
        c.validate().unwrap_err().path(),
        Some("UserConfig.Namespaces[0].Queues[0].Properties.LockDuration")
    );
}

#[test]
fn shared_access_policies_extension() {
    let json = |policies: &str| {
        format!(
            r#"{{"UserConfig":{{"Namespaces":[{{"Name":"ns","Queues":[],"Topics":[],
            "SharedAccessPolicies":{policies}}}],"Logging":{{"Type":"File"}}}}}}"#
        )
    };
    let config = Config::from_json(&json(
        r#"[{"Name":"listener","Key":"k1","Rights":["Listen"]},
            {"Name":"admin","Key":"k2","Rights":["Manage","Listen","Send"]}]"#,
    ))
    .unwrap();
    let policies = &config.namespace.shared_access_policies;
    assert_eq!(policies.len(), 2);
    assert!(policies[0].rights.allows(crate::Right::Listen));
    assert!(!policies[0].rights.allows(crate::Right::Send));
    assert!(policies[1].rights.allows(crate::Right::Manage));
    assert!(
        !format!("{policies:?}").contains("k1"),
        "keys are never printed"
    );
    for (policies, message) in [
        (
            r#"[{"Name":"a","Key":"k","Rights":["Manage"]}]"#,
            "UserConfig.Namespaces[0].SharedAccessPolicies[0].Rights: Manage requires Listen and Send",
        ),
        (
            r#"[{"Name":"a","Key":"k","Rights":["Read"]}]"#,
            "UserConfig.Namespaces[0].SharedAccessPolicies[0].Rights[0]: expected \"Listen\", \"Send\" or \"Manage\", found \"Read\"",
        ),
        (
            r#"[{"Name":"a","Key":"","Rights":["Send"]}]"#,
            "UserConfig.Namespaces[0].SharedAccessPolicies[0].Key: must not be empty",
        ),
    ] {
        assert_eq!(
            Config::from_json(&json(policies)).unwrap_err().to_string(),
            message
        );
    }
}
