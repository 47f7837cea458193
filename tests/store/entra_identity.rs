//! Which managed identity the SQL Server store asks for, seen from the identity endpoint: a
//! real `sb-inbox migrate` process with Container Apps' variables (`IDENTITY_ENDPOINT`,
//! `IDENTITY_HEADER`) pointed at a local fake endpoint that records each token request and
//! answers with a token; the SQL connection that follows goes to a closed port and fails.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

/// Serves token requests until the test ends; sends each request line on the channel.
fn fake_identity_endpoint() -> (String, mpsc::Receiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}/msi/token", listener.local_addr().unwrap());
    let (sent, received) = mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut request_line = String::new();
            let _ = reader.read_line(&mut request_line);
            let mut header_ok = false;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line.trim().is_empty() {
                    break;
                }
                header_ok |= line
                    .to_ascii_lowercase()
                    .starts_with("x-identity-header: h3ader");
            }
            let _ = sent.send(format!("{} header={header_ok}", request_line.trim()));
            let expires = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs()
                + 3600;
            let body = format!(
                r#"{{"access_token":"fake","expires_on":"{expires}","resource":"https://database.windows.net","token_type":"Bearer"}}"#
            );
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (endpoint, received)
}

/// A port nothing listens on.
fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// Runs `sb-inbox migrate` on an Entra-authenticated store string; returns the token requests.
fn token_requests(store_extra: &str, azure_client_id: Option<&str>) -> Vec<String> {
    let (endpoint, requests) = fake_identity_endpoint();
    let store = format!(
        "Server=tcp:127.0.0.1,{};Database=sbinbox;Encrypt=True;\
         Authentication=Active Directory Default{store_extra}",
        closed_port()
    );
    let mut command = Command::new(crate::support::cli::BINARY);
    command
        .arg("migrate")
        .env("SB_INBOX_STORE", store)
        .env("IDENTITY_ENDPOINT", &endpoint)
        .env("IDENTITY_HEADER", "h3ader")
        .env_remove("AZURE_FEDERATED_TOKEN_FILE")
        .env_remove("MSI_ENDPOINT")
        .env_remove("AZURE_CLIENT_ID");
    if let Some(id) = azure_client_id {
        command.env("AZURE_CLIENT_ID", id);
    }
    let output = command.output().unwrap();
    // The token was given; the SQL connection to the closed port fails.
    assert!(!output.status.success(), "{output:?}");
    let mut seen = Vec::new();
    while let Ok(request) = requests.recv_timeout(Duration::from_millis(200)) {
        seen.push(request);
    }
    assert!(
        !seen.is_empty(),
        "no token request reached the identity endpoint: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    seen
}

fn client_ids(requests: &[String]) -> Vec<Option<String>> {
    requests
        .iter()
        .map(|r| {
            r.split(['?', '&', ' '])
                .find_map(|part| part.strip_prefix("client_id="))
                .map(str::to_owned)
        })
        .collect()
}

#[test]
fn without_user_id_the_store_asks_for_the_identity_in_azure_client_id() {
    let requests = token_requests("", Some("11111111-aaaa-bbbb-cccc-000000000001"));
    assert_eq!(
        client_ids(&requests),
        vec![Some("11111111-aaaa-bbbb-cccc-000000000001".to_owned())],
        "{requests:?}"
    );
    assert!(requests[0].contains("resource=https"), "{requests:?}");
    assert!(requests[0].ends_with("header=true"), "{requests:?}");
}

#[test]
fn user_id_in_the_store_string_wins_over_azure_client_id() {
    let requests = token_requests(
        ";User Id=22222222-aaaa-bbbb-cccc-000000000002",
        Some("11111111-aaaa-bbbb-cccc-000000000001"),
    );
    assert_eq!(
        client_ids(&requests),
        vec![Some("22222222-aaaa-bbbb-cccc-000000000002".to_owned())],
        "{requests:?}"
    );
}

#[test]
fn with_neither_the_store_asks_for_the_system_assigned_identity() {
    let requests = token_requests("", None);
    assert_eq!(client_ids(&requests), vec![None], "{requests:?}");
}
