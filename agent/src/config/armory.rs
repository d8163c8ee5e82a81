//! The Armory Scale Agent's configuration file (`armory-agent.yml`), read as
//! it is: every key Armory documents is known here. A key with a meaning in
//! spinlink becomes the native key ([`convert`] builds the native YAML, so
//! `spinlink agent migrate-config` prints exactly what runs); a key without
//! one is accepted with one [`Warning`] saying why; any other key is an
//! error naming it and the file.
//!
//! Start with [`crate::config::Config::load`] and [`convert`]; the mapping, key by key, is in
//! `docs/deploy/migrating-from-armory.md`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_norway::{Mapping, Value};

use super::{Error, Result};

/// The override Armory reads on top of the main file, from the same
/// directory; its documentation spells it both ways (the first found is
/// read).
pub const LOCAL_OVERRIDE_NAMES: [&str; 2] = ["armory-agent-local.yaml", "armory-agent-local.yml"];

/// `clouddriver.grpc` when the file does not set it (Armory's default).
pub const DEFAULT_GRPC: &str = "spin-clouddriver-grpc:9091";

/// The agent id when `HOSTNAME` is unset: Armory has no key for it.
pub const DEFAULT_AGENT_ID: &str = "armory-agent";

/// Where Go (the language of Armory's agent) looks for the system's CA bundle
/// when `clouddriver.tls.cacertFile` is unset, in its order
/// (`crypto/x509/root_linux.go`): the first that exists is used, unless the
/// `SSL_CERT_FILE` environment variable names one, as in Go.
pub const SYSTEM_CA_BUNDLES: [&str; 6] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/pki/tls/cacert.pem",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// Top-level keys only the native format has: a file with any of them is
/// native.
const NATIVE_ONLY: [&str; 8] = [
    "agentId",
    "gateway",
    "reconnect",
    "heartbeatSeconds",
    "cache",
    "admin",
    "reloadIntervalSeconds",
    "leaderElection",
];

/// A key of an Armory file that means nothing to spinlink: accepted, and
/// said once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// The file it is in.
    pub origin: String,
    /// The key, as a path (`kubernetes.accounts[0].metrics`).
    pub key: String,
    /// Why it has no effect here.
    pub reason: &'static str,
}

impl std::fmt::Display for Warning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}: ignored: {}", self.origin, self.key, self.reason)
    }
}

/// An Armory file turned into the native format.
#[derive(Debug, Clone)]
pub struct Converted {
    /// The native configuration's YAML, holding only the keys the Armory
    /// file set (and the gateway address and agent id, always).
    pub native: Value,
    /// The keys that were dropped, one warning each.
    pub warnings: Vec<Warning>,
    /// Native key → the Armory key it came from, so validation errors name
    /// the key the operator wrote.
    pub sources: BTreeMap<String, String>,
}

/// Whether a parsed YAML document is an Armory file rather than a native
/// one: it has no native-only top-level key. (Armory's agent runs with no
/// file at all, so a file of only shared keys is Armory's.) A native file
/// refuses Armory's keys as unknown, and [`parse_text`] refuses native
/// keys in an Armory file (its override).
pub fn is_armory(doc: &Value) -> bool {
    let Value::Mapping(map) = doc else {
        return false;
    };
    !map.keys()
        .filter_map(Value::as_str)
        .any(|k| NATIVE_ONLY.contains(&k))
}

/// The override file next to `main`, if there is one.
pub fn local_override(main: &Path) -> Option<PathBuf> {
    let dir = main.parent()?;
    LOCAL_OVERRIDE_NAMES
        .iter()
        .map(|name| dir.join(name))
        .find(|p| p.is_file())
}

