//! Topics: fan-out by rules (configured and changed at run time), duplicate detection, forwarding.

use super::*;

fn topic_broker() -> Broker {
    let mut corr = CorrelationFilter {
        label: Some("created".into()),
        ..Default::default()
    };
    corr.properties.insert("region".into(), "eu".into());
    let config = Config::new("ns")
        .with_queue(QueueConfig::new("audit"))
        .with_topic(
            TopicConfig::new("orders")
                .with_subscription(SubscriptionConfig::new("all"))
                .with_subscription(SubscriptionConfig::new("eu-created").with_rule(Rule {
                    name: "corr".into(),
                    filter: Filter::Correlation(corr),
                    action: None,
                }))
                .with_subscription(SubscriptionConfig::new("big").with_rule(Rule {
                    name: "sql".into(),
                    filter: Filter::Sql(
                        SqlFilter::parse("quantity >= 10 AND sys.Label <> 'cancelled'").unwrap(),
                    ),
                    action: None,
                }))
                .with_subscription(
                    SubscriptionConfig::new("either")
                        .with_rule(Rule {
                            name: "a".into(),
                            filter: Filter::Sql(SqlFilter::parse("region = 'us'").unwrap()),
                            action: None,
                        })
                        .with_rule(Rule {
                            name: "b".into(),
                            filter: Filter::Sql(SqlFilter::parse("quantity < 5").unwrap()),
                            action: None,
                        }),
                )
                .with_subscription(SubscriptionConfig::new("none").with_rule(Rule {
                    name: "never".into(),
                    filter: Filter::False,
                    action: None,
                })),
        );
    Broker::new(config).unwrap()
}

fn order(id: &str, label: &str, region: &str, quantity: i64) -> BrokerMessage {
    let mut m = msg(id)
        .with_property("region", region)
        .with_property("quantity", quantity);
    m.subject = Some(label.into());
    m
}

async fn ids(e: &Entity) -> Vec<String> {
    let mut out = Vec::new();
    while let Some(m) = e.try_receive(ReceiveMode::ReceiveAndDelete).unwrap() {
        out.push(m.message.message_id.unwrap_or_default());
    }
    out
}

