//! Checking a kubeconfig posted for a dynamic account, before it is stored:
//! it must parse, name a usable context, cluster and user, and neither run a
//! command nor read a file on the agent's host (the agent refuses those
//! too). The cluster's CA fingerprint is computed as the agent computes it:
//! SHA-256 (hex) of the first certificate of `certificate-authority-data`,
//! in DER. Errors name keys and entries, never values.

use base64::Engine as _;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject as _;
use serde::Deserialize;
use serde::de::IgnoredAny;

/// What the sidecar learns from a valid kubeconfig.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    /// SHA-256 (hex) of the cluster's first CA certificate; empty when the
    /// kubeconfig embeds none.
    pub ca_fingerprint: String,
    /// The API server URL.
    pub server: String,
}

#[derive(Deserialize)]
struct File {
    #[serde(default)]
    clusters: Vec<Named<Cluster>>,
    #[serde(default)]
    users: Vec<Named<User>>,
    #[serde(default)]
    contexts: Vec<Named<Context>>,
    #[serde(rename = "current-context", default)]
    current_context: Option<String>,
}

#[derive(Deserialize)]
struct Named<T> {
    name: String,
    #[serde(alias = "cluster", alias = "user", alias = "context")]
    item: Option<T>,
}

#[derive(Deserialize)]
struct Cluster {
    server: Option<String>,
    #[serde(rename = "certificate-authority")]
    certificate_authority: Option<IgnoredAny>,
    #[serde(rename = "certificate-authority-data")]
    certificate_authority_data: Option<String>,
}

#[derive(Deserialize)]
struct User {
    exec: Option<IgnoredAny>,
    #[serde(rename = "auth-provider")]
    auth_provider: Option<IgnoredAny>,
    #[serde(rename = "tokenFile")]
    token_file: Option<IgnoredAny>,
    #[serde(rename = "client-certificate")]
    client_certificate: Option<IgnoredAny>,
    #[serde(rename = "client-key")]
    client_key: Option<IgnoredAny>,
}

#[derive(Deserialize)]
struct Context {
    cluster: String,
    #[serde(default)]
    user: String,
}

/// Checks `text` with `context` (its current context when `None`).
pub fn check(text: &str, context: Option<&str>) -> Result<Checked, String> {
    // The parser's message could quote the document: never pass it on.
    let file: File = serde_norway::from_str(text)
        .map_err(|_| "kubeconfig is not a valid kubeconfig document".to_owned())?;
    let context_name = context
        .map(str::to_owned)
        .or(file.current_context.clone())
        .filter(|c| !c.is_empty())
        .ok_or("kubeconfig has no current-context; name a context")?;
    let ctx = file
        .contexts
        .iter()
        .find(|c| c.name == context_name)
        .and_then(|c| c.item.as_ref())
        .ok_or_else(|| format!("kubeconfig has no context {context_name:?}"))?;
    let cluster = file
        .clusters
        .iter()
        .find(|c| c.name == ctx.cluster)
        .and_then(|c| c.item.as_ref())
        .ok_or_else(|| format!("kubeconfig has no cluster {:?}", ctx.cluster))?;
    let server = cluster
        .server
        .clone()
        .filter(|s| s.starts_with("https://") || s.starts_with("http://"))
        .ok_or_else(|| format!("cluster {:?} needs an http(s):// server", ctx.cluster))?;
    for named in &file.clusters {
        if named
            .item
            .as_ref()
            .is_some_and(|c| c.certificate_authority.is_some())
        {
            return Err(format!(
                "cluster {:?} names a certificate-authority file; embed certificate-authority-data",
                named.name
            ));
        }
    }
    for named in &file.users {
        let Some(user) = &named.item else { continue };
        let refused = [
            ("exec", user.exec.is_some()),
            ("auth-provider", user.auth_provider.is_some()),
            ("tokenFile", user.token_file.is_some()),
            ("client-certificate", user.client_certificate.is_some()),
            ("client-key", user.client_key.is_some()),
        ];
        if let Some((key, _)) = refused.iter().find(|(_, set)| *set) {
            return Err(format!(
                "user {:?} uses {key}: a dynamic account's kubeconfig may not run commands or \
                 read files on the agent's host; embed the credentials",
                named.name
            ));
        }
    }
    if !ctx.user.is_empty() && !file.users.iter().any(|u| u.name == ctx.user) {
        return Err(format!("kubeconfig has no user {:?}", ctx.user));
    }
    let ca_fingerprint = match &cluster.certificate_authority_data {
        None => String::new(),
        Some(data) => fingerprint(data).ok_or_else(|| {
            format!(
                "cluster {:?}: certificate-authority-data holds no PEM certificate",
                ctx.cluster
            )
        })?,
    };
    Ok(Checked {
        ca_fingerprint,
        server,
    })
}