/// Merges `over` into `base`. Armory does not document how its override
/// merges; here mappings merge key by key, at every depth, and any other
/// value (a list, a scalar) of the override replaces the base's whole. So an
/// override's `kubernetes.accounts` is the account list, not an addition to
/// it (Armory's examples keep the accounts in the override alone).
pub fn merge(base: &mut Value, over: Value) {
    match (base, over) {
        (Value::Mapping(base), Value::Mapping(over)) => {
            for (key, value) in over {
                match base.get_mut(&key) {
                    Some(slot) => merge(slot, value),
                    None => {
                        base.insert(key, value);
                    }
                }
            }
        }
        (base, over) => *base = over,
    }
}

/// Parses one Armory file's text: its keys are checked against the typed
/// model (an unknown key is an error naming it, with the line), and the
/// document is returned for merging.
pub fn parse_text(text: &str, origin: &str) -> Result<Value> {
    let parse = |message: String| Error::Parse {
        origin: origin.to_owned(),
        message,
    };
    // An empty override is normal.
    if text.trim().is_empty() {
        return Ok(Value::Mapping(Mapping::new()));
    }
    let doc: Value = serde_norway::from_str(text).map_err(|e| parse(e.to_string()))?;
    if let Value::Mapping(map) = &doc
        && let Some(native) = map
            .keys()
            .filter_map(Value::as_str)
            .find(|k| NATIVE_ONLY.contains(k))
    {
        return Err(Error::Invalid {
            origin: origin.to_owned(),
            key: native.to_owned(),
            message: "a native spinlink key in an Armory agent file; use one format per file \
                      (`spinlink agent migrate-config` converts)"
                .to_owned(),
        });
    }
    // From the text, so that an unknown key's error gives its line.
    serde_norway::from_str::<ArmoryConfig>(text).map_err(|e| parse(e.to_string()))?;
    Ok(doc)
}

/// Converts a merged Armory document to the native format. `agent_id` is
/// the id to state (Armory has no key for it); `origin` names the file in
/// warnings and errors.
pub fn convert(doc: Value, agent_id: &str, origin: &str) -> Result<Converted> {
    let armory: ArmoryConfig = if doc.is_null() {
        ArmoryConfig::default()
    } else {
        serde_norway::from_value(doc).map_err(|e| Error::Parse {
            origin: origin.to_owned(),
            message: e.to_string(),
        })?
    };
    let mut out = Builder {
        root: Mapping::new(),
        warnings: Vec::new(),
        sources: BTreeMap::new(),
        origin: origin.to_owned(),
    };
    out.set(&["agentId"], agent_id.into(), None);
    clouddriver(&mut out, &armory.clouddriver)?;
    kubernetes(&mut out, &armory.kubernetes)?;
    tasks(&mut out, &armory.tasks);
    ops(&mut out, &armory);
    Ok(Converted {
        native: Value::Mapping(out.root),
        warnings: out.warnings,
        sources: out.sources,
    })
}

/// The native document under construction.
struct Builder {
    root: Mapping,
    warnings: Vec<Warning>,
    sources: BTreeMap<String, String>,
    origin: String,
}

impl Builder {
    /// Sets the native key at `path`, remembering the Armory key it came
    /// from.
    fn set(&mut self, path: &[&str], value: Value, from: Option<&str>) {
        let mut map = &mut self.root;
        let (last, parents) = path.split_last().expect("a key");
        for key in parents {
            let slot = map
                .entry(Value::from(*key))
                .or_insert_with(|| Value::Mapping(Mapping::new()));
            map = match slot {
                Value::Mapping(m) => m,
                _ => unreachable!("native keys nest in mappings"),
            };
        }
        map.insert(Value::from(*last), value);
        if let Some(from) = from {
            self.sources.insert(path.join("."), from.to_owned());
        }
    }

    /// Records a key that means nothing here, when the file set it.
    fn ignore<T>(&mut self, value: &Option<T>, key: &str, reason: &'static str) {
        if value.is_some() {
            self.warnings.push(Warning {
                origin: self.origin.clone(),
                key: key.to_owned(),
                reason,
            });
        }
    }

