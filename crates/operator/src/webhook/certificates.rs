//! The webhook server's certificate: made here (rcgen) and kept in a Secret every replica
//! shares, or read from files someone else manages (cert-manager); served through a
//! resolver so a renewed certificate is used from the next handshake on, without a restart.

use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use super::WebhookError;

/// A serving certificate with its key, and the CA certificates clients should trust (PEM).
#[derive(Clone, PartialEq, Eq)]
pub struct Material {
    pub cert_pem: String,
    pub key_pem: String,
    pub ca_bundle: String,
}

impl std::fmt::Debug for Material {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material.
        f.debug_struct("Material").finish_non_exhaustive()
    }
}

/// A freshly made CA and the serving certificate it signed (the CA key is not kept: the next
/// renewal makes a new CA, and the old one stays trusted until it expires).
pub struct Generated {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

/// Makes a CA and a serving certificate for `hosts` (DNS names or IP addresses), both valid
/// for `validity` (from a minute ago, for clocks slightly behind ours).
pub fn generate(hosts: &[String], validity: Duration) -> Result<Generated, WebhookError> {
    let now = time::OffsetDateTime::now_utc();
    let not_before = now - time::Duration::minutes(1);
    let not_after = now
        + time::Duration::try_from(validity)
            .map_err(|e| WebhookError::Certificate(format!("validity: {e}")))?;

    let ca_key = KeyPair::generate().map_err(certificate_error)?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(certificate_error)?;
    ca.distinguished_name
        .push(DnType::CommonName, "devctl-operator webhook CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca.not_before = not_before;
    ca.not_after = not_after;
    let ca_cert = ca.self_signed(&ca_key).map_err(certificate_error)?;
    let issuer = Issuer::new(ca, ca_key);

    let key = KeyPair::generate().map_err(certificate_error)?;
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(certificate_error)?;
    params.subject_alt_names = hosts
        .iter()
        .map(|host| match host.parse::<std::net::IpAddr>() {
            Ok(ip) => Ok(SanType::IpAddress(ip)),
            Err(_) => host
                .clone()
                .try_into()
                .map(SanType::DnsName)
                .map_err(certificate_error),
        })
        .collect::<Result<_, _>>()?;
    params.distinguished_name.push(
        DnType::CommonName,
        hosts
            .first()
            .map(String::as_str)
            .unwrap_or("devctl-operator-webhook"),
    );
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.not_before = not_before;
    params.not_after = not_after;
    let cert = params.signed_by(&key, &issuer).map_err(certificate_error)?;
    Ok(Generated {
        ca_pem: ca_cert.pem(),
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

fn certificate_error(error: impl std::fmt::Display) -> WebhookError {
    WebhookError::Certificate(error.to_string())
}

/// What a PEM certificate says about itself: when it expires and the names it is valid for.
pub struct Inspected {
    pub not_after: SystemTime,
    pub hosts: Vec<String>,
}

/// Reads the first certificate of `pem`.
pub fn inspect(pem: &str) -> Option<Inspected> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).ok()?;
    let cert = pem.parse_x509().ok()?;
    let seconds = u64::try_from(cert.validity().not_after.timestamp()).ok()?;
    let mut hosts = Vec::new();
    if let Ok(Some(names)) = cert.subject_alternative_name() {
        for name in &names.value.general_names {
            match name {
                x509_parser::extensions::GeneralName::DNSName(dns) => hosts.push(dns.to_string()),
                x509_parser::extensions::GeneralName::IPAddress(bytes) => {
                    let ip = match bytes.len() {
                        4 => <[u8; 4]>::try_from(*bytes).ok().map(std::net::IpAddr::from),
                        16 => <[u8; 16]>::try_from(*bytes)
                            .ok()
                            .map(std::net::IpAddr::from),
                        _ => None,
                    };
                    hosts.extend(ip.map(|ip| ip.to_string()));
                }
                _ => {}
            }
        }
    }
    Some(Inspected {
        not_after: SystemTime::UNIX_EPOCH + Duration::from_secs(seconds),
        hosts,
    })
}

/// How long before expiry a certificate is renewed: 7 days (CloudNativePG's choice for its
/// 90-day certificates), or a third of the validity when that is shorter.
pub fn renew_before(validity: Duration) -> Duration {
    (validity / 3).min(Duration::from_secs(7 * 24 * 3600))
}

/// The certificates of a PEM bundle that are still valid at `now`, as one PEM bundle.
pub fn unexpired(bundle: &str, now: SystemTime) -> String {
    CertificateDer::pem_slice_iter(bundle.as_bytes())
        .filter_map(Result::ok)
        .filter(|der| {
            x509_parser::parse_x509_certificate(der).is_ok_and(|(_, cert)| {
                u64::try_from(cert.validity().not_after.timestamp())
                    .is_ok_and(|s| SystemTime::UNIX_EPOCH + Duration::from_secs(s) > now)
            })
        })
        .map(|der| pem_certificate(&der))
        .collect()
}

fn pem_certificate(der: &CertificateDer<'_>) -> String {
    use base64::Engine as _;
    let encoded = base64::engine::general_purpose::STANDARD.encode(der.as_ref());
    let mut pem = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in encoded.as_bytes().chunks(64) {
        pem.push_str(&String::from_utf8_lossy(line));
        pem.push('\n');
    }
    pem.push_str("-----END CERTIFICATE-----\n");
    pem
}

/// The certificate the TLS server hands out, swapped in place on renewal.
#[derive(Debug, Default)]
pub struct Resolver {
    current: RwLock<Option<Arc<CertifiedKey>>>,
    /// The PEM of the certificate served, to tell a renewal from the same certificate.
    pem: RwLock<String>,
}

impl Resolver {
    /// Serves `cert_pem` with `key_pem` from the next handshake on; refuses a key that does
    /// not match the certificate (a half-written pair of files), keeping the current one.
    pub fn set(&self, cert_pem: &str, key_pem: &str) -> Result<(), WebhookError> {
        let chain = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(certificate_error)?;
        if chain.is_empty() {
            return Err(WebhookError::Certificate(
                "no certificate in the PEM".into(),
            ));
        }
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(certificate_error)?;
        let signing_key =
            rustls::crypto::ring::sign::any_supported_type(&key).map_err(certificate_error)?;
        let certified = CertifiedKey::new(chain, signing_key);
        certified.keys_match().map_err(certificate_error)?;
        if let Ok(mut current) = self.current.write() {
            *current = Some(Arc::new(certified));
        }
        if let Ok(mut pem) = self.pem.write() {
            *pem = cert_pem.to_string();
        }
        Ok(())
    }

    /// Whether `cert_pem` is the certificate served now.
    pub fn serves(&self, cert_pem: &str) -> bool {
        self.pem.read().is_ok_and(|pem| *pem == cert_pem)
    }

    /// Whether a certificate is loaded (the server answers handshakes).
    pub fn is_loaded(&self) -> bool {
        self.current.read().is_ok_and(|c| c.is_some())
    }
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.read().ok().and_then(|c| c.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_certificates_name_the_hosts_and_expire_when_asked() {
        let hosts = vec![
            "devctl-operator-webhook.devctl-system.svc".to_string(),
            "127.0.0.1".to_string(),
        ];
        let generated = generate(&hosts, Duration::from_secs(3600)).unwrap();
        let inspected = inspect(&generated.cert_pem).unwrap();
        assert_eq!(inspected.hosts, hosts);
        let left = inspected
            .not_after
            .duration_since(SystemTime::now())
            .unwrap();
        assert!(
            left > Duration::from_secs(3500) && left <= Duration::from_secs(3600),
            "{left:?}"
        );
        let resolver = Resolver::default();
        resolver
            .set(&generated.cert_pem, &generated.key_pem)
            .unwrap();
        assert!(resolver.is_loaded());
        // A key of another certificate is refused and the current one kept.
        let other = generate(&hosts, Duration::from_secs(60)).unwrap();
        assert!(resolver.set(&generated.cert_pem, &other.key_pem).is_err());
    }

    #[test]
    fn renewal_is_seven_days_ahead_or_a_third_of_short_validities() {
        assert_eq!(
            renew_before(Duration::from_secs(90 * 86400)),
            Duration::from_secs(7 * 86400)
        );
        assert_eq!(
            renew_before(Duration::from_secs(90)),
            Duration::from_secs(30)
        );
    }

    #[test]
    fn expired_cas_leave_the_bundle() {
        let hosts = vec!["a".to_string()];
        let short = generate(&hosts, Duration::from_secs(120)).unwrap();
        let long = generate(&hosts, Duration::from_secs(3600)).unwrap();
        let bundle = format!("{}{}", long.ca_pem, short.ca_pem);
        let now = SystemTime::now();
        assert_eq!(
            CertificateDer::pem_slice_iter(unexpired(&bundle, now).as_bytes()).count(),
            2
        );
        let later = now + Duration::from_secs(600);
        let kept = unexpired(&bundle, later);
        assert_eq!(CertificateDer::pem_slice_iter(kept.as_bytes()).count(), 1);
        assert_eq!(
            kept.replace('\n', ""),
            long.ca_pem.replace(['\n', '\r'], "")
        );
    }
}
