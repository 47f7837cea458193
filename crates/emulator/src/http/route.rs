//! Which resource a management request names: a pure function of its path.
//!
//! Paths as the SDKs build them: Python `_generated/operations/_operations.py` (`/{entityName}`,
//! `/{topicName}/subscriptions/{subscriptionName}/rules/{ruleName}`, `/$Resources/{entityType}`,
//! `/$namespaceinfo`), JavaScript `serviceBusAtomManagementClient.ts` (`Subscriptions`, `Rules`
//! capitalised). Keywords match case-insensitively; queue and topic names may contain `/`.

use percent_encoding::percent_decode_str;

/// A management resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Route {
    /// `GET /$Resources/queues`.
    ListQueues,
    /// `GET /$Resources/topics`.
    ListTopics,
    /// `GET /$namespaceinfo`.
    NamespaceInfo,
    /// A queue or topic: `/{name}`.
    Entity(String),
    /// `/{topic}/Subscriptions`.
    Subscriptions(String),
    /// `/{topic}/Subscriptions/{subscription}`.
    Subscription(String, String),
    /// `/{topic}/Subscriptions/{subscription}/Rules`.
    Rules(String, String),
    /// `/{topic}/Subscriptions/{subscription}/Rules/{rule}`.
    Rule(String, String, String),
}

/// The route of `path` (without its query), or `None` for an empty path.
pub(crate) fn route(path: &str) -> Option<Route> {
    let decoded = percent_decode_str(path).decode_utf8_lossy();
    let segments: Vec<&str> = decoded.trim_matches('/').split('/').collect();
    if segments.iter().all(|s| s.is_empty()) {
        return None;
    }
    let is = |s: &str, word: &str| s.eq_ignore_ascii_case(word);
    match segments.as_slice() {
        [r, kind] if is(r, "$Resources") && is(kind, "queues") => return Some(Route::ListQueues),
        [r, kind] if is(r, "$Resources") && is(kind, "topics") => return Some(Route::ListTopics),
        [info] if is(info, "$namespaceinfo") => return Some(Route::NamespaceInfo),
        _ => {}
    }
    // The last `Subscriptions` keyword with a topic before it splits the path: topic names
    // may contain `/`, subscription and rule names may not.
    if let Some(at) = segments
        .iter()
        .rposition(|s| is(s, "Subscriptions"))
        .filter(|at| *at > 0)
    {
        let topic = segments[..at].join("/");
        let rest = &segments[at + 1..];
        return match rest {
            [] => Some(Route::Subscriptions(topic)),
            [sub] => Some(Route::Subscription(topic, (*sub).to_owned())),
            [sub, rules] if is(rules, "Rules") => Some(Route::Rules(topic, (*sub).to_owned())),
            [sub, rules, rule] if is(rules, "Rules") => {
                Some(Route::Rule(topic, (*sub).to_owned(), (*rule).to_owned()))
            }
            _ => Some(Route::Entity(segments.join("/"))),
        };
    }
    Some(Route::Entity(segments.join("/")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_as_the_sdks_build_them() {
        let s = |v: &str| v.to_owned();
        let table = [
            ("/$Resources/queues", Some(Route::ListQueues)),
            ("/$resources/Topics", Some(Route::ListTopics)),
            ("/$namespaceinfo", Some(Route::NamespaceInfo)),
            ("/orders", Some(Route::Entity(s("orders")))),
            ("/a/b", Some(Route::Entity(s("a/b")))),
            ("/t/subscriptions", Some(Route::Subscriptions(s("t")))),
            (
                "/t/Subscriptions/s",
                Some(Route::Subscription(s("t"), s("s"))),
            ),
            (
                "/a/b/Subscriptions/s",
                Some(Route::Subscription(s("a/b"), s("s"))),
            ),
            (
                "/t/subscriptions/s/rules",
                Some(Route::Rules(s("t"), s("s"))),
            ),
            (
                "/t/Subscriptions/s/Rules/%24Default",
                Some(Route::Rule(s("t"), s("s"), s("$Default"))),
            ),
            // Near misses: a lone keyword is an entity name.
            ("/Subscriptions", Some(Route::Entity(s("Subscriptions")))),
            (
                "/$Resources/queue",
                Some(Route::Entity(s("$Resources/queue"))),
            ),
            ("/", None),
        ];
        for (path, expected) in table {
            assert_eq!(route(path), expected, "{path}");
        }
    }
}
