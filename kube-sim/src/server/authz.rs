//! Who a request acts as, and whether RBAC lets it, as the API server decides:
//! impersonation headers (`Impersonate-User`, `Impersonate-Group`), the RBAC
//! objects in the store (Roles, ClusterRoles and their bindings),
//! `SelfSubjectAccessReview`s, and 403 bodies worded as the server words them
//! (`fixtures/authz/`, `fixtures/errors/403-*`).
//!
//! A request without impersonation acts as the kubeconfig's admin
//! (`system:masters`), who may do everything: the rest of kube-sim is
//! unchanged for every client that does not impersonate. Non-resource paths
//! (discovery, `/openapi`, `/version`) are open to every authenticated user,
//! as the `system:discovery` and `system:public-info-viewer` roles make them.

use http::HeaderMap;
use serde_json::{Value, json};

use crate::error::Status;
use crate::resources::ResourceInfo;
use crate::store::Sim;

/// The group whose members RBAC never refuses.
const MASTERS: &str = "system:masters";

/// Everyone who authenticated, impersonated users included.
const AUTHENTICATED: &str = "system:authenticated";

/// Who a request acts as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct User {
    pub name: String,
    pub groups: Vec<String>,
}

impl User {
    fn admin() -> Self {
        User {
            name: "kubernetes-admin".into(),
            groups: vec![MASTERS.into(), AUTHENTICATED.into()],
        }
    }
}