/// SHA-256 (hex) of the first certificate in base64 `data` (PEM inside).
fn fingerprint(data: &str) -> Option<String> {
    let pem = base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .ok()?;
    let der = CertificateDer::pem_slice_iter(&pem).next()?.ok()?;
    Some(hex::encode(ring::digest::digest(
        &ring::digest::SHA256,
        der.as_ref(),
    )))
}

/// Fuzz body: any document posted as a dynamic account's kubeconfig, with
/// its current context and with a named one. The check answers or refuses
/// without panicking; what it accepts has an http(s) server, and its
/// refusals never quote a value of the document (the marker below stands for
/// a token or key someone pasted).
pub fn fuzz_check(data: &[u8]) {
    const MARKER: &str = "SECRET-MARKER";
    let text = String::from_utf8_lossy(data);
    for context in [None, Some("c")] {
        match check(&text, context) {
            Ok(checked) => assert!(
                checked.server.starts_with("https://") || checked.server.starts_with("http://"),
                "accepted server {:?}",
                checked.server
            ),
            Err(message) => {
                // Names (of contexts, clusters, users) are quoted by design:
                // check only documents whose every marker is the value of a
                // credential or CA key.
                let as_value = ["token: ", "certificate-authority-data: ", "command: "]
                    .iter()
                    .map(|key| text.matches(&format!("{key}{MARKER}")).count())
                    .sum::<usize>();
                if text.matches(MARKER).count() == as_value {
                    assert!(!message.contains(MARKER), "{message}");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kubeconfig(cluster: &str, user: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
             clusters: [{{name: k, cluster: {cluster}}}]\n\
             users: [{{name: u, user: {user}}}]\n\
             contexts: [{{name: c, context: {{cluster: k, user: u}}}}]\n"
        )
    }

    #[test]
    fn fingerprint_is_the_sha256_of_the_first_ca_certificate_in_der() {
        let ca = rcgen::generate_simple_self_signed(vec!["ca.test".into()]).unwrap();
        let pem = ca.cert.pem();
        let data = base64::engine::general_purpose::STANDARD.encode(&pem);
        let text = kubeconfig(
            &format!("{{server: 'https://10.0.0.1', certificate-authority-data: {data}}}"),
            "{token: s3cr3t}",
        );
        let checked = check(&text, None).unwrap();
        let expected = hex::encode(ring::digest::digest(&ring::digest::SHA256, ca.cert.der()));
        assert_eq!(checked.ca_fingerprint, expected);
        assert_eq!(checked.server, "https://10.0.0.1");
        let bad = kubeconfig(
            "{server: 'https://10.0.0.1', certificate-authority-data: bm9wZQ==}",
            "{token: s3cr3t}",
        );
        assert!(check(&bad, None).unwrap_err().contains("no PEM"));
    }

    #[test]
    fn refuses_commands_files_and_missing_parts_without_quoting_secrets() {
        let server = "{server: 'https://10.0.0.1'}";
        assert_eq!(
            check(&kubeconfig(server, "{token: s3cr3t}"), None)
                .unwrap()
                .ca_fingerprint,
            ""
        );
        for (user, key) in [
            ("{exec: {command: /bin/sh}}", "exec"),
            ("{auth-provider: {name: gcp}}", "auth-provider"),
            ("{tokenFile: /etc/shadow}", "tokenFile"),
            (
                "{client-certificate: /c.pem, client-key-data: s3cr3t}",
                "client-certificate",
            ),
        ] {
            let err = check(&kubeconfig(server, user), None).unwrap_err();
            assert!(err.contains(key), "{err}");
        }
        let err = check(
            &kubeconfig(
                "{server: 'https://x', certificate-authority: /ca.pem}",
                "{}",
            ),
            None,
        )
        .unwrap_err();
        assert!(err.contains("certificate-authority file"), "{err}");
        assert!(
            check(&kubeconfig(server, "{}"), Some("other"))
                .unwrap_err()
                .contains("other")
        );
        assert!(check(&kubeconfig("{server: ftp://x}", "{}"), None).is_err());
        let err = check("token: s3cr3t: [", None).unwrap_err();
        assert!(!err.contains("s3cr3t"), "{err}");
    }

    #[test]
    fn fuzz_check_documents() {
        let good = kubeconfig(
            "{server: 'https://10.0.0.1:6443'}",
            "{token: SECRET-MARKER}",
        );
        let bad_ca = kubeconfig(
            "{server: 'https://h', certificate-authority-data: SECRET-MARKER}",
            "{token: t}",
        );
        spinlink_fuzzing::Fuzz::new("sidecar dynamic kubeconfig")
            .seeds([
                good.into_bytes(),
                bad_ca.into_bytes(),
                b"apiVersion: v1\nclusters: [{name: c, cluster: {server: 'https://h', certificate-authority: /etc/SECRET-MARKER}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {exec: {command: SECRET-MARKER}}}]\ncurrent-context: c\n".to_vec(),
                b"a: &a [*a, *a]\n".to_vec(),
            ])
            .run(super::fuzz_check);
    }
}
