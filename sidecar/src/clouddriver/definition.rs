//! The account definition the sidecar stores in Clouddriver: a
//! `KubernetesAccountProperties.ManagedAccount` (clouddriver-kubernetes,
//! `config/KubernetesAccountProperties.java`) whose kubeconfig points at
//! this sidecar's facade.

use serde_json::{Value, json};

use super::{ACCOUNT_TYPE, SEGMENT};
use crate::accounts::NamespaceScope;
use crate::config::ClouddriverConfig;

/// The kubeconfig Clouddriver's kubectl uses for `account`: one cluster at
/// the facade's base path for the account, no credentials (the facade
/// listens on loopback beside Clouddriver).
pub fn kubeconfig(facade_url: &str, account: &str) -> String {
    let server = format!(
        "{}/accounts/{}",
        facade_url.trim_end_matches('/'),
        percent_encoding::utf8_percent_encode(account, SEGMENT)
    );
    let doc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": account, "cluster": {"server": server}}],
        "users": [{"name": "spinlink", "user": {}}],
        "contexts": [{"name": account, "context": {"cluster": account, "user": "spinlink"}}],
        "current-context": account,
    });
    serde_norway::to_string(&doc).unwrap_or_default()
}

/// The body of `PUT {baseUrl}/credentials` for `account`, whose agent
/// watches `scope`.
///
/// The type discriminator is `type` (clouddriver-core
/// `jackson/mixins/CredentialsDefinitionMixin.java`: `@JsonTypeInfo(use =
/// NAME, property = "type")`; `kubernetes` is the `@JsonTypeName` of
/// `ManagedAccount`). `ManagedAccount.validate()` refuses `namespaces`
/// together with `omitNamespaces`, and only when Clouddriver *loads* the
/// account (after the write was answered 200), so at most one of them is
/// ever sent: the agent's namespaces less the omitted ones when it names
/// any, else the configured ones (`clouddriver.account.namespaces`), else
/// the omitted ones alone.
pub fn definition(
    config: &ClouddriverConfig,
    facade_url: &str,
    account: &str,
    scope: &NamespaceScope,
) -> Value {
    let a = &config.account;
    let mut def = json!({
        "type": ACCOUNT_TYPE,
        "name": account,
        "kubeconfigContents": kubeconfig(facade_url, account),
        "context": account,
        "onlySpinnakerManaged": a.only_spinnaker_managed,
        "cacheThreads": a.cache_threads,
        // Discovery decides the kinds; the facade serves them all.
        "checkPermissionsOnStartup": false,
    });
    if let Some(env) = &a.environment {
        def["environment"] = json!(env);
    }
    let named: &[String] = if scope.namespaces.is_empty() {
        &a.namespaces
    } else {
        &scope.namespaces
    };
    let namespaces: Vec<&String> = named
        .iter()
        .filter(|n| !scope.omit_namespaces.contains(n))
        .collect();
    if !namespaces.is_empty() {
        def["namespaces"] = json!(namespaces);
    } else if !named.is_empty() {
        // Every named namespace is also omitted: the agent caches none of
        // them. An empty list would mean "all"; the named ones serve empty.
        def["namespaces"] = json!(named);
    } else if !scope.omit_namespaces.is_empty() {
        def["omitNamespaces"] = json!(scope.omit_namespaces);
    }
    if !a.permissions.is_empty() {
        def["permissions"] = json!(a.permissions);
    }
    def
}