/// The user a request acts as: the admin, or whom its impersonation
/// headers name. A service account gets the groups the server adds to one
/// (`system:serviceaccounts`, `system:serviceaccounts:<namespace>`), and
/// every impersonated user `system:authenticated`.
pub(crate) fn requester(headers: &HeaderMap) -> Result<User, Status> {
    let groups: Vec<String> = headers
        .get_all("impersonate-group")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(str::to_owned)
        .collect();
    let Some(name) = headers
        .get("impersonate-user")
        .and_then(|v| v.to_str().ok())
    else {
        if groups.is_empty() {
            return Ok(User::admin());
        }
        // The server prints the requester as a Go value here.
        return Err(Status::bad_request(format!(
            "requested &user.DefaultInfo{{Name:\"\", UID:\"\", Groups:[]string{{{}}}, \
             Extra:map[string][]string(nil)}} without impersonating a user name",
            groups
                .iter()
                .map(|g| format!("{g:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        )));
    };
    let mut user = User {
        name: name.to_owned(),
        groups,
    };
    if let Some(namespace) = service_account_namespace(name) {
        user.groups.push("system:serviceaccounts".into());
        user.groups
            .push(format!("system:serviceaccounts:{namespace}"));
    }
    if !user.groups.iter().any(|g| g == AUTHENTICATED) {
        user.groups.push(AUTHENTICATED.into());
    }
    Ok(user)
}

fn service_account_namespace(user: &str) -> Option<&str> {
    let rest = user.strip_prefix("system:serviceaccount:")?;
    let (namespace, name) = rest.split_once(':')?;
    (!namespace.is_empty() && !name.is_empty()).then_some(namespace)
}

/// What a resource request does, in RBAC's terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Attributes<'a> {
    pub verb: &'a str,
    pub group: &'a str,
    pub resource: &'a str,
    pub subresource: Option<&'a str>,
    pub namespace: Option<&'a str>,
    pub name: Option<&'a str>,
}

/// Why a request is allowed (the reason a review gives), or `None` when
/// RBAC refuses it.
pub(crate) fn decide(sim: &Sim, user: &User, attrs: &Attributes<'_>) -> Option<String> {
    if user.groups.iter().any(|g| g == MASTERS) {
        return Some(String::new());
    }
    // `system:basic-user`: everyone may ask what they may do.
    let own_review = attrs.verb == "create"
        && matches!(
            (attrs.group, attrs.resource),
            (
                "authorization.k8s.io",
                "selfsubjectaccessreviews" | "selfsubjectrulesreviews"
            ) | ("authentication.k8s.io", "selfsubjectreviews")
        );
    if own_review {
        return Some(String::new());
    }
    for binding in sim.list("clusterrolebindings", None) {
        if let Some(reason) = grants(sim, user, attrs, &binding, "ClusterRoleBinding") {
            return Some(reason);
        }
    }
    let namespace = attrs.namespace.filter(|ns| !ns.is_empty())?;
    sim.list("rolebindings", Some(namespace))
        .iter()
        .find_map(|binding| grants(sim, user, attrs, binding, "RoleBinding"))
}

/// The reason `binding` allows the request, if it does.
fn grants(
    sim: &Sim,
    user: &User,
    attrs: &Attributes<'_>,
    binding: &Value,
    binding_kind: &str,
) -> Option<String> {
    let subject = binding["subjects"]
        .as_array()?
        .iter()
        .find(|s| subject_matches(user, s))?;
    let role_kind = binding["roleRef"]["kind"].as_str()?;
    let role_name = binding["roleRef"]["name"].as_str()?;
    let binding_ns = binding["metadata"]["namespace"].as_str();
    let role = match role_kind {
        "ClusterRole" => sim.get("clusterroles", None, role_name)?,
        "Role" => sim.get("roles", binding_ns, role_name)?,
        _ => return None,
    };
    if !role["rules"]
        .as_array()?
        .iter()
        .any(|rule| rule_allows(rule, attrs))
    {
        return None;
    }
    let binding_name = binding["metadata"]["name"].as_str().unwrap_or_default();
    let binding_label = match binding_ns {
        Some(ns) if binding_kind == "RoleBinding" => format!("{binding_name}/{ns}"),
        _ => binding_name.to_owned(),
    };
    let subject_kind = subject["kind"].as_str().unwrap_or_default();
    let subject_name = subject["name"].as_str().unwrap_or_default();
    let subject_label = match (subject_kind, subject["namespace"].as_str()) {
        ("ServiceAccount", Some(ns)) => format!("{subject_name}/{ns}"),
        _ => subject_name.to_owned(),
    };
    Some(format!(
        "RBAC: allowed by {binding_kind} \"{binding_label}\" of {role_kind} \"{role_name}\" \
         to {subject_kind} \"{subject_label}\""
    ))
}

fn subject_matches(user: &User, subject: &Value) -> bool {
    let name = subject["name"].as_str().unwrap_or_default();
    match subject["kind"].as_str() {
        Some("User") => user.name == name,
        Some("Group") => user.groups.iter().any(|g| g == name),
        Some("ServiceAccount") => {
            let namespace = subject["namespace"].as_str().unwrap_or_default();
            user.name == format!("system:serviceaccount:{namespace}:{name}")
        }
        _ => false,
    }
}

fn listed(rule: &Value, key: &str, want: &str) -> bool {
    rule[key]
        .as_array()
        .is_some_and(|items| items.iter().any(|i| i == "*" || i == want))
}

/// Whether one PolicyRule covers the request, as RBAC matches rules: verb,
/// API group, `resource` or `resource/subresource` (with `*` and
/// `resource/*`), and `resourceNames` (which no unnamed request matches).
fn rule_allows(rule: &Value, attrs: &Attributes<'_>) -> bool {
    if !listed(rule, "verbs", attrs.verb) || !listed(rule, "apiGroups", attrs.group) {
        return false;
    }
    let resource_ok = match attrs.subresource {
        None => listed(rule, "resources", attrs.resource),
        Some(sub) => {
            let full = format!("{}/{sub}", attrs.resource);
            let any_sub = format!("{}/*", attrs.resource);
            rule["resources"].as_array().is_some_and(|items| {
                items
                    .iter()
                    .any(|i| i == "*" || i == full.as_str() || i == any_sub.as_str())
            })
        }
    };
    if !resource_ok {
        return false;
    }
    match rule["resourceNames"].as_array() {
        Some(names) if !names.is_empty() => {
            attrs.name.is_some_and(|n| names.iter().any(|i| i == n))
        }
        _ => true,
    }
}

/// The 403 the server answers when RBAC refuses `attrs` to `user`.
pub(crate) fn forbidden(res: &ResourceInfo, user: &User, attrs: &Attributes<'_>) -> Status {
    Status::forbidden(
        res.api(),
        attrs.name,
        attrs.subresource,
        &user.name,
        attrs.verb,
        attrs.namespace,
    )
}

fn text(v: &Value) -> Option<&str> {
    v.as_str().filter(|s| !s.is_empty())
}

/// Answers a `SelfSubjectAccessReview` (already decoded) for `user`: the
/// review as sent, with its `status`.
pub(crate) fn self_subject_access_review(sim: &Sim, user: &User, review: &Value) -> Value {
    let spec = &review["spec"];
    let ra = &spec["resourceAttributes"];
    let status = if ra.is_object() {
        let attrs = Attributes {
            verb: text(&ra["verb"]).unwrap_or_default(),
            group: text(&ra["group"]).unwrap_or_default(),
            resource: text(&ra["resource"]).unwrap_or_default(),
            subresource: text(&ra["subresource"]),
            namespace: text(&ra["namespace"]),
            name: text(&ra["name"]),
        };
        match decide(sim, user, &attrs) {
            Some(reason) if !reason.is_empty() => json!({"allowed": true, "reason": reason}),
            Some(_) => json!({"allowed": true}),
            None => json!({"allowed": false}),
        }
    } else {
        // Non-resource paths are open to every authenticated user here.
        json!({"allowed": true})
    };
    json!({
        "kind": "SelfSubjectAccessReview",
        "apiVersion": "authorization.k8s.io/v1",
        "metadata": {},
        "spec": spec,
        "status": status,
    })
}
