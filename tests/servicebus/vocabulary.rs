//! The shared wire vocabulary (`sb_amqp::servicebus`) against the constants of the official
//! SDKs: Python `azure-servicebus` (`azure/servicebus/_common/constants.py`) and JS
//! `@azure/core-amqp` (`Constants`): every name both spell must be spelled the same.

use sb_amqp::servicebus::management::{DispositionStatus, key, operation, request};
use sb_amqp::servicebus::{annotation, cbs, condition, dead_letter, link, management, rule};
use serde_json::Value;

/// The SDK's string, bytes and integer constants, by name.
async fn python_constants() -> serde_json::Map<String, Value> {
    let script = "import json\n\
        from azure.servicebus._common import constants as c\n\
        out = {}\n\
        for k, v in vars(c).items():\n\
        \x20   if isinstance(v, bytes): out[k] = v.decode()\n\
        \x20   elif isinstance(v, (str, int)) and not isinstance(v, bool): out[k] = v\n\
        print(json.dumps(out))\n";
    let output = tokio::process::Command::new(sb_testkit::python())
        .args(["-c", script])
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    match serde_json::from_slice(&output.stdout).unwrap() {
        Value::Object(map) => map,
        other => panic!("not an object: {other}"),
    }
}

#[tokio::test]
async fn the_vocabulary_spells_names_as_the_python_sdk_does() {
    if !crate::python::sdk_installed() {
        return;
    }
    let sdk = python_constants().await;
    let management_path = format!("/{}", management::NODE_SUFFIX);
    let ours: &[(&str, &str)] = &[
        ("LOCKTOKENNAME", annotation::LOCK_TOKEN),
        ("LOCKEDUNTILNAME", annotation::LOCKED_UNTIL),
        ("SEQUENCENUBMERNAME", annotation::SEQUENCE_NUMBER),
        ("ENQUEUEDTIMEUTCNAME", annotation::ENQUEUED_TIME),
        (
            "SCHEDULEDENQUEUETIMENAME",
            annotation::SCHEDULED_ENQUEUE_TIME,
        ),
        ("PARTITIONKEYNAME", annotation::PARTITION_KEY),
        ("DEADLETTERSOURCENAME", annotation::DEAD_LETTER_SOURCE),
        ("MESSAGE_STATE_NAME", annotation::MESSAGE_STATE),
        ("RECEIVER_LINK_DEAD_LETTER_REASON", dead_letter::REASON),
        (
            "RECEIVER_LINK_DEAD_LETTER_ERROR_DESCRIPTION",
            dead_letter::ERROR_DESCRIPTION,
        ),
        ("SESSION_FILTER", link::SESSION_FILTER),
        ("SESSION_LOCKED_UNTIL", link::LOCKED_UNTIL_UTC),
        ("OPERATION_TIMEOUT", link::OPERATION_TIMEOUT),
        ("DEADLETTERNAME", condition::DEAD_LETTER),
        ("ERROR_CODE_SESSION_LOCK_LOST", condition::SESSION_LOCK_LOST),
        ("ERROR_CODE_MESSAGE_LOCK_LOST", condition::MESSAGE_LOCK_LOST),
        ("ERROR_CODE_MESSAGE_NOT_FOUND", condition::MESSAGE_NOT_FOUND),
        ("ERROR_CODE_TIMEOUT", condition::TIMEOUT),
        (
            "ERROR_CODE_SESSION_CANNOT_BE_LOCKED",
            condition::SESSION_CANNOT_BE_LOCKED,
        ),
        ("ERROR_CODE_SERVER_BUSY", condition::SERVER_BUSY),
        ("ERROR_CODE_ENTITY_DISABLED", condition::ENTITY_DISABLED),
        (
            "ERROR_CODE_ENTITY_ALREADY_EXISTS",
            condition::ENTITY_ALREADY_EXISTS,
        ),
        ("REQUEST_RESPONSE_OPERATION_NAME", request::OPERATION),
        ("REQUEST_RESPONSE_TIMEOUT", request::SERVER_TIMEOUT),
        ("ASSOCIATEDLINKPROPERTYNAME", request::ASSOCIATED_LINK_NAME),
        (
            "REQUEST_RESPONSE_RENEWLOCK_OPERATION",
            operation::RENEW_LOCK,
        ),
        (
            "REQUEST_RESPONSE_RENEW_SESSION_LOCK_OPERATION",
            operation::RENEW_SESSION_LOCK,
        ),
        (
            "REQUEST_RESPONSE_RECEIVE_BY_SEQUENCE_NUMBER",
            operation::RECEIVE_BY_SEQUENCE_NUMBER,
        ),
        (
            "REQUEST_RESPONSE_SCHEDULE_MESSAGE_OPERATION",
            operation::SCHEDULE_MESSAGE,
        ),
        (
            "REQUEST_RESPONSE_CANCEL_SCHEDULED_MESSAGE_OPERATION",
            operation::CANCEL_SCHEDULED_MESSAGE,
        ),
        ("REQUEST_RESPONSE_PEEK_OPERATION", operation::PEEK_MESSAGE),
        (
            "REQUEST_RESPONSE_UPDATE_DISPOSTION_OPERATION",
            operation::UPDATE_DISPOSITION,
        ),
        (
            "REQUEST_RESPONSE_GET_SESSION_STATE_OPERATION",
            operation::GET_SESSION_STATE,
        ),
        (
            "REQUEST_RESPONSE_SET_SESSION_STATE_OPERATION",
            operation::SET_SESSION_STATE,
        ),
        (
            "REQUEST_RESPONSE_GET_MESSAGE_SESSIONS_OPERATION",
            operation::GET_MESSAGE_SESSIONS,
        ),
        ("REQUEST_RESPONSE_ADD_RULE_OPERATION", operation::ADD_RULE),
        (
            "REQUEST_RESPONSE_REMOVE_RULE_OPERATION",
            operation::REMOVE_RULE,
        ),
        (
            "REQUEST_RESPONSE_GET_RULES_OPERATION",
            operation::ENUMERATE_RULES,
        ),
        ("MANAGEMENT_PATH_SUFFIX", &management_path),
        ("MGMT_RESPONSE_SESSION_STATE", key::SESSION_STATE),
        ("MGMT_RESPONSE_MESSAGE_EXPIRATION", key::EXPIRATIONS),
        ("MGMT_RESPONSE_RECEIVER_EXPIRATION", key::EXPIRATION),
        (
            "MGMT_RESPONSE_MESSAGE_ERROR_CONDITION",
            management::reply::ERROR_CONDITION,
        ),
        ("MGMT_REQUEST_SESSION_ID", key::SESSION_ID),
        ("MGMT_REQUEST_SESSION_STATE", key::SESSION_STATE),
        ("MGMT_REQUEST_DISPOSITION_STATUS", key::DISPOSITION_STATUS),
        ("MGMT_REQUEST_LOCK_TOKENS", key::LOCK_TOKENS),
        ("MGMT_REQUEST_SEQUENCE_NUMBERS", key::SEQUENCE_NUMBERS),
        (
            "MGMT_REQUEST_RECEIVER_SETTLE_MODE",
            key::RECEIVER_SETTLE_MODE,
        ),
        (
            "MGMT_REQUEST_FROM_SEQUENCE_NUMBER",
            key::FROM_SEQUENCE_NUMBER,
        ),
        ("MGMT_REQUEST_MAX_MESSAGE_COUNT", key::MESSAGE_COUNT),
        ("MGMT_REQUEST_MESSAGE", key::MESSAGE),
        ("MGMT_REQUEST_MESSAGES", key::MESSAGES),
        ("MGMT_REQUEST_MESSAGE_ID", key::MESSAGE_ID),
        ("MGMT_REQUEST_DEAD_LETTER_REASON", key::DEAD_LETTER_REASON),
        (
            "MGMT_REQUEST_DEAD_LETTER_ERROR_DESCRIPTION",
            key::DEAD_LETTER_DESCRIPTION,
        ),
        ("SETTLEMENT_COMPLETE", DispositionStatus::Completed.as_str()),
        ("SETTLEMENT_ABANDON", DispositionStatus::Abandoned.as_str()),
        ("SETTLEMENT_DEFER", DispositionStatus::Deferred.as_str()),
        (
            "SETTLEMENT_DEADLETTER",
            DispositionStatus::Suspended.as_str(),
        ),
        ("TOKEN_TYPE_JWT", cbs::token_type::JWT),
        ("TOKEN_TYPE_SASTOKEN", cbs::token_type::SAS_TOKEN),
    ];
    for (name, spelled) in ours {
        assert_eq!(
            sdk.get(*name).and_then(Value::as_str),
            Some(*spelled),
            "{name}"
        );
    }
    assert_eq!(
        sdk.get("DATETIMEOFFSET_EPOCH").and_then(Value::as_i64),
        Some(link::TICKS_AT_UNIX_EPOCH)
    );
}