/// Whether the account Clouddriver serves (`GET /credentials/{name}`, the
/// `KubernetesNamedAccountCredentials` it loaded, rendered by
/// `CredentialsController.renderAccountCredentials` with `expand`) was
/// loaded from `def`: its name, and, where the answer shows them, the
/// context and namespace lists of its `credentials`
/// (`KubernetesCredentials`: `context`, `namespaces`, `omitNamespaces` have
/// getters). An account still loaded from an older definition (a legacy
/// one being replaced, or one Clouddriver refused to load over it) differs.
pub fn loaded_from(live: &Value, def: &Value) -> bool {
    if live.get("name") != def.get("name") {
        return false;
    }
    let Some(credentials) = live.get("credentials").filter(|c| c.is_object()) else {
        return true;
    };
    if let Some(context) = credentials.get("context").filter(|c| !c.is_null())
        && Some(context) != def.get("context")
    {
        return false;
    }
    let list = |v: Option<&Value>| -> Vec<Value> {
        v.and_then(Value::as_array).cloned().unwrap_or_default()
    };
    ["namespaces", "omitNamespaces"].iter().all(|key| {
        credentials.get(key).is_none_or(Value::is_null)
            || list(credentials.get(key)) == list(def.get(key))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(namespaces: &[&str], omit: &[&str]) -> NamespaceScope {
        NamespaceScope {
            namespaces: namespaces.iter().map(|s| (*s).to_owned()).collect(),
            omit_namespaces: omit.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    #[test]
    fn definition_has_the_managed_account_shape() {
        let mut config = ClouddriverConfig::default();
        config.account.namespaces = vec!["a".into()];
        config
            .account
            .permissions
            .insert("READ".into(), vec!["dev".into()]);
        let def = definition(
            &config,
            "http://127.0.0.1:7003/",
            "prod-1",
            &scope(&[], &[]),
        );
        assert_eq!(def["type"], "kubernetes");
        assert!(def.get("@type").is_none());
        assert_eq!(def["name"], "prod-1");
        assert_eq!(def["namespaces"], json!(["a"]));
        assert!(def.get("omitNamespaces").is_none());
        assert_eq!(def["permissions"]["READ"], json!(["dev"]));
        assert!(def.get("environment").is_none());
        let kc: Value =
            serde_norway::from_str(def["kubeconfigContents"].as_str().unwrap()).unwrap();
        assert_eq!(
            kc["clusters"][0]["cluster"]["server"],
            "http://127.0.0.1:7003/accounts/prod-1"
        );
        assert_eq!(kc["current-context"], "prod-1");
    }

    #[test]
    fn never_both_namespace_lists() {
        let mut config = ClouddriverConfig::default();
        let url = "http://f";
        // The agent's namespaces win, less those it omits.
        config.account.namespaces = vec!["a".into()];
        let def = definition(
            &config,
            url,
            "p",
            &scope(&["b", "kube-system"], &["kube-system"]),
        );
        assert_eq!(def["namespaces"], json!(["b"]));
        assert!(def.get("omitNamespaces").is_none(), "{def}");
        // Configured namespaces with an agent that only omits some.
        let def = definition(&config, url, "p", &scope(&[], &["kube-system"]));
        assert_eq!(def["namespaces"], json!(["a"]));
        assert!(def.get("omitNamespaces").is_none(), "{def}");
        // Nothing named anywhere: the omitted ones alone.
        config.account.namespaces.clear();
        let def = definition(&config, url, "p", &scope(&[], &["kube-system"]));
        assert_eq!(def["omitNamespaces"], json!(["kube-system"]));
        assert!(def.get("namespaces").is_none(), "{def}");
        // Every named namespace omitted: still named, never "all".
        let def = definition(&config, url, "p", &scope(&["x"], &["x"]));
        assert_eq!(def["namespaces"], json!(["x"]));
        assert!(def.get("omitNamespaces").is_none(), "{def}");
    }

    #[test]
    fn the_loaded_account_is_told_from_an_older_one() {
        let config = ClouddriverConfig::default();
        let def = definition(&config, "http://f", "p", &scope(&["b"], &[]));
        let live = json!({"name": "p", "type": "kubernetes",
            "credentials": {"context": "p", "namespaces": ["b"], "omitNamespaces": []}});
        assert!(loaded_from(&live, &def));
        // Without the expanded credentials only the name can be compared.
        assert!(loaded_from(&json!({"name": "p"}), &def));
        let legacy = json!({"name": "p", "credentials": {"context": "old", "namespaces": ["b"]}});
        assert!(!loaded_from(&legacy, &def));
        let narrower = json!({"name": "p", "credentials": {"context": "p", "namespaces": ["c"]}});
        assert!(!loaded_from(&narrower, &def));
        assert!(!loaded_from(&json!({"name": "q"}), &def));
    }
}
