//! The management operations and the service's answers (Microsoft Learn, "Service Bus
//! management REST API": Create/Get/Update/Delete/List for queues, topics, subscriptions and
//! rules):
//! - `GET` of a missing entity is `200` with an empty feed (what both SDKs read as "not
//!   found": JS `getResource`, Python `_management_client.py` `if not entry.content`);
//! - `PUT` creates (`201`, `409` when it exists) or, with `If-Match: *`, updates (`200`,
//!   `404` when missing);
//! - `DELETE` answers `200`, or `404`;
//! - lists page with `$skip`/`$top` and a `next` link while more remain (Python
//!   `extract_data_template` takes the second `link` as the next page);
//! - errors carry `<Error><Code>…</Code><Detail>…</Detail></Error>`.

use std::time::SystemTime;

use crate::broker::EntityDescription;
use crate::config::{QueueConfig, SubscriptionConfig, TopicConfig};
use crate::error::Error;
use crate::{Broker, EntityPath};

use super::route::{Route, route};
use super::{Host, Request, Response, atom, auth, xml};

/// The content type of Atom answers.
pub(crate) const XML: &str = "application/atom+xml;type=entry;charset=utf-8";

fn ok(status: u16, body: String) -> Response {
    Response {
        status,
        content_type: XML,
        body,
    }
}

fn fail(status: u16, detail: impl AsRef<str>) -> Response {
    Response {
        status,
        content_type: "application/xml; charset=utf-8",
        body: atom::error(status, detail.as_ref()),
    }
}

fn from_error(error: &Error) -> Response {
    match error {
        Error::NotFound { .. } => fail(404, format!("{error} TrackingId: emulator")),
        Error::AlreadyExists { .. } => fail(
            409,
            format!("SubCode=40900. Conflict. The messaging entity already exists: {error}"),
        ),
        Error::InvalidAddress { .. } | Error::InvalidRule { .. } | Error::NotAllowed { .. } => {
            fail(400, error.to_string())
        }
        _ => fail(500, error.to_string()),
    }
}

/// Where this request was sent, for entry ids and links: `https://<Host>`.
fn base(req: &Request) -> String {
    format!("https://{}", req.header("host").unwrap_or("localhost"))
}

fn query_number(query: &str, name: &str) -> Option<usize> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        let k = percent_encoding::percent_decode_str(k).decode_utf8_lossy();
        (k == name).then(|| v.parse().ok()).flatten()
    })
}

/// What every operation of one request reads: the broker, where the request was sent (for
/// entry ids and links), the broker's time and the page asked for (`$skip`, `$top`).
struct Ctx<'a> {
    broker: &'a Broker,
    base: String,
    now: SystemTime,
    page: (usize, usize),
}

/// Answers one request: the resource its path names, the caller's right to manage, then the
/// method's operation on that resource (`405` for a method the resource does not take).
pub(crate) fn handle(req: &Request, broker: &Broker, host: &dyn Host) -> Response {
    let (path, query) = req.target.split_once('?').unwrap_or((&req.target, ""));
    let Some(route) = route(path) else {
        return fail(404, "No entity in the request path.");
    };
    if let Err(refusal) = auth::authorize(req.header("authorization"), host, SystemTime::now()) {
        return fail(refusal.status, refusal.detail);
    }
    let ctx = Ctx {
        broker,
        base: base(req),
        now: broker.clock().now(),
        page: (
            query_number(query, "$skip").unwrap_or(0),
            query_number(query, "$top").unwrap_or(100),
        ),
    };
    let answer = match req.method.to_ascii_uppercase().as_str() {
        "GET" => Some(get(&ctx, route)),
        "PUT" => put(req, &ctx, route),
        "DELETE" => delete(broker, route),
        _ => None,
    };
    answer.unwrap_or_else(|| {
        fail(
            405,
            format!("{} is not supported on this resource.", req.method),
        )
    })
}