/// `Constants` of `@azure/core-amqp` as the JS SDK installed it.
async fn js_constants() -> Value {
    let script =
        "import { Constants } from '@azure/core-amqp'; console.log(JSON.stringify(Constants));";
    let output = tokio::process::Command::new("node")
        .args(["--input-type=module", "-e", script])
        .current_dir(crate::js::DIR)
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

#[tokio::test]
async fn the_vocabulary_spells_names_as_the_js_sdk_does() {
    if !crate::js::sdk_installed() {
        return;
    }
    let sdk = js_constants().await;
    let ours: &[(&str, &str)] = &[
        ("/enqueuedTime", annotation::ENQUEUED_TIME),
        ("/sequenceNumber", annotation::SEQUENCE_NUMBER),
        ("/scheduledEnqueueTime", annotation::SCHEDULED_ENQUEUE_TIME),
        ("/lockedUntil", annotation::LOCKED_UNTIL),
        ("/partitionKey", annotation::PARTITION_KEY),
        ("/deadLetterSource", annotation::DEAD_LETTER_SOURCE),
        ("/messageState", annotation::MESSAGE_STATE),
        ("/statusCode", cbs::reply::STATUS_CODE),
        ("/statusDescription", cbs::reply::STATUS_DESCRIPTION),
        ("/errorCondition", cbs::reply::ERROR_CONDITION),
        ("/cbsEndpoint", cbs::NODE),
        ("/operationPutToken", cbs::PUT_TOKEN),
        ("/operations/putToken", cbs::PUT_TOKEN),
        ("/management", management::NODE_SUFFIX),
        ("/sessionFilterName", link::SESSION_FILTER),
        ("/deadLetterName", condition::DEAD_LETTER),
        ("/serverTimeout", request::SERVER_TIMEOUT),
        ("/associatedLinkName", request::ASSOCIATED_LINK_NAME),
        ("/receiverSettleMode", key::RECEIVER_SETTLE_MODE),
        ("/dispositionStatus", key::DISPOSITION_STATUS),
        ("/fromSequenceNumber", key::FROM_SEQUENCE_NUMBER),
        ("/messageCount", key::MESSAGE_COUNT),
        ("/lockTokens", key::LOCK_TOKENS),
        ("/messageIdMapKey", key::MESSAGE_ID),
        ("/lockTokenMapKey", key::LOCK_TOKEN),
        ("/sessionIdMapKey", key::SESSION_ID),
        ("/sequenceNumbers", key::SEQUENCE_NUMBERS),
        ("/deadLetterReason", key::DEAD_LETTER_REASON),
        ("/deadLetterDescription", key::DEAD_LETTER_DESCRIPTION),
        ("/propertiesToModify", key::PROPERTIES_TO_MODIFY),
        ("/message", key::MESSAGE),
        (
            "/operations/cancelScheduledMessage",
            operation::CANCEL_SCHEDULED_MESSAGE,
        ),
        ("/operations/scheduleMessage", operation::SCHEDULE_MESSAGE),
        ("/operations/renewLock", operation::RENEW_LOCK),
        ("/operations/peekMessage", operation::PEEK_MESSAGE),
        (
            "/operations/receiveBySequenceNumber",
            operation::RECEIVE_BY_SEQUENCE_NUMBER,
        ),
        (
            "/operations/updateDisposition",
            operation::UPDATE_DISPOSITION,
        ),
        (
            "/operations/renewSessionLock",
            operation::RENEW_SESSION_LOCK,
        ),
        ("/operations/setSessionState", operation::SET_SESSION_STATE),
        ("/operations/getSessionState", operation::GET_SESSION_STATE),
        (
            "/operations/enumerateSessions",
            operation::GET_MESSAGE_SESSIONS,
        ),
        ("/operations/addRule", operation::ADD_RULE),
        ("/operations/removeRule", operation::REMOVE_RULE),
        ("/operations/enumerateRules", operation::ENUMERATE_RULES),
    ];
    for (path, spelled) in ours {
        assert_eq!(
            sdk.pointer(path).and_then(Value::as_str),
            Some(*spelled),
            "{path}"
        );
    }
    let codes: &[(&str, u64)] = &[
        ("ruleDescriptionList", rule::descriptor::RULE_DESCRIPTION),
        ("sqlFilterList", rule::descriptor::SQL_FILTER),
        (
            "correlationFilterList",
            rule::descriptor::CORRELATION_FILTER,
        ),
        ("sqlRuleActionList", rule::descriptor::SQL_RULE_ACTION),
        ("trueFilterList", rule::descriptor::TRUE_FILTER),
        ("falseFilterList", rule::descriptor::FALSE_FILTER),
    ];
    for (name, code) in codes {
        assert_eq!(
            sdk.pointer(&format!("/descriptorCodes/{name}"))
                .and_then(Value::as_u64),
            Some(*code),
            "{name}"
        );
    }
}
