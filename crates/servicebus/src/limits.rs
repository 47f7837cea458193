//! What a peer (the service, or whatever answers in its place: a misconfigured endpoint, a
//! man-in-the-middle) can make the client buffer: the `max-message-size` our receiving links
//! advertise, which the engine enforces on the frame that passes it (the link is detached with
//! `amqp:link:message-size-exceeded` and its bytes freed), and the connection-wide bound on
//! bytes held in unfinished deliveries.

/// The largest delivery a receive link takes: Service Bus Premium's largest message
/// (`MaxMessageSizeInKilobytes` up to 102 400, i.e. 100 MiB; "Azure Service Bus quotas",
/// learn.microsoft.com/azure/service-bus-messaging/service-bus-quotas) plus 64 KiB for what the
/// service adds on delivery (lock token, sequence number, enqueued and locked-until times).
pub(crate) const MAX_RECEIVED_MESSAGE_SIZE: u64 = 100 * 1024 * 1024 + 64 * 1024;

/// The largest `$cbs` reply taken: a status code and a description
/// (`sb_amqp::servicebus::cbs::reply`); 64 KiB is ample.
pub(crate) const CBS_MAX_REPLY_SIZE: u64 = 64 * 1024;

/// The largest `$management` reply taken: peek and receive-by-sequence-number replies carry
/// whole messages (`messages: list<map{message: binary}>`), so as much as one received message.
pub(crate) const MANAGEMENT_MAX_REPLY_SIZE: u64 = MAX_RECEIVED_MESSAGE_SIZE;

/// Bytes all unfinished deliveries of one connection may hold together: one largest message on
/// a receive link and one on a management link at once.
pub(crate) const MAX_UNFINISHED_BYTES: u64 = 2 * MAX_RECEIVED_MESSAGE_SIZE;
const _: () =
    assert!(MAX_UNFINISHED_BYTES >= MAX_RECEIVED_MESSAGE_SIZE + MANAGEMENT_MAX_REPLY_SIZE);

/// The reply bound for a node address (`$cbs`, or an entity's `$management`).
pub(crate) fn max_reply_size(node: &str) -> u64 {
    if node.eq_ignore_ascii_case(sb_amqp::servicebus::cbs::NODE) {
        CBS_MAX_REPLY_SIZE
    } else {
        MANAGEMENT_MAX_REPLY_SIZE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cbs_replies_are_bounded_tighter_than_management_replies() {
        assert_eq!(max_reply_size("$cbs"), 64 * 1024);
        assert_eq!(max_reply_size("$CBS"), 64 * 1024);
        assert_eq!(
            max_reply_size("orders/$management"),
            MAX_RECEIVED_MESSAGE_SIZE
        );
    }
}