/// `GET`: every resource can be read; a missing entity, subscription or rule is an empty feed.
fn get(ctx: &Ctx<'_>, route: Route) -> Response {
    match route {
        Route::ListQueues => list(ctx, "queues", "Queues", &ctx.broker.queues()),
        Route::ListTopics => list(ctx, "topics", "Topics", &ctx.broker.topics()),
        Route::NamespaceInfo => ok(200, namespace_info(&ctx.base, ctx.broker, ctx.now)),
        Route::Entity(name) => get_entity(ctx, &name),
        Route::Subscriptions(topic) => list_subscriptions(ctx, &topic),
        Route::Subscription(topic, sub) => get_subscription(ctx, &topic, &sub),
        Route::Rules(topic, sub) => list_rules(ctx, &topic, &sub),
        Route::Rule(topic, sub, name) => get_rule(ctx, &topic, &sub, &name),
    }
}

/// `PUT`: create, or update with `If-Match: *`; only entities, subscriptions and rules.
fn put(req: &Request, ctx: &Ctx<'_>, route: Route) -> Option<Response> {
    let update = req.header("if-match").is_some();
    let (broker, base) = (ctx.broker, ctx.base.as_str());
    Some(match route {
        Route::Entity(name) => put_entity(req, broker, base, &name, update),
        Route::Subscription(topic, sub) => {
            put_subscription(req, broker, base, &topic, &sub, update)
        }
        Route::Rule(topic, sub, name) => put_rule(req, broker, base, &topic, &sub, &name, update),
        _ => return None,
    })
}

/// `DELETE`: only entities, subscriptions and rules.
fn delete(broker: &Broker, route: Route) -> Option<Response> {
    let done = match route {
        Route::Entity(name) => broker.delete_entity(&name),
        Route::Subscription(topic, sub) => broker.delete_subscription(&topic, &sub),
        Route::Rule(topic, sub, name) => broker
            .resolve(&EntityPath::subscription(&topic, &sub))
            .and_then(|e| e.remove_rule(&name)),
        _ => return None,
    };
    Some(match done {
        Ok(()) => ok(200, String::new()),
        Err(e) => from_error(&e),
    })
}

/// What the service answers for a resource that does not exist: `200` with an empty feed
/// (see the module docs).
fn absent(ctx: &Ctx<'_>, id: &str, title: &str) -> Response {
    ok(200, atom::feed(id, title, ctx.now, &[], None))
}

/// One page of `entries` (of `total`) as a feed, with a `next` link while more remain.
fn page_feed(ctx: &Ctx<'_>, id: &str, title: &str, entries: &[String], total: usize) -> Response {
    let next = next_link(id, total, ctx.page);
    ok(
        200,
        atom::feed(id, title, ctx.now, entries, next.as_deref()),
    )
}

fn get_entity(ctx: &Ctx<'_>, name: &str) -> Response {
    let described = ctx
        .broker
        .describe_queue(name)
        .or_else(|_| ctx.broker.describe_topic(name));
    match described {
        Ok(d) => ok(200, entity_entry(&ctx.base, name, &d)),
        Err(_) => absent(ctx, &format!("{}/{name}", ctx.base), name),
    }
}

fn list_subscriptions(ctx: &Ctx<'_>, topic: &str) -> Response {
    let subs = match ctx.broker.subscriptions(topic) {
        Ok(subs) => subs,
        Err(e) => return from_error(&e),
    };
    let entries: Vec<String> = paged(&subs, ctx.page)
        .iter()
        .map(|d| subscription_entry(&ctx.base, topic, d))
        .collect();
    let id = format!("{}/{topic}/Subscriptions", ctx.base);
    page_feed(ctx, &id, "Subscriptions", &entries, subs.len())
}

fn get_subscription(ctx: &Ctx<'_>, topic: &str, sub: &str) -> Response {
    match ctx.broker.describe_subscription(topic, sub) {
        Ok(d) => ok(200, subscription_entry(&ctx.base, topic, &d)),
        Err(_) => absent(
            ctx,
            &format!("{}/{topic}/Subscriptions/{sub}", ctx.base),
            sub,
        ),
    }
}

