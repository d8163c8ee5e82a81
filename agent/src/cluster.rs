//! One account's cluster: its kube-rs client, what `Hello` says about it, and
//! the raw discovery documents the sidecar serves as they are.

use bytes::Bytes;
use http_body_util::BodyExt;
use kube::config::{KubeConfigOptions, Kubeconfig};
use spinlink_proto::v1;
use tracing::{debug, warn};

use crate::config::AccountConfig;
use std::sync::Arc;

use crate::kinds::{self, KindFilter};
use crate::metrics::Metrics;
use crate::policy::RelayPolicy;
use crate::{Error, Result};
use prometheus_client::metrics::gauge::Gauge;

/// Content type of the discovery documents the agent fetches.
pub const JSON: &str = "application/json";

/// A connected (in the kube-rs sense: configured) cluster.
#[derive(Clone)]
pub struct Cluster {
    /// The account name.
    pub account: String,
    /// The client, with the account's credentials.
    pub client: kube::Client,
    /// The API server URL as the agent reaches it.
    pub api_server: String,
    /// SHA-256 (hex) of the first cluster CA certificate, empty when none.
    pub ca_fingerprint: String,
    /// The account's kinds and namespaces.
    pub filter: KindFilter,
    /// What relayed requests may do.
    pub policy: Arc<RelayPolicy>,
    /// Whom relayed requests act as: user and groups.
    pub impersonate: Option<Arc<(String, Vec<String>)>>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("account", &self.account)
            .field("api_server", &self.api_server)
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// Builds the client from the account's kubeconfig (a file, or a Secret
    /// read with the in-cluster service account) or the in-cluster service
    /// account.
    /// Its API server connections count in `metrics`
    /// (`apiserver_connections`).
    pub async fn connect(account: &AccountConfig, metrics: &Metrics) -> Result<Self> {
        Self::connect_with_env(account, metrics, |name| std::env::var(name).ok()).await
    }

