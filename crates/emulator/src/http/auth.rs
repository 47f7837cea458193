//! Who may call the management API: the `Authorization` header carries a shared access
//! signature (`SharedAccessSignature sr=…&sig=…&se=…&skn=…`, as the JavaScript SDK's
//! `SasServiceClientCredentials.signRequest` and Python's `ServiceBusSharedKeyCredentialPolicy`
//! write it) or an Entra ID token (`Bearer <jwt>`), checked as on `$cbs`.
//!
//! Every management operation, reads included, needs the Manage right: the service answers
//! 401 "Manage,EntityRead claim(s) are required" to Send or Listen keys (Microsoft Learn,
//! "Service Bus access control with Shared Access Signatures": Manage is required for
//! management operations).

use std::time::SystemTime;

use super::Host;
use crate::Rights;
use crate::sas;

/// Why a request is refused: its HTTP status and the detail for the error body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub(crate) status: u16,
    pub(crate) detail: String,
}

fn unauthorized(detail: impl Into<String>) -> Refusal {
    Refusal {
        status: 401,
        detail: detail.into(),
    }
}

/// Checks the `Authorization` header; `Ok` when it grants Manage.
pub(crate) fn authorize(
    header: Option<&str>,
    host: &dyn Host,
    now: SystemTime,
) -> Result<(), Refusal> {
    let Some(header) = header.map(str::trim).filter(|h| !h.is_empty()) else {
        return Err(unauthorized(
            "MissingToken: The authorization header was not found.",
        ));
    };
    let rights = if header.starts_with(sas::SAS_PREFIX) {
        let key_name = sas::key_name(header).unwrap_or_default();
        let Some((key, rights)) = host.key(&key_name) else {
            return Err(unauthorized(format!(
                "InvalidSignature: The token has an invalid signature (unknown key name '{key_name}')."
            )));
        };
        sas::verify(header, &key_name, key, now)
            .map_err(|e| unauthorized(format!("InvalidSignature: {e}.")))?;
        rights
    } else if let Some(token) = header.strip_prefix("Bearer ") {
        if !host.accepts_jwt() || token.trim().is_empty() {
            return Err(unauthorized(
                "InvalidIssuer: JWTs are not accepted by this emulator (start it with --accept-jwt).",
            ));
        }
        // Entra ID roles are not modelled: a JWT may do everything, as on `$cbs`.
        Rights::ALL
    } else {
        return Err(unauthorized(
            "MalformedToken: The credentials contained in the authorization header are not in the SharedAccessSignature or Bearer format.",
        ));
    };
    if !rights.manage {
        return Err(unauthorized(
            "Unauthorized access. 'Manage,EntityRead' claim(s) are required to perform this operation.",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::EmulatorOptions;
    use crate::{Right, SharedAccessPolicy};
    use base64::Engine as _;

    fn sas(key_name: &str, key: &str, expiry: u64) -> String {
        let sr = "https%3a%2f%2flocalhost%2fq";
        let mac = ring::hmac::sign(
            &ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key.as_bytes()),
            format!("{sr}\n{expiry}").as_bytes(),
        );
        let sig = base64::engine::general_purpose::STANDARD.encode(mac.as_ref());
        let sig: String =
            percent_encoding::utf8_percent_encode(&sig, percent_encoding::NON_ALPHANUMERIC)
                .to_string();
        format!("SharedAccessSignature sr={sr}&sig={sig}&se={expiry}&skn={key_name}")
    }

    #[test]
    fn manage_keys_and_accepted_jwts_pass_everything_else_is_401() {
        let mut options = EmulatorOptions::default();
        options.policies.push(SharedAccessPolicy {
            name: "listen".into(),
            key: "lk".into(),
            rights: Rights::default().with(Right::Listen),
        });
        let now = SystemTime::now();
        let later = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + 300;
        let root = sas(&options.key_name, &options.key, later);
        assert_eq!(authorize(Some(&root), &options, now), Ok(()));
        let refused = |h: Option<&str>, o: &EmulatorOptions| {
            authorize(h, o, now).expect_err("refused").status
        };
        assert_eq!(refused(Some(&sas("listen", "lk", later)), &options), 401);
        assert_eq!(
            refused(Some(&sas(&options.key_name, "wrong", later)), &options),
            401
        );
        assert_eq!(
            refused(Some(&sas(&options.key_name, &options.key, 1)), &options),
            401
        );
        assert_eq!(refused(None, &options), 401);
        assert_eq!(refused(Some("Bearer eyJ"), &options), 401);
        options.accept_jwt = true;
        assert_eq!(authorize(Some("Bearer eyJ"), &options, now), Ok(()));
        assert_eq!(refused(Some("Basic abc"), &options), 401);
    }
}