fn list_rules(ctx: &Ctx<'_>, topic: &str, sub: &str) -> Response {
    let rules = match rules(ctx.broker, topic, sub) {
        Ok(rules) => rules,
        Err(e) => return from_error(&e),
    };
    let entries: Vec<String> = paged(&rules, ctx.page)
        .iter()
        .map(|(r, created)| rule_entry(&ctx.base, topic, sub, r, *created))
        .collect();
    let id = format!("{}/{topic}/Subscriptions/{sub}/Rules", ctx.base);
    page_feed(ctx, &id, "Rules", &entries, rules.len())
}

fn get_rule(ctx: &Ctx<'_>, topic: &str, sub: &str, name: &str) -> Response {
    let found = rules(ctx.broker, topic, sub).ok().and_then(|rules| {
        rules
            .into_iter()
            .find(|(r, _)| r.name.eq_ignore_ascii_case(name))
    });
    match found {
        Some((r, created)) => ok(200, rule_entry(&ctx.base, topic, sub, &r, created)),
        None => absent(
            ctx,
            &format!("{}/{topic}/Subscriptions/{sub}/Rules/{name}", ctx.base),
            name,
        ),
    }
}

fn rules(broker: &Broker, topic: &str, sub: &str) -> crate::Result<Vec<(crate::Rule, SystemTime)>> {
    broker
        .resolve(&EntityPath::subscription(topic, sub))?
        .rules()
}

fn paged<T>(items: &[T], (skip, top): (usize, usize)) -> &[T] {
    let start = skip.min(items.len());
    let end = start.saturating_add(top).min(items.len());
    &items[start..end]
}

fn next_link(id: &str, total: usize, (skip, top): (usize, usize)) -> Option<String> {
    (skip.saturating_add(top) < total && top > 0)
        .then(|| format!("{id}?$skip={}&$top={top}&api-version=2021-05", skip + top))
}

fn list(ctx: &Ctx<'_>, kind: &str, title: &str, items: &[EntityDescription]) -> Response {
    let entries: Vec<String> = paged(items, ctx.page)
        .iter()
        .map(|d| entity_entry(&ctx.base, &d.name, d))
        .collect();
    let id = format!("{}/$Resources/{kind}", ctx.base);
    page_feed(ctx, &id, title, &entries, items.len())
}

fn entity_entry(base: &str, name: &str, d: &EntityDescription) -> String {
    atom::entry(
        &format!("{base}/{name}?api-version=2021-05"),
        &d.name,
        (d.created, d.updated),
        &atom::description(d),
    )
}

fn subscription_entry(base: &str, topic: &str, d: &EntityDescription) -> String {
    atom::entry(
        &format!(
            "{base}/{topic}/Subscriptions/{}?api-version=2021-05",
            d.name
        ),
        &d.name,
        (d.created, d.updated),
        &atom::description(d),
    )
}

fn rule_entry(
    base: &str,
    topic: &str,
    sub: &str,
    rule: &crate::Rule,
    created: SystemTime,
) -> String {
    atom::entry(
        &format!(
            "{base}/{topic}/Subscriptions/{sub}/Rules/{}?api-version=2021-05",
            rule.name
        ),
        &rule.name,
        (created, created),
        &atom::rule(rule, created),
    )
}

fn namespace_info(base: &str, broker: &Broker, now: SystemTime) -> String {
    let info = format!(
        r#"<NamespaceInfo xmlns="http://schemas.microsoft.com/netservices/2010/10/servicebus/connect" xmlns:i="http://www.w3.org/2001/XMLSchema-instance"><CreatedTime>{t}</CreatedTime><MessagingSKU>Standard</MessagingSKU><ModifiedTime>{t}</ModifiedTime><Name>{}</Name><NamespaceType>Messaging</NamespaceType></NamespaceInfo>"#,
        xml::escape(broker.namespace()),
        t = atom::format_time(now)
    );
    atom::entry(
        &format!("{base}/$namespaceinfo"),
        broker.namespace(),
        (now, now),
        &info,
    )
}