/// The `$management` rule operations change fan-out for messages sent afterwards.
#[tokio::test(start_paused = true)]
async fn rules_added_and_removed_at_run_time_drive_fan_out() {
    let broker = topic_broker();
    let topic = broker.entity("orders").unwrap();
    let all = broker.entity("orders/Subscriptions/all").unwrap();
    let names = |e: &Entity| {
        e.rules()
            .unwrap()
            .into_iter()
            .map(|(r, _)| r.name)
            .collect::<Vec<_>>()
    };
    assert_eq!(names(&all), ["$Default"]);
    all.add_rule(Rule {
        name: "eu".into(),
        filter: Filter::Sql(SqlFilter::parse("region = 'eu'").unwrap()),
        action: None,
    })
    .unwrap();
    assert!(matches!(
        all.add_rule(Rule {
            name: "EU".into(),
            filter: Filter::True,
            action: None,
        }),
        Err(Error::AlreadyExists { .. })
    ));
    assert!(matches!(
        all.add_rule(Rule {
            name: "x".repeat(51),
            filter: Filter::True,
            action: None,
        }),
        Err(Error::InvalidRule { .. })
    ));
    all.remove_rule("$default").unwrap();
    assert_eq!(names(&all), ["eu"]);
    assert!(matches!(
        all.remove_rule("$Default"),
        Err(Error::NotFound { .. })
    ));
    topic.send(order("1", "created", "us", 1)).unwrap();
    topic.send(order("2", "created", "eu", 1)).unwrap();
    assert_eq!(ids(&all).await, ["2"]);
    all.remove_rule("eu").unwrap();
    topic.send(order("3", "created", "eu", 1)).unwrap();
    assert!(ids(&all).await.is_empty(), "no rule, no messages");
    // Rules belong to subscriptions only.
    for entity in [
        "orders",
        "audit",
        "orders/Subscriptions/all/$DeadLetterQueue",
    ] {
        assert!(
            matches!(
                broker.entity(entity).unwrap().rules(),
                Err(Error::NotAllowed { .. })
            ),
            "{entity}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn topic_fans_out_by_correlation_sql_and_default_rules() {
    let broker = topic_broker();
    let topic = broker.entity("orders").unwrap();
    assert!(topic.is_topic());
    topic.send(order("1", "created", "eu", 1)).unwrap();
    topic.send(order("2", "created", "us", 20)).unwrap();
    topic.send(order("3", "cancelled", "eu", 50)).unwrap();
    topic.send(order("4", "created", "eu", 12)).unwrap();
    let sub = |name: &str| {
        broker
            .entity(&format!("orders/Subscriptions/{name}"))
            .unwrap()
    };
    assert_eq!(
        ids(&sub("all")).await,
        ["1", "2", "3", "4"],
        "$Default matches all"
    );
    assert_eq!(ids(&sub("EU-CREATED")).await, ["1", "4"]);
    assert_eq!(ids(&sub("big")).await, ["2", "4"]);
    assert_eq!(
        ids(&sub("either")).await,
        ["1", "2"],
        "any matching rule suffices"
    );
    assert!(ids(&sub("none")).await.is_empty());
    assert_eq!(topic.counts().sent, 4);
    // Subscriptions share the topic's sequence numbers.
    topic.send(order("5", "x", "eu", 0)).unwrap();
    assert_eq!(
        sub("all")
            .try_receive(ReceiveMode::PeekLock)
            .unwrap()
            .unwrap()
            .sequence_number,
        5
    );
    // Topics cannot be received from; subscriptions cannot be sent to.
    assert!(matches!(
        topic.try_receive(ReceiveMode::PeekLock),
        Err(Error::NotAllowed { .. })
    ));
    assert!(matches!(
        sub("all").send(msg("x")),
        Err(Error::NotAllowed { .. })
    ));
    assert!(
        broker
            .entity("orders/Subscriptions/missing")
            .unwrap_err()
            .is_not_found()
    );
}

#[tokio::test(start_paused = true)]
async fn topic_duplicate_detection_ttl_and_scheduling() {
    let config = Config::new("ns").with_topic(
        TopicConfig::new("t")
            .with_properties(TopicProperties {
                requires_duplicate_detection: true,
                duplicate_detection_history_time_window: 5 * SEC,
                default_message_time_to_live: 20 * SEC,
                ..TopicProperties::default()
            })
            .with_subscription(SubscriptionConfig::new("s").with_properties(props(|p| {
                p.dead_lettering_on_message_expiration = true;
            }))),
    );
    let broker = Broker::new(config).unwrap();
    let topic = broker.entity("t").unwrap();
    let sub = broker.entity("t/Subscriptions/s").unwrap();
    topic.send(msg("a")).unwrap();
    assert_eq!(topic.send(msg("a")).unwrap(), SendOutcome::Duplicate);
    assert_eq!(topic.counts().duplicates, 1);
    // Scheduled on the topic: invisible in the subscription's peek, cancellable on the topic.
    let mut s1 = msg("s1");
    s1.scheduled_enqueue_time = Some(broker.clock().now() + 10 * SEC);
    let mut s2 = msg("s2");
    s2.scheduled_enqueue_time = Some(broker.clock().now() + 10 * SEC);
    let seqs = topic.schedule(vec![s1, s2]).unwrap();
    assert_eq!(
        sub.peek(0, 10).unwrap().len(),
        1,
        "scheduled messages are not peeked on subscriptions"
    );
    assert_eq!(sub.counts().scheduled, 2);
    topic.cancel_scheduled(&seqs[1..]).unwrap();
    advance(10 * SEC).await;
    let got = ids(&sub).await;
    assert_eq!(got, ["a", "s1"]);
    // The topic's TTL (20 s) caps the subscription's default (1 h).
    topic.send(msg("b")).unwrap();
    advance(20 * SEC).await;
    let dlq = broker.entity("t/Subscriptions/s/$DeadLetterQueue").unwrap();
    let d = recv(&dlq).await;
    assert_eq!(d.dead_letter_reason(), Some("TTLExpiredException"));
    assert_eq!(d.dead_letter_source.as_deref(), Some("t/Subscriptions/s"));
}

#[tokio::test(start_paused = true)]
async fn forward_to_and_forward_dead_lettered_messages_to() {
    let config = Config::from_json(
        r#"{"UserConfig":{"Namespaces":[{"Name":"ns","Queues":[
            {"Name":"inbox","Properties":{"ForwardTo":"work"}},
            {"Name":"work","Properties":{"MaxDeliveryCount":1,"ForwardDeadLetteredMessagesTo":"poison"}},
            {"Name":"poison"}],
          "Topics":[{"Name":"events","Subscriptions":[{"Name":"fwd","Properties":{"ForwardTo":"work"}}]}]}]}}"#,
    )
    .unwrap();
    let broker = Broker::new(config).unwrap();
    let inbox = broker.entity("inbox").unwrap();
    let work = broker.entity("work").unwrap();
    let poison = broker.entity("poison").unwrap();
    inbox.send(msg("a")).unwrap();
    broker.entity("events").unwrap().send(msg("b")).unwrap();
    assert_eq!(inbox.counts().forwarded, 1);
    assert!(inbox.try_receive(ReceiveMode::PeekLock).unwrap().is_none());
    let a = recv(&work).await;
    assert_eq!(a.message.message_id.as_deref(), Some("a"));
    let b = recv(&work).await;
    assert_eq!(b.message.message_id.as_deref(), Some("b"));
    work.abandon(token(&a), Properties::new()).await.unwrap();
    let p = recv(&poison).await;
    assert_eq!(p.message.message_id.as_deref(), Some("a"));
    poison.complete(token(&p)).await.unwrap();
    assert_eq!(
        p.message.application_properties.get("DeadLetterReason"),
        Some(&"MaxDeliveryCountExceeded".into())
    );
    assert_eq!(work.counts().dead_lettered, 0, "forwarded, not kept");
    // Lock expiry also forwards (through the next operation's timer pass).
    advance(60 * SEC).await;
    assert_eq!(recv(&poison).await.message.message_id.as_deref(), Some("b"));
}