    /// [`Cluster::connect`] with the environment (`KUBERNETES_SERVICE_HOST`,
    /// `KUBERNETES_SERVICE_PORT`) read through `env`.
    pub async fn connect_with_env(
        account: &AccountConfig,
        metrics: &Metrics,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self> {
        let config_error = |message: String| Error::KubeConfig {
            account: account.name.clone(),
            message,
        };
        let options = KubeConfigOptions {
            context: account.context.clone(),
            ..KubeConfigOptions::default()
        };
        let in_cluster = || {
            let dir = account.service_account_dir.clone().unwrap_or_else(|| {
                std::path::PathBuf::from(crate::config::DEFAULT_SERVICE_ACCOUNT_DIR)
            });
            crate::incluster::config_with_env(&dir, &env)
                .map_err(|e| config_error(format!("in-cluster service account: {e}")))
        };
        let mut bearer = None;
        let kube_config = match (&account.kubeconfig_file, &account.kubeconfig_secret) {
            (None, None) if account.kubeconfig_inline.is_some() => {
                let inline = account
                    .kubeconfig_inline
                    .as_ref()
                    .map(|k| k.0.clone())
                    .unwrap_or_default();
                let kubeconfig = inline_kubeconfig(&inline).map_err(config_error)?;
                // kube's message names the field, never its value.
                kube::Config::from_custom_kubeconfig(kubeconfig, &options)
                    .await
                    .map_err(|e| config_error(format!("assigned kubeconfig: {e}")))?
            }
            (Some(path), _) => {
                let kubeconfig = Kubeconfig::read_from(path)
                    .map_err(|e| config_error(format!("{}: {e}", path.display())))?;
                kube::Config::from_custom_kubeconfig(kubeconfig, &options)
                    .await
                    .map_err(|e| config_error(format!("{}: {e}", path.display())))?
            }
            (None, Some(secret)) => {
                let (config, token) = in_cluster()?;
                // The agent's own cluster, read once: its connections are
                // not the account's, and close when it is dropped.
                let home = crate::incluster::client(config, token, Gauge::default()).map_err(
                    |source| Error::Kube {
                        account: account.name.clone(),
                        source,
                    },
                )?;
                let kubeconfig = read_kubeconfig_secret(home, secret)
                    .await
                    .map_err(config_error)?;
                kube::Config::from_custom_kubeconfig(kubeconfig, &options)
                    .await
                    .map_err(|e| {
                        config_error(format!(
                            "kubeconfig in Secret {}/{}: {e}",
                            secret.namespace, secret.name
                        ))
                    })?
            }
            (None, None) => {
                let (config, token) = in_cluster()?;
                bearer = Some(token);
                config
            }
        };
        let ca_fingerprint = kube_config
            .root_cert
            .as_ref()
            .and_then(|certs| certs.first())
            .map(|der| hex::encode(ring::digest::digest(&ring::digest::SHA256, der)))
            .unwrap_or_default();
        let api_server = kube_config.cluster_url.to_string();
        let kube_error = |source| Error::Kube {
            account: account.name.clone(),
            source,
        };
        let connections = metrics.apiserver_connections(&account.name);
        let client = match bearer {
            None => crate::apiserver::builder(&kube_config, connections)
                .map_err(kube_error)?
                .build(),
            Some(token) => {
                crate::incluster::client(kube_config, token, connections).map_err(kube_error)?
            }
        };
        // Checked by `Config::validate` already; never fall back to the
        // agent's own rights if it were unusable.
        let impersonate = match &account.impersonate {
            Some(imp) => {
                let user = imp.user_name().map_err(|message| Error::KubeConfig {
                    account: account.name.clone(),
                    message: format!("impersonate: {message}"),
                })?;
                Some(Arc::new((user, imp.groups.clone())))
            }
            None => None,
        };
        Ok(Self {
            account: account.name.clone(),
            client,
            api_server,
            ca_fingerprint,
            filter: KindFilter::of(account),
            impersonate,
            policy: Arc::new(
                RelayPolicy::new(&account.name, &account.relay).map_err(|e| Error::KubeConfig {
                    account: account.name.clone(),
                    message: format!("relay policy: {e}"),
                })?,
            ),
        })
    }

    /// What `Hello` states about this account: the kinds discovery finds
    /// now (the cache stream follows later changes). A cluster that cannot
    /// be reached still gets announced, with an empty Kubernetes version
    /// and no kinds.
    pub async fn account_info(&self) -> v1::AccountInfo {
        let kubernetes_version = match self.client.apiserver_version().await {
            Ok(info) => info.git_version,
            Err(e) => {
                warn!(account = %self.account, error = %e, "reading /version failed");
                String::new()
            }
        };
        let kinds = match self.discovery().await {
            Ok(snapshot) => kinds::from_discovery(&snapshot.documents, &self.filter)
                .iter()
                .map(kinds::WatchedKind::gvr)
                .collect(),
            Err(e) => {
                warn!(account = %self.account, error = %e, "discovery for Hello failed");
                Vec::new()
            }
        };
        v1::AccountInfo {
            name: self.account.clone(),
            api_server: self.api_server.clone(),
            ca_fingerprint: self.ca_fingerprint.clone(),
            kubernetes_version,
            kinds,
            namespaces: self.filter.namespaces.clone(),
            properties: Default::default(),
        }
    }

    /// GETs `path` and returns the body when the status is 2xx.
    pub async fn get_raw(&self, path: &str) -> Result<Bytes> {
        self.get_accepting(path, JSON).await.map(|(_, body)| body)
    }

    /// GET `path` asking for `accept`: the answer's content type and body.
    async fn get_accepting(&self, path: &str, accept: &str) -> Result<(String, Bytes)> {
        let request = http::Request::get(path)
            .header(http::header::ACCEPT, accept)
            .body(kube::client::Body::empty())
            .map_err(|e| Error::Discovery {
                account: self.account.clone(),
                message: format!("{path}: {e}"),
            })?;
        let response = self
            .client
            .send(request)
            .await
            .map_err(|source| Error::Kube {
                account: self.account.clone(),
                source,
            })?;
        let status = response.status();
        let content_type = response
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|source| Error::Kube {
                account: self.account.clone(),
                source,
            })?
            .to_bytes();
        if !status.is_success() {
            return Err(Error::Discovery {
                account: self.account.clone(),
                message: format!("{path}: HTTP {status}"),
            });
        }
        Ok((content_type, body))
    }