fn body(req: &Request) -> Result<xml::Element, Response> {
    xml::parse(&req.body).map_err(|e| fail(400, e.to_string()))
}

fn put_entity(req: &Request, broker: &Broker, base: &str, name: &str, update: bool) -> Response {
    let doc = match body(req) {
        Ok(doc) => doc,
        Err(r) => return r,
    };
    let result = if let Some(queue) = doc.find("QueueDescription") {
        atom::entity_properties(queue)
            .map_err(|e| fail(400, e.to_string()))
            .and_then(|props| {
                let done = if update {
                    broker.update_queue(name, props)
                } else {
                    broker.create_queue(QueueConfig::new(name).with_properties(props))
                };
                done.and_then(|()| broker.describe_queue(name))
                    .map_err(|e| from_error(&e))
            })
    } else if let Some(topic) = doc.find("TopicDescription") {
        atom::topic_properties(topic)
            .map_err(|e| fail(400, e.to_string()))
            .and_then(|props| {
                let done = if update {
                    broker.update_topic(name, props)
                } else {
                    broker.create_topic(TopicConfig::new(name).with_properties(props))
                };
                done.and_then(|()| broker.describe_topic(name))
                    .map_err(|e| from_error(&e))
            })
    } else {
        Err(fail(
            400,
            "The request body has no QueueDescription or TopicDescription.",
        ))
    };
    match result {
        Ok(d) => ok(if update { 200 } else { 201 }, entity_entry(base, name, &d)),
        Err(r) => r,
    }
}

fn put_subscription(
    req: &Request,
    broker: &Broker,
    base: &str,
    topic: &str,
    sub: &str,
    update: bool,
) -> Response {
    let doc = match body(req) {
        Ok(doc) => doc,
        Err(r) => return r,
    };
    let Some(el) = doc.find("SubscriptionDescription") else {
        return fail(400, "The request body has no SubscriptionDescription.");
    };
    let props = match atom::entity_properties(el) {
        Ok(p) => p,
        Err(e) => return fail(400, e.to_string()),
    };
    let mut config = SubscriptionConfig::new(sub).with_properties(props.clone());
    // A default rule given with the subscription (JS `createSubscription(…, {defaultRuleOptions})`).
    if let Some(rule) = el.child("DefaultRuleDescription") {
        let name = rule.text_of("Name").unwrap_or("$Default").to_owned();
        match atom::rule_from(rule, &name) {
            Ok(r) => config = config.with_rule(r),
            Err(e) => return fail(400, e.to_string()),
        }
    }
    let done = if update {
        broker.update_subscription(topic, sub, props)
    } else {
        broker.create_subscription(topic, config)
    };
    match done.and_then(|()| broker.describe_subscription(topic, sub)) {
        Ok(d) => ok(
            if update { 200 } else { 201 },
            subscription_entry(base, topic, &d),
        ),
        Err(e) => from_error(&e),
    }
}

