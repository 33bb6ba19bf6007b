//! Certificates and keys for a local control plane, made in-process with rcgen.
//!
//! Two CAs keep the roles apart the way a real cluster does: the serving CA signs the API
//! server's certificate (clients trust it), the client CA signs client certificates (the API
//! server trusts it with `--client-ca-file`; the certificate's CN is the user name and its O
//! entries are the groups).

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::Error;

/// A PEM certificate with its PEM private key.
#[derive(Clone)]
pub struct CertPair {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for CertPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material, even in test output.
        f.debug_struct("CertPair").finish_non_exhaustive()
    }
}

/// A certificate authority that can issue leaf certificates.
pub struct Authority {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
}

impl Authority {
    pub fn new(common_name: &str) -> Result<Self, Error> {
        let key = KeyPair::generate().map_err(Error::pki)?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(Error::pki)?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).map_err(Error::pki)?;
        Ok(Self {
            cert_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        })
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// A serving certificate for the given DNS names and IP addresses.
    pub fn issue_server(&self, names: &[&str]) -> Result<CertPair, Error> {
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .map_err(Error::pki)?;
        params.distinguished_name.push(
            DnType::CommonName,
            names.first().copied().unwrap_or("localhost"),
        );
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        self.sign(params)
    }

    /// A client certificate for `user` in `groups` (CN and O, as Kubernetes reads them).
    pub fn issue_client(&self, user: &str, groups: &[&str]) -> Result<CertPair, Error> {
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(Error::pki)?;
        params.distinguished_name.push(DnType::CommonName, user);
        for group in groups {
            params
                .distinguished_name
                .push(DnType::OrganizationName, *group);
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        self.sign(params)
    }

    fn sign(&self, params: CertificateParams) -> Result<CertPair, Error> {
        let key = KeyPair::generate().map_err(Error::pki)?;
        let cert = params.signed_by(&key, &self.issuer).map_err(Error::pki)?;
        Ok(CertPair {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// The service-account token signing key pair (ECDSA P-256; the API server signs ES256).
pub struct ServiceAccountKeys {
    pub private_pem: String,
    pub public_pem: String,
}

impl ServiceAccountKeys {
    pub fn generate() -> Result<Self, Error> {
        let key = KeyPair::generate().map_err(Error::pki)?;
        Ok(Self {
            private_pem: key.serialize_pem(),
            public_pem: key.public_key_pem(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_certificates_carry_user_and_groups() {
        let ca = Authority::new("test-ca").unwrap();
        let pair = ca.issue_client("alice", &["devs", "ops"]).unwrap();
        assert!(pair.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(pair.key_pem.contains("PRIVATE KEY"));
        assert!(
            !format!("{pair:?}").contains("PRIVATE"),
            "Debug must not print the key"
        );
    }
}