    fn invalid(&self, key: &str, message: &str) -> Error {
        Error::Invalid {
            origin: self.origin.clone(),
            key: key.to_owned(),
            message: message.to_owned(),
        }
    }
}

/// Anything: a key accepted for its name only.
type Any = Option<Value>;

/// The whole Armory file. Every key Armory documents is a field; the ones
/// without a meaning here are [`Any`].
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
struct ArmoryConfig {
    clouddriver: Clouddriver,
    kubernetes: Kubernetes,
    tasks: Tasks,
    server: Option<Server>,
    prometheus: Option<Prometheus>,
    pprof: Any,
    logging: Any,
    secrets: Any,
    hub: Any,
    timeout_seconds: Any,
    dynamic_accounts_enabled: Any,
    dynamic_accounts: Any,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
struct Clouddriver {
    grpc: Option<String>,
    insecure: Option<bool>,
    tls: Option<ClouddriverTls>,
    auth: Any,
    keep_alive_heartbeat_seconds: Option<u64>,
    keep_alive_time_out_seconds: Option<u64>,
    keep_alive_operation_seconds: Any,
    backoff: Backoff,
    response_retries: Any,
    no_proxy: Any,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
struct ClouddriverTls {
    server_name: Option<String>,
    insecure_skip_verify: Option<bool>,
    cacert_file: Option<PathBuf>,
    client_cert_file: Option<PathBuf>,
    client_key_file: Option<PathBuf>,
    client_key_file_password: Option<super::Password>,
}

/// `clouddriver.backoff`: nanoseconds, as Go's gRPC backoff config.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
struct Backoff {
    base_delay: Option<u64>,
    multiplier: Any,
    jitter: Any,
    max_delay: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
struct Kubernetes {
    accounts: Vec<Account>,
    no_proxy: Any,
    reconnect_timeout_ms: Any,
    retries: Any,
    cache_group_size: Any,
    cache_group_delay_ms: Any,
    server_side_apply: Any,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
struct Account {
    name: Option<String>,
    kube_config_file: Option<String>,
    kubeconfig_file: Option<String>,
    service_account: Option<bool>,
    context: Option<String>,
    namespaces: Option<Vec<String>>,
    omit_namespaces: Option<Vec<String>>,
    kinds: Option<Vec<String>>,
    omit_kinds: Option<Vec<String>>,
    custom_resource_definitions: Option<Vec<Crd>>,
    insecure: Any,
    o_auth_scopes: Any,
    only_namespaced_resources: Any,
    metrics: Any,
    permissions: Any,
    max_resumable_resource_age_ms: Any,
    only_spinnaker_managed: Any,
    no_proxy: Any,
    skip_server_side_apply: Any,
    skip_manifest_defaults: Any,
    // Clouddriver's own account keys (its `ManagedAccount`, and Halyard's):
    // Armory documents that an account block copied from Clouddriver works
    // as it is, its unused keys ignored.
    environment: Any,
    account_type: Any,
    o_auth_service_account: Any,
    oauth_scopes: Any,
    kubeconfig_contents: Any,
    kubectl_executable: Any,
    kubectl_request_timeout_seconds: Any,
    cache_threads: Any,
    required_group_membership: Any,
    naming_strategy: Any,
    debug: Any,
    check_permissions_on_startup: Any,
    custom_resources: Any,
    caching_policies: Any,
    cache_interval_seconds: Any,
    cache_all_application_relationships: Any,
    raw_resources_endpoint_config: Any,
    provider_version: Any,
    docker_registries: Any,
    configure_image_pull_secrets: Any,
    live_manifest_calls: Any,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
struct Crd {
    kind: String,
    scope: Any,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
struct Tasks {
    total_budget: Option<usize>,
    budget_per_account: Option<usize>,
    queue_check_frequency_ms: Any,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
struct Server {
    host: Option<String>,
    port: Option<u16>,
    ssl: Any,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
struct Prometheus {
    enabled: Option<bool>,
    port: Option<u16>,
}

/// Armory's default `prometheus.port`.
const DEFAULT_PROMETHEUS_PORT: u16 = 8008;
/// Armory's default `server.host`.
const DEFAULT_SERVER_HOST: &str = "localhost";
/// Armory's default `server.port`.
const DEFAULT_SERVER_PORT: u16 = 8082;

fn clouddriver(out: &mut Builder, c: &Clouddriver) -> Result<()> {
    let grpc = c.grpc.as_deref().unwrap_or(DEFAULT_GRPC);
    if grpc.is_empty() || grpc.contains("://") || grpc.contains('/') {
        return Err(out.invalid("clouddriver.grpc", "must be host:port"));
    }
    let tls = c.tls.as_ref();
    // Armory 1.0.47: an unset `insecure` is derived from the TLS settings.
    let insecure = c.insecure.unwrap_or(tls.is_none());
    let scheme = if insecure { "http" } else { "https" };
    out.set(
        &["gateway", "url"],
        format!("{scheme}://{grpc}").into(),
        Some("clouddriver.grpc"),
    );
    if insecure {
        out.set(
            &["gateway", "insecure"],
            true.into(),
            Some("clouddriver.insecure"),
        );
        if tls.is_some() {
            out.warnings.push(Warning {
                origin: out.origin.clone(),
                key: "clouddriver.tls".into(),
                reason: "clouddriver.insecure is true, so the connection is plaintext and no TLS \
                         setting is used",
            });
        }
    } else {
        let tls_default = ClouddriverTls::default();
        let t = tls.unwrap_or(&tls_default);
        if t.insecure_skip_verify == Some(true) {
            return Err(out.invalid(
                "clouddriver.tls.insecureSkipVerify",
                "spinlink always verifies the gateway's certificate; name its CA in \
                 clouddriver.tls.cacertFile instead",
            ));
        }
        if let Some(name) = &t.server_name {
            out.set(
                &["gateway", "serverName"],
                name.clone().into(),
                Some("clouddriver.tls.serverName"),
            );
        }
        let ca = match &t.cacert_file {
            Some(ca) => ca.clone(),
            None => std::env::var_os("SSL_CERT_FILE")
                .map(PathBuf::from)
                .into_iter()
                .chain(SYSTEM_CA_BUNDLES.iter().map(PathBuf::from))
                .find(|p| p.is_file())
                .ok_or_else(|| {
                    out.invalid(
                        "clouddriver.tls.cacertFile",
                        "required: no system CA bundle found to verify the gateway with",
                    )
                })?,
        };
        out.set(
            &["gateway", "caFile"],
            path_value(&ca),
            Some("clouddriver.tls.cacertFile"),
        );
        if let Some(cert) = &t.client_cert_file {
            out.set(
                &["gateway", "certFile"],
                path_value(cert),
                Some("clouddriver.tls.clientCertFile"),
            );
            // Armory: "client key file if not included in the certificate".
            let key = t.client_key_file.as_ref().unwrap_or(cert);
            out.set(
                &["gateway", "keyFile"],
                path_value(key),
                Some("clouddriver.tls.clientKeyFile"),
            );
        } else if t.client_key_file.is_some() {
            return Err(out.invalid(
                "clouddriver.tls.clientCertFile",
                "required with clouddriver.tls.clientKeyFile",
            ));
        }
        if let Some(password) = &t.client_key_file_password {
            out.set(
                &["gateway", "keyPassword"],
                password.0.clone().into(),
                Some("clouddriver.tls.clientKeyFilePassword"),
            );
        }
    }
    out.ignore(
        &c.auth,
        "clouddriver.auth",
        "the gateway identifies agents by their client certificate \
         (clouddriver.tls.clientCertFile), not by a bearer token",
    );
    match c.keep_alive_heartbeat_seconds {
        Some(0) => out.warnings.push(Warning {
            origin: out.origin.clone(),
            key: "clouddriver.keepAliveHeartbeatSeconds".into(),
            reason: "0 (off) is not kept: spinlink always pings the gateway, which is how a \
                     dead connection is noticed",
        }),
        Some(s) => out.set(
            &["gateway", "keepaliveIntervalSeconds"],
            s.into(),
            Some("clouddriver.keepAliveHeartbeatSeconds"),
        ),
        None => {}
    }
    match c.keep_alive_time_out_seconds {
        Some(0) => out.warnings.push(Warning {
            origin: out.origin.clone(),
            key: "clouddriver.keepAliveTimeOutSeconds".into(),
            reason: "0 is not kept: an unanswered ping always ends the connection",
        }),
        Some(s) => out.set(
            &["gateway", "keepaliveTimeoutSeconds"],
            s.into(),
            Some("clouddriver.keepAliveTimeOutSeconds"),
        ),
        None => {}
    }
    out.ignore(
        &c.keep_alive_operation_seconds,
        "clouddriver.keepAliveOperationSeconds",
        "operations are relayed requests on a stream that stays open; there is no operations \
         stream to restart",
    );
    // Nanoseconds to milliseconds; a delay under 1 ms becomes 1 ms (0 is
    // refused natively).
    let millis = |ns: u64| (ns / 1_000_000).max(1);
    if let Some(ns) = c.backoff.base_delay {
        out.set(
            &["reconnect", "initialBackoffMillis"],
            millis(ns).into(),
            Some("clouddriver.backoff.baseDelay"),
        );
    }
    if let Some(ns) = c.backoff.max_delay {
        out.set(
            &["reconnect", "maxBackoffMillis"],
            millis(ns).into(),
            Some("clouddriver.backoff.maxDelay"),
        );
    }
    const BACKOFF_SHAPE: &str = "spinlink's reconnect backoff doubles and is fully jittered; only \
                                 its first and largest delays are set";
    out.ignore(
        &c.backoff.multiplier,
        "clouddriver.backoff.multiplier",
        BACKOFF_SHAPE,
    );
    out.ignore(
        &c.backoff.jitter,
        "clouddriver.backoff.jitter",
        BACKOFF_SHAPE,
    );
    out.ignore(
        &c.response_retries,
        "clouddriver.responseRetries",
        "responses stream back over the relay as the API server sends them; there is no \
         operation result to send again",
    );
    out.ignore(
        &c.no_proxy,
        "clouddriver.noProxy",
        "spinlink dials the gateway directly, never through a proxy",
    );
    Ok(())
}

fn path_value(p: &Path) -> Value {
    p.display().to_string().into()
}

fn strings(list: &[String]) -> Value {
    Value::Sequence(list.iter().map(|s| s.as_str().into()).collect())
}

/// Armory's kind names are singular camelCase (`replicaSet`); spinlink
/// matches kind names in any case, and states them as Kubernetes spells
/// them (`ReplicaSet`). Names with a group (`Kind.group`) are kept.
fn kind_name(armory: &str) -> String {
    let mut chars = armory.trim().chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

fn kubernetes(out: &mut Builder, k: &Kubernetes) -> Result<()> {
    let mut accounts = Vec::new();
    for (i, a) in k.accounts.iter().enumerate() {
        accounts.push(Value::Mapping(account(out, i, a)?));
    }
    if !accounts.is_empty() {
        out.set(&["kubernetes", "accounts"], Value::Sequence(accounts), None);
    }
    out.ignore(
        &k.no_proxy,
        "kubernetes.noProxy",
        "there is no proxy bypass setting: keep HTTPS_PROXY out of the agent's environment (a \
         kubeconfig account would try it, and spinlink does not proxy)",
    );
    out.ignore(
        &k.reconnect_timeout_ms,
        "kubernetes.reconnectTimeoutMs",
        "reconnects to the gateway follow clouddriver.backoff (reconnect.* natively)",
    );
    out.ignore(
        &k.retries,
        "kubernetes.retries",
        "the agent relays each request once; Clouddriver retries its own deploys",
    );
    const GROUPS: &str = "initial lists are already paced by tasks.totalBudget and \
                          tasks.budgetPerAccount, over all accounts";
    out.ignore(&k.cache_group_size, "kubernetes.cacheGroupSize", GROUPS);
    out.ignore(
        &k.cache_group_delay_ms,
        "kubernetes.cacheGroupDelayMs",
        GROUPS,
    );
    out.ignore(
        &k.server_side_apply,
        "kubernetes.serverSideApply",
        "Clouddriver applies manifests itself through spinlink, so apply settings are \
         Clouddriver's",
    );
    Ok(())
}

fn account(out: &mut Builder, i: usize, a: &Account) -> Result<Mapping> {
    let key = |k: &str| format!("kubernetes.accounts[{i}].{k}");
    let mut m = Mapping::new();
    let mut set = |out: &mut Builder, native: &str, value: Value, from: &str| {
        m.insert(native.into(), value);
        out.sources.insert(key(native), key(from));
    };
    if let Some(name) = &a.name {
        set(out, "name", name.as_str().into(), "name");
    }
    let file = match (&a.kube_config_file, &a.kubeconfig_file) {
        (Some(_), Some(_)) => {
            return Err(out.invalid(
                &key("kubeConfigFile"),
                &format!(
                    "set either {} or {}, not both",
                    key("kubeConfigFile"),
                    key("kubeconfigFile")
                ),
            ));
        }
        (Some(f), None) => Some((f, "kubeConfigFile")),
        (None, Some(f)) => Some((f, "kubeconfigFile")),
        (None, None) => None,
    };
    if let Some((file, spelling)) = file {
        // Armory resolves `encrypted:`/`encryptedFile:` through its secret
        // engines (Vault, Kubernetes Secrets); spinlink reads files.
        if file.starts_with("encrypted:") || file.starts_with("encryptedFile:") {
            return Err(out.invalid(
                &key(spelling),
                "secret references are not resolved by spinlink: mount the kubeconfig as a \
                 file and name its path (or use kubeconfigSecret in a native file)",
            ));
        }
        set(out, "kubeconfigFile", file.as_str().into(), spelling);
    }
    if let Some(sa) = a.service_account {
        set(out, "serviceAccount", sa.into(), "serviceAccount");
    }
    if let Some(context) = &a.context {
        set(out, "context", context.as_str().into(), "context");
    }
    for (native, list) in [
        ("namespaces", &a.namespaces),
        ("omitNamespaces", &a.omit_namespaces),
    ] {
        if let Some(list) = list.as_ref().filter(|l| !l.is_empty()) {
            set(out, native, strings(list), native);
        }
    }
    for (native, list) in [("kinds", &a.kinds), ("omitKinds", &a.omit_kinds)] {
        if let Some(list) = list.as_ref().filter(|l| !l.is_empty()) {
            let names: Vec<String> = list.iter().map(|k| kind_name(k)).collect();
            set(out, native, strings(&names), native);
        }
    }
    if let Some(crds) = a
        .custom_resource_definitions
        .as_ref()
        .filter(|l| !l.is_empty())
    {
        let names: Vec<String> = crds.iter().map(|c| c.kind.clone()).collect();
        set(
            out,
            "customResourceDefinitions",
            strings(&names),
            "customResourceDefinitions",
        );
        for (j, crd) in crds.iter().enumerate() {
            out.ignore(
                &crd.scope,
                &key(&format!("customResourceDefinitions[{j}].scope")),
                "the scope of a custom resource is read from the API server's discovery",
            );
        }
    }
    out.ignore(
        &a.insecure,
        &key("insecure"),
        "the API server is verified as the kubeconfig says \
         (insecure-skip-tls-verify in its cluster)",
    );
    out.ignore(
        &a.o_auth_scopes,
        &key("oAuthScopes"),
        "credentials come from the kubeconfig (for GKE, its exec plugin)",
    );
    out.ignore(
        &a.only_namespaced_resources,
        &key("onlyNamespacedResources"),
        "a kind the agent may not list (403) is skipped, so an agent whose RBAC is namespaced \
         needs no setting",
    );
    out.ignore(
        &a.metrics,
        &key("metrics"),
        "the agent sends no pod metrics",
    );
    out.ignore(
        &a.permissions,
        &key("permissions"),
        "Fiat permissions are set where Clouddriver's accounts are defined, not in the agent \
         (see docs/deploy/migrating-from-armory.md)",
    );
    out.ignore(
        &a.max_resumable_resource_age_ms,
        &key("maxResumableResourceAgeMs"),
        "the agent always resumes from the sidecar's resourceVersions; one the API server \
         no longer holds is listed again",
    );
    out.ignore(
        &a.only_spinnaker_managed,
        &key("onlySpinnakerManaged"),
        "not implemented by Armory's agent either; every object is cached",
    );
    out.ignore(
        &a.no_proxy,
        &key("noProxy"),
        "there is no proxy bypass setting: keep HTTPS_PROXY out of the agent's environment (a \
         kubeconfig account would try it, and spinlink does not proxy)",
    );
    const APPLY: &str = "Clouddriver applies manifests itself through spinlink, so apply settings \
                         are Clouddriver's";
    out.ignore(
        &a.skip_server_side_apply,
        &key("skipServerSideApply"),
        APPLY,
    );
    out.ignore(
        &a.skip_manifest_defaults,
        &key("skipManifestDefaults"),
        APPLY,
    );
    for (value, name) in [
        (&a.environment, "environment"),
        (&a.account_type, "accountType"),
        (&a.o_auth_service_account, "oAuthServiceAccount"),
        (&a.oauth_scopes, "oauthScopes"),
        (&a.kubeconfig_contents, "kubeconfigContents"),
        (&a.kubectl_executable, "kubectlExecutable"),
        (
            &a.kubectl_request_timeout_seconds,
            "kubectlRequestTimeoutSeconds",
        ),
        (&a.cache_threads, "cacheThreads"),
        (&a.required_group_membership, "requiredGroupMembership"),
        (&a.naming_strategy, "namingStrategy"),
        (&a.debug, "debug"),
        (&a.check_permissions_on_startup, "checkPermissionsOnStartup"),
        (&a.custom_resources, "customResources"),
        (&a.caching_policies, "cachingPolicies"),
        (&a.cache_interval_seconds, "cacheIntervalSeconds"),
        (
            &a.cache_all_application_relationships,
            "cacheAllApplicationRelationships",
        ),
        (
            &a.raw_resources_endpoint_config,
            "rawResourcesEndpointConfig",
        ),
        (&a.provider_version, "providerVersion"),
        (&a.docker_registries, "dockerRegistries"),
        (&a.configure_image_pull_secrets, "configureImagePullSecrets"),
        (&a.live_manifest_calls, "liveManifestCalls"),
    ] {
        out.ignore(
            value,
            &key(name),
            "a Clouddriver account setting, which Armory's agent ignored too; it belongs in \
             the account as Clouddriver knows it",
        );
    }
    Ok(m)
}

fn tasks(out: &mut Builder, t: &Tasks) {
    for (native, value) in [
        ("totalBudget", t.total_budget),
        ("budgetPerAccount", t.budget_per_account),
    ] {
        match value {
            // Older Armory files: 0 is unlimited, the memory spike budgets
            // exist to prevent; spinlink's default stays.
            Some(0) => out.warnings.push(Warning {
                origin: out.origin.clone(),
                key: format!("tasks.{native}"),
                reason: "0 (unlimited) is not kept: spinlink's default budget stays, as \
                         unbounded initial lists are the memory spike budgets prevent",
            }),
            Some(n) => {
                let from = format!("tasks.{native}");
                out.set(&["tasks", native], (n as u64).into(), Some(&from));
            }
            None => {}
        }
    }
    out.ignore(
        &t.queue_check_frequency_ms,
        "tasks.queueCheckFrequencyMs",
        "a queued initial list starts as soon as a budget slot frees",
    );
}

fn ops(out: &mut Builder, a: &ArmoryConfig) {
    let prometheus = a
        .prometheus
        .as_ref()
        .filter(|p| p.enabled == Some(true))
        .map(|p| p.port.unwrap_or(DEFAULT_PROMETHEUS_PORT));
    // spinlink serves health and metrics on one admin port: `server.*`
    // names it; metrics alone (`prometheus.*`) name it when `server` is
    // unset.
    match (&a.server, prometheus) {
        (Some(server), _) => {
            let host = server.host.as_deref().unwrap_or(DEFAULT_SERVER_HOST);
            let port = server.port.unwrap_or(DEFAULT_SERVER_PORT);
            out.set(
                &["admin", "listen"],
                socket(host, port).into(),
                Some("server.port"),
            );
            out.ignore(
                &server.ssl,
                "server.ssl",
                "the admin port serves plain HTTP (health and metrics only)",
            );
            if prometheus.is_some_and(|p| p != port) {
                out.warnings.push(Warning {
                    origin: out.origin.clone(),
                    key: "prometheus.port".into(),
                    reason: "metrics are served at /metrics on the admin port (server.port)",
                });
            }
        }
        (None, Some(port)) => out.set(
            &["admin", "listen"],
            socket("0.0.0.0", port).into(),
            Some("prometheus.port"),
        ),
        (None, None) => {}
    }
    out.ignore(
        &a.pprof,
        "pprof",
        "a Go profiler; spinlink is not written in Go",
    );
    out.ignore(
        &a.logging,
        "logging",
        "spinlink logs to stderr; set the level with the SPINLINK_LOG environment variable",
    );
    out.ignore(
        &a.secrets,
        "secrets",
        "spinlink resolves no encrypted: references; it reads mounted files",
    );
    out.ignore(
        &a.hub,
        "hub",
        "Armory's hosted cloud service; spinlink connects to its own gateway",
    );
    out.ignore(
        &a.timeout_seconds,
        "timeoutSeconds",
        "a relayed request carries its caller's deadline, which the agent enforces; there is \
         no timeout per agent",
    );
    out.ignore(
        &a.dynamic_accounts_enabled,
        "dynamicAccountsEnabled",
        "spinlink's dynamic accounts are opted into with dynamicAccounts.enabled in a native file",
    );
    out.ignore(
        &a.dynamic_accounts,
        "dynamicAccounts",
        "these are settings of Armory's Clouddriver plugin, not of the agent",
    );
}

/// `host:port` as a socket address the native `admin.listen` parses:
/// `localhost` is the loopback address.
fn socket(host: &str, port: u16) -> String {
    let host = match host {
        "" => "0.0.0.0",
        "localhost" => "127.0.0.1",
        h => h,
    };
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Fuzz body: any text, as a main file and as its override, is refused or
/// converted; never a panic.
pub fn fuzz_armory_file(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (main, local) = text.split_once("\n---local\n").unwrap_or((text, ""));
    let Ok(mut doc) = parse_text(main, "main") else {
        return;
    };
    if let Ok(over) = parse_text(local, "local") {
        merge(&mut doc, over);
    }
    if let Ok(converted) = convert(doc, "fuzz", "main") {
        // What `migrate-config` prints must parse as YAML again.
        let yaml = serde_norway::to_string(&converted.native).expect("a YAML value serializes");
        serde_norway::from_str::<Value>(&yaml).expect("printed YAML parses");
    }
}

#[cfg(test)]
mod tests;