fn put_rule(
    req: &Request,
    broker: &Broker,
    base: &str,
    topic: &str,
    sub: &str,
    name: &str,
    update: bool,
) -> Response {
    let doc = match body(req) {
        Ok(doc) => doc,
        Err(r) => return r,
    };
    let Some(el) = doc.find("RuleDescription") else {
        return fail(400, "The request body has no RuleDescription.");
    };
    let rule = match atom::rule_from(el, name) {
        Ok(r) => r,
        Err(e) => return fail(400, e.to_string()),
    };
    let entity = match broker.resolve(&EntityPath::subscription(topic, sub)) {
        Ok(e) => e,
        Err(e) => return from_error(&e),
    };
    let done = if update {
        entity
            .remove_rule(name)
            .and_then(|()| entity.add_rule(rule.clone()))
    } else {
        entity.add_rule(rule.clone())
    };
    if let Err(e) = done {
        return from_error(&e);
    }
    let created = entity
        .rules()
        .ok()
        .and_then(|rules| rules.into_iter().find(|(r, _)| r.name == rule.name))
        .map_or(broker.clock().now(), |(_, t)| t);
    ok(
        if update { 200 } else { 201 },
        rule_entry(base, topic, sub, &rule, created),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::EmulatorOptions;
    use crate::{Config, QueueConfig};

    fn request(method: &str, target: &str, auth: Option<&str>, body: &str) -> Request {
        let mut headers = vec![("Host".to_owned(), "localhost:5671".to_owned())];
        if let Some(auth) = auth {
            headers.push(("Authorization".to_owned(), auth.to_owned()));
        }
        Request {
            method: method.to_owned(),
            target: target.to_owned(),
            headers,
            body: body.as_bytes().to_vec(),
        }
    }

    const QUEUE: &str = r#"<entry xmlns="http://www.w3.org/2005/Atom"><content type="application/xml"><QueueDescription xmlns="http://schemas.microsoft.com/netservices/2010/10/servicebus/connect"><LockDuration>PT20S</LockDuration></QueueDescription></content></entry>"#;

    #[test]
    fn the_services_status_codes() {
        let broker = Broker::new(Config::new("ns").with_queue(QueueConfig::new("q"))).unwrap();
        let options = EmulatorOptions {
            accept_jwt: true,
            ..EmulatorOptions::default()
        };
        let jwt = Some("Bearer eyJ");
        let call = |method: &str, target: &str, auth: Option<&str>, body: &str| {
            handle(&request(method, target, auth, body), &broker, &options)
        };
        // Unauthenticated: 401 with the service's error body.
        let refused = call("GET", "/q?api-version=2021-05", None, "");
        assert_eq!(refused.status, 401);
        assert!(
            refused.body.starts_with("<Error><Code>401</Code>"),
            "{}",
            refused.body
        );
        // A missing entity is an empty feed, not a 404.
        let missing = call("GET", "/nope?api-version=2021-05", jwt, "");
        assert_eq!(missing.status, 200);
        assert!(missing.body.starts_with("<feed") && !missing.body.contains("<entry"));
        // Create 201, again 409; update of a missing one 404; delete 200, again 404.
        assert_eq!(call("PUT", "/made", jwt, QUEUE).status, 201);
        assert_eq!(call("PUT", "/made", jwt, QUEUE).status, 409);
        let mut update = request("PUT", "/other", jwt, QUEUE);
        update.headers.push(("If-Match".to_owned(), "*".to_owned()));
        assert_eq!(handle(&update, &broker, &options).status, 404);
        assert_eq!(
            broker.entity("made").unwrap().lock_duration(),
            Some(std::time::Duration::from_secs(20))
        );
        assert_eq!(call("DELETE", "/made", jwt, "").status, 200);
        assert_eq!(call("DELETE", "/made", jwt, "").status, 404);
        assert_eq!(call("PUT", "/bad", jwt, "<entry>").status, 400);
        assert_eq!(call("POST", "/q", jwt, "").status, 405);
        // Paging: three queues by pages of two, the first with a next link.
        assert_eq!(call("PUT", "/q2", jwt, QUEUE).status, 201);
        assert_eq!(call("PUT", "/q3", jwt, QUEUE).status, 201);
        let first = call("GET", "/$Resources/queues?$skip=0&$top=2", jwt, "");
        assert_eq!(first.body.matches("<entry").count(), 2);
        assert!(first.body.contains(r#"rel="next""#), "{}", first.body);
        let last = call("GET", "/$Resources/queues?$skip=2&$top=2", jwt, "");
        assert_eq!(last.body.matches("<entry").count(), 1);
        assert!(!last.body.contains(r#"rel="next""#));
    }
}