#[tokio::test(start_paused = true)]
async fn config_json_rules_drive_fan_out() {
    let config = Config::from_json(
        r#"{"UserConfig":{"Namespaces":[{"Name":"sbemulatorns","Queues":[],"Topics":[{"Name":"t",
          "Subscriptions":[
            {"Name":"high","Properties":{"LockDuration":"PT1S","MaxDeliveryCount":1},
             "Rules":[{"Name":"r","Properties":{"FilterType":"Sql","SqlFilter":{"SqlExpression":"priority = 'High' OR sys.Label LIKE 'urgent%'"}}}]},
            {"Name":"corr","Rules":[{"Name":"r","Properties":{"FilterType":"Correlation","CorrelationFilter":{"CorrelationId":"c1","Properties":{"n":1}}}}]},
            {"Name":"all"}]}]}],"Logging":{"Type":"File"}}}"#,
    )
    .unwrap();
    let broker = Broker::new(config).unwrap();
    let t = broker.entity("sb://localhost/t").unwrap();
    t.send(msg("1").with_property("priority", "High")).unwrap();
    let mut m2 = msg("2").with_property("n", 1);
    m2.correlation_id = Some("c1".into());
    m2.subject = Some("urgent-fix".into());
    t.send(m2).unwrap();
    t.send(msg("3").with_property("priority", "Low")).unwrap();
    let sub = |n: &str| broker.entity(&format!("t/subscriptions/{n}")).unwrap();
    assert_eq!(ids(&sub("high")).await, ["1", "2"]);
    assert_eq!(ids(&sub("corr")).await, ["2"]);
    assert_eq!(ids(&sub("all")).await, ["1", "2", "3"]);
    // The subscription's 1 s lock and MaxDeliveryCount 1 from the file apply.
    t.send(msg("4").with_property("priority", "High")).unwrap();
    let high = sub("high");
    recv(&high).await;
    advance(SEC).await;
    let d = recv(
        &broker
            .entity("t/Subscriptions/high/$DeadLetterQueue")
            .unwrap(),
    )
    .await;
    assert_eq!(d.dead_letter_reason(), Some("MaxDeliveryCountExceeded"));
}

