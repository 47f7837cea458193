//! Round trips of the vocabulary's named types and the spelling rules of its names.

use super::management::{DispositionStatus, Operation};
use super::{VENDOR_PREFIX, annotation::MessageState};

#[test]
fn operations_round_trip_through_their_wire_names() {
    for op in Operation::ALL {
        assert!(op.as_str().starts_with(VENDOR_PREFIX), "{op}");
        assert_eq!(Operation::from_name(op.as_str()), Some(op));
    }
    assert_eq!(Operation::from_name("com.microsoft:renew"), None);
    assert_eq!(Operation::from_name("renew-lock"), None);
}

#[test]
fn disposition_statuses_keep_the_services_spelling() {
    let names: Vec<_> = DispositionStatus::ALL.iter().map(|s| s.as_str()).collect();
    assert_eq!(names, ["completed", "abandoned", "suspended", "defered"]);
    for status in DispositionStatus::ALL {
        assert_eq!(DispositionStatus::from_name(status.as_str()), Some(status));
    }
    assert_eq!(DispositionStatus::from_name("deferred"), None);
}

#[test]
fn message_states_round_trip_through_their_codes() {
    for state in [
        MessageState::Active,
        MessageState::Deferred,
        MessageState::Scheduled,
    ] {
        assert_eq!(
            MessageState::from_code(i64::from(state.code())),
            Some(state)
        );
    }
    assert_eq!(MessageState::from_code(3), None);
}

#[test]
fn conditions_are_the_crates_one_module() {
    assert_eq!(
        super::condition::MESSAGE_LOCK_LOST,
        crate::condition::MESSAGE_LOCK_LOST
    );
}
