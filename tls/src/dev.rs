//! The development PKI: a throw-away CA and the certificates `spinlink dev`
//! and the tests need, generated with rcgen. Never for production: the CA key
//! sits next to the certificates it signs.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use time::{Duration, OffsetDateTime};

use crate::{Error, Result};

/// How long development leaf certificates are valid.
pub const DEFAULT_LEAF_VALIDITY: Duration = Duration::days(90);
/// How long the development CA is valid.
pub const DEFAULT_CA_VALIDITY: Duration = Duration::days(365);

/// A certificate and its key, both PEM.
#[derive(Clone)]
pub struct Issued {
    /// The certificate.
    pub cert_pem: String,
    /// The private key (PKCS#8).
    pub key_pem: String,
}

impl std::fmt::Debug for Issued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issued").finish_non_exhaustive()
    }
}

impl Issued {
    /// Writes `<dir>/<name>.crt` and `<dir>/<name>.key` (the key mode 0600).
    pub fn write(&self, dir: &Path, name: &str) -> Result<(PathBuf, PathBuf)> {
        let cert = dir.join(format!("{name}.crt"));
        let key = dir.join(format!("{name}.key"));
        write_file(&cert, self.cert_pem.as_bytes(), false)?;
        write_file(&key, self.key_pem.as_bytes(), true)?;
        Ok((cert, key))
    }
}

/// What a leaf certificate is for and whom it names.
#[derive(Debug, Clone)]
pub struct Leaf {
    common_name: String,
    dns: Vec<String>,
    ips: Vec<std::net::IpAddr>,
    uris: Vec<String>,
    server: bool,
    client: bool,
    validity: Duration,
}

impl Leaf {
    /// A certificate servers present (and, with [`Leaf::also_client`], clients).
    #[must_use]
    pub fn server(common_name: &str) -> Self {
        Self {
            common_name: common_name.to_owned(),
            dns: Vec::new(),
            ips: Vec::new(),
            uris: Vec::new(),
            server: true,
            client: false,
            validity: DEFAULT_LEAF_VALIDITY,
        }
    }

    /// A certificate clients present.
    #[must_use]
    pub fn client(common_name: &str) -> Self {
        Self {
            server: false,
            client: true,
            ..Self::server(common_name)
        }
    }

    /// Lets the certificate authenticate a client too.
    #[must_use]
    pub fn also_client(mut self) -> Self {
        self.client = true;
        self
    }

    /// Adds a DNS subject alternative name.
    #[must_use]
    pub fn with_dns(mut self, name: &str) -> Self {
        self.dns.push(name.to_owned());
        self
    }

    /// Adds an IP subject alternative name.
    #[must_use]
    pub fn with_ip(mut self, ip: std::net::IpAddr) -> Self {
        self.ips.push(ip);
        self
    }

    /// Adds a URI subject alternative name (an identity such as SPIFFE).
    #[must_use]
    pub fn with_uri(mut self, uri: &str) -> Self {
        self.uris.push(uri.to_owned());
        self
    }

    /// Valid for `validity` from issue instead of [`DEFAULT_LEAF_VALIDITY`]
    /// (a rotation that changes the expiry).
    #[must_use]
    pub fn with_validity(mut self, validity: std::time::Duration) -> Self {
        self.validity = Duration::try_from(validity).unwrap_or(Duration::MAX);
        self
    }
}

/// A development certificate authority.
pub struct DevCa {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
}

impl std::fmt::Debug for DevCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevCa").finish_non_exhaustive()
    }
}