/// A rule's action changes the copy its subscription receives and nothing else: the topic's
/// other subscription gets the message as sent. A subscription whose matching rules include
/// actions gets one copy per such rule plus one for the rules without actions (Microsoft,
/// "Topic filters and actions"), each under its own sequence number.
#[tokio::test(start_paused = true)]
async fn rule_actions_change_only_their_subscriptions_copy() {
    let config = Config::from_json(
        r#"{"UserConfig":{"Namespaces":[{"Name":"sbemulatorns","Queues":[],"Topics":[{"Name":"t",
          "Subscriptions":[
            {"Name":"plain"},
            {"Name":"tagged","Rules":[{"Name":"tag","Properties":{"FilterType":"Sql",
              "SqlFilter":{"SqlExpression":"region = 'eu'"},
              "Action":{"SqlExpression":"SET sys.Label = 'tagged'; SET user.stage = 2; SET sys.CorrelationId = region; REMOVE secret"}}}]}
          ]}]}],"Logging":{"Type":"File"}}}"#,
    )
    .unwrap();
    let broker = Broker::new(config).unwrap();
    let t = broker.entity("t").unwrap();
    let sent = order("1", "created", "eu", 3).with_property("secret", "s");
    t.send(sent).unwrap();
    let sub = |n: &str| broker.entity(&format!("t/Subscriptions/{n}")).unwrap();

    let tagged = recv(&sub("tagged")).await.message;
    assert_eq!(tagged.subject.as_deref(), Some("tagged"));
    assert_eq!(tagged.correlation_id.as_deref(), Some("eu"));
    let p = &tagged.application_properties;
    assert_eq!(p.get("stage"), Some(&PropertyValue::Long(2)));
    assert!(!p.contains_key("secret"), "REMOVE applied");
    assert_eq!(
        p.get("quantity"),
        Some(&PropertyValue::Long(3)),
        "others kept"
    );

    let plain = recv(&sub("plain")).await.message;
    assert_eq!(plain.subject.as_deref(), Some("created"));
    assert_eq!(plain.correlation_id, None);
    let p = &plain.application_properties;
    assert_eq!(p.get("secret"), Some(&PropertyValue::String("s".into())));
    assert!(!p.contains_key("stage"));

    // Two more rules at run time: one with an action, one without. With `$Default` (no action)
    // the message now matches three rules: two copies result on `plain`.
    let plain_sub = sub("plain");
    plain_sub
        .add_rule(Rule {
            name: "mark".into(),
            filter: Filter::Sql(SqlFilter::parse("quantity > 1").unwrap()),
            action: Some(SqlRuleAction::parse("SET marked = TRUE").unwrap()),
        })
        .unwrap();
    plain_sub
        .add_rule(Rule {
            name: "again".into(),
            filter: Filter::True,
            action: None,
        })
        .unwrap();
    t.send(order("2", "created", "us", 5)).unwrap();
    let first = recv(&plain_sub).await;
    let second = recv(&plain_sub).await;
    assert!(
        plain_sub
            .try_receive(ReceiveMode::PeekLock)
            .unwrap()
            .is_none()
    );
    assert_eq!(first.message.message_id.as_deref(), Some("2"));
    assert!(!first.message.application_properties.contains_key("marked"));
    assert_eq!(second.message.message_id.as_deref(), Some("2"));
    assert_eq!(
        second.message.application_properties.get("marked"),
        Some(&PropertyValue::Bool(true))
    );
    assert_ne!(first.sequence_number, second.sequence_number);
    assert!(ids(&sub("tagged")).await.is_empty(), "filter not matched");
    // The next message's number follows every copy's.
    let next = t.send(order("3", "created", "us", 0)).unwrap();
    assert!(next.sequence_number().unwrap() > second.sequence_number);
}

/// An action outside the supported subset is refused with the rule, from the config file as
/// from the run-time rule operations, never stored unapplied.
#[test]
fn a_bad_rule_action_is_refused() {
    let config = |action: &str| {
        Config::from_json(&format!(
            r#"{{"UserConfig":{{"Namespaces":[{{"Name":"ns","Queues":[],"Topics":[{{"Name":"t",
              "Subscriptions":[{{"Name":"s","Rules":[{{"Name":"r","Properties":{{"FilterType":"Sql",
              "SqlFilter":{{"SqlExpression":"1=1"}},"Action":{{"SqlExpression":"{action}"}}}}}}]}}]}}]}}],
              "Logging":{{"Type":"File"}}}}}}"#
        ))
    };
    assert!(config("SET a = 1").is_ok());
    let e = config("SET a = 1 + 1").unwrap_err().to_string();
    assert!(e.contains("invalid SQL rule action"), "{e}");
    assert!(config("DROP a").is_err());
    assert!(SqlRuleAction::parse("SET sys.MessageId = 'x'").is_err());
}
