//! The credentials Secret: validation, and the password hashes the engines store.
//!
//! The plain password only ever lives in this process's memory: engines receive verifiers
//! (PostgreSQL's SCRAM-SHA-256, MySQL's `mysql_native_password` hash) in SQL sent on a
//! client's stdin, never in argv, a conninfo string, a log line or the report.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use k8s_openapi::api::core::v1::Secret;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// Longest password accepted, in bytes.
pub const MAX_PASSWORD_BYTES: usize = 1024;
/// The role/user and database when the Secret does not name them.
pub const DEFAULT_NAME: &str = "app";
/// PostgreSQL's default SCRAM iteration count (`scram_iterations`).
pub const SCRAM_ITERATIONS: u32 = 4096;

/// A password; `Debug` and `Display` never show it.
#[derive(Clone, PartialEq, Eq)]
pub struct Password(String);

impl Password {
    /// Validates `bytes` as a password (what the error says names the key, never the value).
    pub fn parse(secret: &str, bytes: &[u8]) -> Result<Self> {
        let bad = |why: &str| {
            Err(Error::Credentials(format!(
                "credentials Secret {secret}: key password {why}"
            )))
        };
        if bytes.is_empty() {
            return bad("is empty");
        }
        if bytes.len() > MAX_PASSWORD_BYTES {
            return bad(&format!("is longer than {MAX_PASSWORD_BYTES} bytes"));
        }
        let Ok(text) = std::str::from_utf8(bytes) else {
            return bad("is not valid UTF-8");
        };
        if text.chars().any(char::is_control) {
            return bad("contains control characters");
        }
        Ok(Password(text.to_string()))
    }

    /// The plain text (only for hashing; never log it).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Password(<redacted>)")
    }
}

/// What the agent takes from the credentials Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub dbname: String,
    pub password: Password,
    /// The Secret's `metadata.resourceVersion`.
    pub version: String,
}

impl Credentials {
    /// Reads and validates the Secret's `username`, `dbname` (both default to `app`) and
    /// `password`.
    pub fn from_secret(secret: &Secret) -> Result<Self> {
        let name = secret.metadata.name.clone().unwrap_or_default();
        let data = secret.data.clone().unwrap_or_default();
        let identifier = |key: &str| -> Result<String> {
            let Some(value) = data.get(key) else {
                return Ok(DEFAULT_NAME.to_string());
            };
            match std::str::from_utf8(&value.0) {
                Ok(v) if is_identifier(v) => Ok(v.to_string()),
                _ => Err(Error::Credentials(format!(
                    "credentials Secret {name}: key {key} must be 1-63 characters of [A-Za-z0-9_] not starting with a digit"
                ))),
            }
        };
        let password = match data.get("password") {
            Some(bytes) => Password::parse(&name, &bytes.0)?,
            None => {
                return Err(Error::Credentials(format!(
                    "credentials Secret {name}: key password is missing"
                )));
            }
        };
        Ok(Credentials {
            username: identifier("username")?,
            dbname: identifier("dbname")?,
            password,
            version: secret.metadata.resource_version.clone().unwrap_or_default(),
        })
    }
}

/// The replication role's default name.
pub const REPLICATION_USER: &str = "streaming_replica";

/// What the agent takes from the replication Secret (`username`, default
/// [`REPLICATION_USER`]; `password`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicationCredentials {
    pub username: String,
    pub password: Password,
    /// The Secret's `metadata.resourceVersion`.
    pub version: String,
}