impl DevCa {
    /// Generates a new CA named `common_name`.
    pub fn generate(common_name: &str) -> Result<Self> {
        let mut params = CertificateParams::default();
        params.distinguished_name = name(common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let now = OffsetDateTime::now_utc();
        params.not_before = now - Duration::hours(1);
        params.not_after = now + DEFAULT_CA_VALIDITY;
        let key = KeyPair::generate()?;
        let cert = params.self_signed(&key)?;
        Ok(Self {
            cert_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// Loads a CA written by [`DevCa::write`].
    pub fn load(dir: &Path) -> Result<Self> {
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read_to_string(&path).map_err(|source| Error::ReadFile { path, source })
        };
        let cert_pem = read("ca.crt")?;
        let key = KeyPair::from_pem(&read("ca.key")?)?;
        Ok(Self {
            issuer: Issuer::from_ca_cert_pem(&cert_pem, key)?,
            cert_pem,
        })
    }

    /// Writes `ca.crt` and `ca.key` into `dir`.
    pub fn write(&self, dir: &Path) -> Result<PathBuf> {
        let cert = dir.join("ca.crt");
        write_file(&cert, self.cert_pem.as_bytes(), false)?;
        write_file(
            &dir.join("ca.key"),
            self.issuer.key().serialize_pem().as_bytes(),
            true,
        )?;
        Ok(cert)
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// Issues a leaf certificate with a fresh key.
    pub fn issue(&self, leaf: &Leaf) -> Result<Issued> {
        let mut params = CertificateParams::default();
        params.distinguished_name = name(&leaf.common_name);
        for dns in &leaf.dns {
            params
                .subject_alt_names
                .push(SanType::DnsName(dns.clone().try_into()?));
        }
        for ip in &leaf.ips {
            params.subject_alt_names.push(SanType::IpAddress(*ip));
        }
        for uri in &leaf.uris {
            params
                .subject_alt_names
                .push(SanType::URI(uri.clone().try_into()?));
        }
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        if leaf.server {
            params
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::ServerAuth);
        }
        if leaf.client {
            params
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::ClientAuth);
        }
        params.use_authority_key_identifier_extension = true;
        let now = OffsetDateTime::now_utc();
        params.not_before = now - Duration::hours(1);
        params.not_after = now.saturating_add(leaf.validity);
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

fn name(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn.push(DnType::OrganizationName, "spinlink development");
    dn
}

fn write_file(path: &Path, bytes: &[u8], secret: bool) -> Result<()> {
    let io = |source| Error::WriteFile {
        path: path.to_owned(),
        source,
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    std::fs::write(path, bytes).map_err(io)?;
    #[cfg(unix)]
    if secret {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(io)?;
    }
    #[cfg(not(unix))]
    let _ = secret;
    Ok(())
}

/// The trust domain of development identities.
pub const DEV_TRUST_DOMAIN: &str = "spinlink.dev";

/// The identity a development agent certificate carries.
pub fn dev_agent_identity(agent_id: &str) -> String {
    format!("spiffe://{DEV_TRUST_DOMAIN}/agent/{agent_id}")
}

/// The identity (URI SAN) of the development gateway certificate: what a
/// development sidecar names in `tunnel.tls.gatewayIdentities`. Agents'
/// certificates, signed by the same CA, carry [`dev_agent_identity`]s
/// instead, so a sidecar refuses them.
pub fn dev_gateway_identity() -> String {
    format!("spiffe://{DEV_TRUST_DOMAIN}/gateway")
}

/// The identity (URI SAN) of the development sidecars' peer certificate
/// (`sidecar-peer.crt`): what development sidecars name in
/// `peer.tls.peerIdentities`.
pub fn dev_sidecar_identity() -> String {
    format!("spiffe://{DEV_TRUST_DOMAIN}/sidecar")
}

/// The files of a development PKI directory, as [`DevPki::ensure`] lays them out.
#[derive(Debug, Clone)]
pub struct DevPki {
    /// The directory.
    pub dir: PathBuf,
}

impl DevPki {
    /// Uses the PKI in `dir`, generating the CA, a gateway certificate, a
    /// sidecar certificate (the tunnel's), a sidecar peer certificate (the
    /// peer port's, both ways) and one client certificate per agent id when
    /// they are missing. Server certificates name `localhost`, `127.0.0.1` and `::1`.
    pub fn ensure(dir: &Path, agent_ids: &[&str]) -> Result<Self> {
        let pki = Self {
            dir: dir.to_owned(),
        };
        let ca = if pki.ca_cert().exists() {
            DevCa::load(dir)?
        } else {
            let ca = DevCa::generate("spinlink development CA")?;
            ca.write(dir)?;
            ca
        };
        let local = |leaf: Leaf| {
            leaf.with_dns("localhost")
                .with_ip(std::net::Ipv4Addr::LOCALHOST.into())
                .with_ip(std::net::Ipv6Addr::LOCALHOST.into())
        };
        if !pki.cert("gateway").exists() {
            let leaf = local(Leaf::server("spinlink-gateway").also_client())
                .with_uri(&dev_gateway_identity());
            ca.issue(&leaf)?.write(dir, "gateway")?;
        }
        if !pki.cert("sidecar").exists() {
            let leaf = local(Leaf::server("spinlink-sidecar")).with_uri(&dev_sidecar_identity());
            ca.issue(&leaf)?.write(dir, "sidecar")?;
        }
        // Both ends of the peer port present it: server and client.
        if !pki.cert("sidecar-peer").exists() {
            let leaf = local(Leaf::server("spinlink-sidecar-peer").also_client())
                .with_uri(&dev_sidecar_identity());
            ca.issue(&leaf)?.write(dir, "sidecar-peer")?;
        }
        for id in agent_ids {
            let name = format!("agent-{id}");
            if !pki.cert(&name).exists() {
                let leaf = Leaf::client(&name).with_uri(&dev_agent_identity(id));
                ca.issue(&leaf)?.write(dir, &name)?;
            }
        }
        Ok(pki)
    }

    /// `ca.crt`.
    pub fn ca_cert(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// `<name>.crt`.
    pub fn cert(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.crt"))
    }

    /// `<name>.key`.
    pub fn key(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.key"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ClientAuth, ClientFiles, ServerFiles, client_config, server_config};

    #[test]
    fn ensure_generates_once_and_configs_load() {
        let dir = tempfile::tempdir().unwrap();
        let pki = DevPki::ensure(dir.path(), &["a1"]).unwrap();
        let first = std::fs::read(pki.cert("gateway")).unwrap();
        let again = DevPki::ensure(dir.path(), &["a1", "a2"]).unwrap();
        assert_eq!(first, std::fs::read(again.cert("gateway")).unwrap());
        assert!(again.cert("agent-a2").exists());

        server_config(
            ServerFiles {
                cert: &pki.cert("gateway"),
                key: &pki.key("gateway"),
                client_ca: Some(&pki.ca_cert()),
            },
            ClientAuth::Required,
            &[crate::config::ALPN_H2],
        )
        .unwrap();
        client_config(
            ClientFiles {
                ca: &pki.ca_cert(),
                identity: Some((&pki.cert("agent-a1"), &pki.key("agent-a1"))),
            },
            &[crate::config::ALPN_H2],
        )
        .unwrap();
    }
}