    /// The discovery documents: `/version`, `/api`, `/api/v1`, `/apis` and
    /// every `/apis/{group}/{version}` that `/apis` lists. A group version
    /// that fails (an aggregated API that is down) is left out, with a
    /// warning. Also `/api` and `/apis` as aggregated discovery
    /// (`apidiscovery.k8s.io/v2`, under `<path>`
    /// [`aggregated::PATH_SUFFIX`](spinlink_proto::aggregated::PATH_SUFFIX))
    /// when the server serves it, so that kubectl's cold start through the
    /// facade takes the three requests it takes against the server.
    pub async fn discovery(&self) -> Result<v1::DiscoverySnapshot> {
        let mut documents = Vec::new();
        let mut doc = |path: &str, body: Bytes| {
            documents.push(v1::Document {
                path: path.to_owned(),
                content_type: JSON.to_owned(),
                body: body.to_vec(),
            });
        };
        for path in ["/version", "/api", "/api/v1"] {
            doc(path, self.get_raw(path).await?);
        }
        let apis = self.get_raw("/apis").await?;
        let group_versions = group_versions(&apis).map_err(|e| Error::Discovery {
            account: self.account.clone(),
            message: format!("/apis: {e}"),
        })?;
        doc("/apis", apis);
        let mut aggregated_docs = Vec::new();
        for path in ["/api", "/apis"] {
            use spinlink_proto::aggregated;
            match self.get_accepting(path, aggregated::ACCEPT).await {
                Ok((content_type, body)) if content_type.contains(aggregated::MARK) => {
                    aggregated_docs.push(v1::Document {
                        path: format!("{path}{}", aggregated::PATH_SUFFIX),
                        content_type,
                        body: body.to_vec(),
                    });
                }
                // An older server answers the plain document: nothing to add.
                Ok(_) => {}
                Err(e) => {
                    debug!(account = %self.account, %path, error = %e, "no aggregated discovery")
                }
            }
        }
        for gv in group_versions {
            let path = format!("/apis/{gv}");
            match self.get_raw(&path).await {
                Ok(body) => doc(&path, body),
                Err(e) => {
                    warn!(account = %self.account, %path, error = %e, "discovery document skipped")
                }
            }
        }
        documents.extend(aggregated_docs);
        Ok(v1::DiscoverySnapshot { documents })
    }
}

/// The `group/version` strings an `APIGroupList` names.
fn group_versions(apis: &[u8]) -> serde_json::Result<Vec<String>> {
    let list: k8s_openapi::apimachinery::pkg::apis::meta::v1::APIGroupList =
        serde_json::from_slice(apis)?;
    let mut out = Vec::new();
    for group in list.groups {
        for version in group.versions {
            if !out.contains(&version.group_version) {
                out.push(version.group_version);
            }
        }
    }
    Ok(out)
}

/// The kubeconfig in `secret`, read with `client` (the agent's own cluster).
/// Errors never quote the Secret's content.
async fn read_kubeconfig_secret(
    client: kube::Client,
    secret: &crate::config::SecretRef,
) -> std::result::Result<Kubeconfig, String> {
    use k8s_openapi::api::core::v1::Secret;
    let key = secret.key.as_deref().unwrap_or(DEFAULT_KUBECONFIG_KEY);
    let named = format!("Secret {}/{}", secret.namespace, secret.name);
    let api: kube::Api<Secret> = kube::Api::namespaced(client, &secret.namespace);
    let found = api
        .get(&secret.name)
        .await
        .map_err(|e| format!("reading {named}: {e}"))?;
    let data = found
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .ok_or_else(|| format!("{named} has no key {key:?}"))?;
    let text =
        std::str::from_utf8(&data.0).map_err(|_| format!("{named} key {key:?} is not UTF-8"))?;
    Kubeconfig::from_yaml(text).map_err(|_| format!("{named} key {key:?} is not a kubeconfig"))
}