impl ReplicationCredentials {
    pub fn from_secret(secret: &Secret) -> Result<Self> {
        let name = secret.metadata.name.clone().unwrap_or_default();
        let data = secret.data.clone().unwrap_or_default();
        let username = match data.get("username") {
            None => REPLICATION_USER.to_string(),
            Some(value) => match std::str::from_utf8(&value.0) {
                Ok(v) if is_identifier(v) && v != "postgres" => v.to_string(),
                _ => {
                    return Err(Error::Credentials(format!(
                        "replication Secret {name}: key username must be 1-63 characters of [A-Za-z0-9_] not starting with a digit, and not postgres"
                    )));
                }
            },
        };
        let password = match data.get("password") {
            Some(bytes) => Password::parse(&name, &bytes.0).map_err(|e| {
                Error::Credentials(e.to_string().replacen(
                    "credentials Secret",
                    "replication Secret",
                    1,
                ))
            })?,
            None => {
                return Err(Error::Credentials(format!(
                    "replication Secret {name}: key password is missing"
                )));
            }
        };
        Ok(ReplicationCredentials {
            username,
            password,
            version: secret.metadata.resource_version.clone().unwrap_or_default(),
        })
    }
}

/// One line of a libpq password file matching any host, port and database for `user`
/// (`:` and `\` escaped as libpq wants).
pub fn pgpass_line(user: &str, password: &Password) -> String {
    let escape = |s: &str| s.replace('\\', "\\\\").replace(':', "\\:");
    format!("*:*:*:{}:{}\n", escape(user), escape(password.expose()))
}

/// A plain SQL identifier that needs no quoting rules beyond double quotes/backticks.
pub fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && s.len() <= 63
}

/// PostgreSQL's SCRAM-SHA-256 verifier for `password` with a random 16-byte salt:
/// `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>` (RFC 5802/7677, as
/// PostgreSQL's `scram_build_secret` writes it).
///
/// PostgreSQL runs SASLprep on passwords; for ASCII passwords (what the operator generates)
/// that is the identity. Non-ASCII passwords are hashed as given, so one whose NFKC form
/// differs would not log in.
pub fn scram_sha256_verifier(password: &Password) -> String {
    let salt: [u8; 16] = rand::random();
    scram_sha256_verifier_with(password.expose().as_bytes(), &salt, SCRAM_ITERATIONS)
}

type HmacSha256 = Hmac<Sha256>;

fn hmac(key: &[u8], message: &[u8]) -> [u8; 32] {
    // HMAC accepts keys of any length, so `new_from_slice` cannot fail here.
    let mut mac = match HmacSha256::new_from_slice(key) {
        Ok(mac) => mac,
        Err(_) => unreachable!("HMAC takes keys of any length"),
    };
    mac.update(message);
    mac.finalize().into_bytes().into()
}

fn scram_keys(password: &[u8], salt: &[u8], iterations: u32) -> ([u8; 32], [u8; 32]) {
    let mut salted = [0u8; 32];
    pbkdf2::pbkdf2_hmac::<Sha256>(password, salt, iterations, &mut salted);
    let client_key = hmac(&salted, b"Client Key");
    let stored_key: [u8; 32] = Sha256::digest(client_key).into();
    let server_key = hmac(&salted, b"Server Key");
    (stored_key, server_key)
}

fn scram_sha256_verifier_with(password: &[u8], salt: &[u8], iterations: u32) -> String {
    let (stored_key, server_key) = scram_keys(password, salt, iterations);
    format!(
        "SCRAM-SHA-256${iterations}:{}${}:{}",
        STANDARD.encode(salt),
        STANDARD.encode(stored_key),
        STANDARD.encode(server_key)
    )
}