/// An assigned account's kubeconfig, parsed and checked: it comes from the
/// network, so it may not run a command on this host (`exec`,
/// `auth-provider`) nor read a file of it (`tokenFile`,
/// `client-certificate`, `client-key`, `certificate-authority`). Errors
/// never quote it.
pub fn inline_kubeconfig(bytes: &[u8]) -> std::result::Result<Kubeconfig, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "assigned kubeconfig is not UTF-8")?;
    let kubeconfig =
        Kubeconfig::from_yaml(text).map_err(|_| "assigned kubeconfig is not a kubeconfig")?;
    for named in &kubeconfig.clusters {
        if named
            .cluster
            .as_ref()
            .is_some_and(|c| c.certificate_authority.is_some())
        {
            return Err(format!(
                "assigned kubeconfig: cluster {:?} names a certificate-authority file; \
                 use certificate-authority-data",
                named.name
            ));
        }
    }
    for named in &kubeconfig.auth_infos {
        let Some(auth) = &named.auth_info else {
            continue;
        };
        let refused = [
            ("exec", auth.exec.is_some()),
            ("auth-provider", auth.auth_provider.is_some()),
            ("tokenFile", auth.token_file.is_some()),
            ("client-certificate", auth.client_certificate.is_some()),
            ("client-key", auth.client_key.is_some()),
        ];
        if let Some((key, _)) = refused.iter().find(|(_, set)| *set) {
            return Err(format!(
                "assigned kubeconfig: user {:?} uses {key}, which assigned accounts may not \
                 (no commands run, no files read on the agent's host)",
                named.name
            ));
        }
    }
    Ok(kubeconfig)
}

/// The data key of a kubeconfig Secret when `kubeconfigSecret.key` is unset.
pub const DEFAULT_KUBECONFIG_KEY: &str = "config";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_kubeconfigs_may_not_run_commands_or_read_files() {
        let base = "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
            clusters: [{name: k, cluster: {server: 'https://127.0.0.1:1'}}]\n\
            contexts: [{name: c, context: {cluster: k, user: u}}]\n";
        let with_user = |user: &str| format!("{base}users: [{{name: u, user: {user}}}]\n");
        assert!(inline_kubeconfig(with_user("{token: s3cr3t}").as_bytes()).is_ok());
        for (user, key) in [
            (
                "{exec: {command: /bin/sh, apiVersion: client.authentication.k8s.io/v1}}",
                "exec",
            ),
            ("{tokenFile: /etc/shadow}", "tokenFile"),
            ("{client-key: /root/key.pem}", "client-key"),
            ("{auth-provider: {name: gcp, config: {}}}", "auth-provider"),
        ] {
            let err = inline_kubeconfig(with_user(user).as_bytes()).unwrap_err();
            assert!(err.contains(key), "{err}");
        }
        let err = inline_kubeconfig(b"token: s3cr3t: [").unwrap_err();
        assert!(!err.contains("s3cr3t"), "{err}");
    }

    #[test]
    fn group_versions_are_listed_once_each() {
        let apis = br#"{"kind":"APIGroupList","apiVersion":"v1","groups":[
            {"name":"apps","versions":[{"groupVersion":"apps/v1","version":"v1"}],
             "preferredVersion":{"groupVersion":"apps/v1","version":"v1"}},
            {"name":"batch","versions":[{"groupVersion":"batch/v1","version":"v1"},
             {"groupVersion":"batch/v1beta1","version":"v1beta1"}]}]}"#;
        assert_eq!(
            group_versions(apis).unwrap(),
            vec!["apps/v1", "batch/v1", "batch/v1beta1"]
        );
        assert!(group_versions(b"nope").is_err());
    }
}