/// MySQL's `mysql_native_password` hash: `*` and the upper-case hex of SHA1(SHA1(password)).
pub fn mysql_native_hash(password: &Password) -> String {
    let inner = sha1::Sha1::digest(password.expose().as_bytes());
    let outer = sha1::Sha1::digest(inner);
    let mut out = String::with_capacity(41);
    out.push('*');
    for byte in outer {
        out.push_str(&format!("{byte:02X}"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use std::collections::BTreeMap;

    #[test]
    fn scram_matches_rfc7677() {
        // RFC 7677 section 3: user "user", password "pencil".
        let salt = STANDARD.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let (stored_key, server_key) = scram_keys(b"pencil", &salt, 4096);
        let auth_message = "n=user,r=rOprNGfwEbeRWgbNEkqO,\
r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096,\
c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
        let server_signature = hmac(&server_key, auth_message.as_bytes());
        assert_eq!(
            STANDARD.encode(server_signature),
            "6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
        );
        // ClientProof = ClientKey XOR HMAC(StoredKey, AuthMessage); StoredKey = H(ClientKey).
        let proof = STANDARD
            .decode("dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
            .unwrap();
        let signature = hmac(&stored_key, auth_message.as_bytes());
        let client_key: Vec<u8> = proof.iter().zip(signature).map(|(a, b)| a ^ b).collect();
        assert_eq!(<[u8; 32]>::from(Sha256::digest(&client_key)), stored_key);

        let verifier = scram_sha256_verifier(&Password("pencil".into()));
        let parts: Vec<&str> = verifier.split(['$', ':']).collect();
        assert_eq!(parts[0], "SCRAM-SHA-256");
        assert_eq!(parts[1], "4096");
        assert_eq!(STANDARD.decode(parts[2]).unwrap().len(), 16);
        assert_ne!(
            verifier,
            scram_sha256_verifier(&Password("pencil".into())),
            "salted"
        );
    }

    #[test]
    fn mysql_native_hash_matches_password_function() {
        // SELECT PASSWORD('password') on MySQL 5.7 / MariaDB.
        assert_eq!(
            mysql_native_hash(&Password("password".into())),
            "*2470C0C06DEE42FD1618BB99005ADCA2EC9D1E19"
        );
    }

    #[test]
    fn rejects_bad_passwords_without_echoing_them() {
        for (bytes, why) in [
            (&b""[..], "is empty"),
            (&b"a\0b"[..], "control characters"),
            (&b"line\nbreak"[..], "control characters"),
            (&[0xff, 0xfe][..], "not valid UTF-8"),
            (&[b'a'; 1025][..], "longer than 1024"),
        ] {
            let e = Password::parse("s", bytes).unwrap_err();
            assert!(e.to_string().contains(why), "{e}");
            assert_eq!(e.exit_code(), 65);
        }
        let ok = Password::parse("s", b"correct horse").unwrap();
        assert_eq!(format!("{ok:?}"), "Password(<redacted>)");
    }

    #[test]
    fn escapes_the_password_file() {
        assert_eq!(
            pgpass_line("streaming_replica", &Password(r"a:b\c".into())),
            "*:*:*:streaming_replica:a\\:b\\\\c\n"
        );
    }

    #[test]
    fn reads_the_replication_secret() {
        let mut secret = Secret::default();
        secret.metadata.name = Some("db-replication".into());
        secret.metadata.resource_version = Some("9".into());
        secret.data = Some(BTreeMap::from([(
            "password".to_string(),
            ByteString(b"pw".to_vec()),
        )]));
        let c = ReplicationCredentials::from_secret(&secret).unwrap();
        assert_eq!(
            (c.username.as_str(), c.version.as_str()),
            (REPLICATION_USER, "9")
        );
        secret
            .data
            .as_mut()
            .unwrap()
            .insert("password".into(), ByteString(vec![]));
        let e = ReplicationCredentials::from_secret(&secret).unwrap_err();
        assert_eq!(
            e.to_string(),
            "replication Secret db-replication: key password is empty"
        );
    }

    #[test]
    fn reads_the_secret() {
        let mut secret = Secret::default();
        secret.metadata.name = Some("db-credentials".into());
        secret.metadata.resource_version = Some("7".into());
        secret.data = Some(BTreeMap::from([(
            "password".to_string(),
            ByteString(b"pw".to_vec()),
        )]));
        let c = Credentials::from_secret(&secret).unwrap();
        assert_eq!(
            (c.username.as_str(), c.dbname.as_str(), c.version.as_str()),
            ("app", "app", "7")
        );
        secret
            .data
            .as_mut()
            .unwrap()
            .insert("username".into(), ByteString(b"x; DROP".to_vec()));
        assert!(
            Credentials::from_secret(&secret)
                .unwrap_err()
                .to_string()
                .contains("key username")
        );
        secret.data = None;
        assert!(
            Credentials::from_secret(&secret)
                .unwrap_err()
                .to_string()
                .contains("key password is missing")
        );
    }
}
