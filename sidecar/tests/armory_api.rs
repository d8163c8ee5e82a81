//! Armory's accounts REST API on a running sidecar, each call as Armory's
//! dynamic-accounts and migration task pages show it: a dynamic account is
//! created, served by a (played) agent, updated and deleted; accounts are
//! taken from Clouddriver's account storage as INACTIVE, activated,
//! deactivated and deleted. Every answer is checked for its status code,
//! its shape and its effect on spinlink's own accounts API, and for the
//! kubeconfig's token, which must never be answered.

mod common;
mod fake_clouddriver;

use std::time::Duration;

use common::*;
use fake_clouddriver::FakeClouddriver;
use serde_json::{Value, json};

const TOKEN: &str = "armory-api-token-3c9d";

fn kubeconfig(server: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
         clusters: [{{name: k, cluster: {{server: '{server}'}}}}]\n\
         users: [{{name: u, user: {{token: {TOKEN}}}}}]\n\
         contexts: [{{name: c, context: {{cluster: k, user: u}}}}]\n"
    )
}

fn pod(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "demo", "resourceVersion": "1"}})
}

struct Api {
    sidecar: Running,
    http: HttpClient,
}

impl Api {
    async fn call(&self, method: &str, path: &str, body: &str) -> anyhow::Result<Answer> {
        let answer = request(
            &self.http,
            method,
            &self.sidecar.url(path),
            &[("content-type", "application/json")],
            body,
        )
        .await?;
        let text = String::from_utf8_lossy(&answer.body);
        assert!(
            !text.contains(TOKEN),
            "{method} {path} answered the token: {text}"
        );
        Ok(answer)
    }

    async fn status_of(&self, name: &str) -> anyhow::Result<(u16, Value)> {
        let a = self
            .call("GET", &format!("/armory/accounts/{name}"), "")
            .await?;
        let v = if a.status == 200 {
            a.json()
        } else {
            Value::Null
        };
        Ok((a.status, v))
    }

    async fn wait_state(&self, name: &str, want: &str) -> anyhow::Result<Value> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let (code, v) = self.status_of(name).await?;
            if code == 200 && v["status"] == want {
                return Ok(v);
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "{name} never {want}: {code} {v}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn patch(&self, body: &str) -> anyhow::Result<Answer> {
        self.call("PATCH", "/armory/accounts", body).await
    }

    /// Plays `name`'s agent: its cache stream opens and lists one pod.
    async fn serve(&self, name: &str) -> anyhow::Result<CacheStream> {
        let mut client = self.sidecar.client().await?;
        let mut cache = CacheStream::open(&mut client, name).await?;
        let pods = kind("", "v1", "pods", "Pod", true);
        sync(&mut cache, &pods, &[pod("web-1")]).await?;
        Ok(cache)
    }

    /// spinlink's own view: the zone of each dynamic account.
    async fn dynamic_zones(&self) -> anyhow::Result<Vec<(String, String)>> {
        let list = self.call("GET", "/v1/dynamic-accounts", "").await?.json();
        Ok(list
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| {
                (
                    a["name"].as_str().unwrap_or_default().to_owned(),
                    a["zone"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect())
    }
}

/// The fields of Armory's `KubesvcAccount`, as `../shared/armory-rest-api.md`
/// (Schemas, from Armory's swagger of Aug 2022) lists them; there is no
/// Armory instance to record answers from.
fn assert_kubesvc_account(v: &Value, name: &str, status: &str) {
    assert_eq!(v["name"], name, "{v}");
    assert_eq!(v["status"], status, "{v}");
    for key in [
        "zoneId",
        "certFingerprint",
        "agentId",
        "errorMessage",
        "lastUpdated",
    ] {
        assert!(v[key].is_string(), "{key} in {v}");
    }
    assert!(v["connections"].is_u64(), "{v}");
    assert!(v["retryCount"].is_u64(), "{v}");
    assert!(v["dynamic"].is_boolean(), "{v}");
}

async fn start_api(fake: &FakeClouddriver, dir: &std::path::Path) -> anyhow::Result<Api> {
    let key = dir.join("key");
    std::fs::write(&key, [9u8; 32])?;
    let extra = format!(
        "accounts: {{ encryptionKeyFile: {} }}\nclouddriver:\n  baseUrl: {}\n  \
         retry: {{ initialMillis: 20, maxMillis: 200 }}\n",
        key.display(),
        fake.base_url()
    );
    Ok(Api {
        sidecar: start_config("", &extra).await?,
        http: http(),
    })
}

#[tokio::test]
async fn dynamic_accounts_are_created_served_updated_and_deleted() -> anyhow::Result<()> {
    let fake = FakeClouddriver::start(Some(Duration::from_millis(50))).await?;
    let dir = tempfile::tempdir()?;
    let api = start_api(&fake, dir.path()).await?;
    let kc = kubeconfig("https://10.0.0.7:6443");

    // Create: 202 with the account, not yet served.
    let create = json!({"name": "dyn-1", "kubeconfigContents": kc, "zoneId": "eu"}).to_string();
    let a = api
        .call("POST", "/armory/accounts/dynamic", &create)
        .await?;
    assert_eq!(a.status, 202, "{}", a.json());
    let v = a.json();
    assert_kubesvc_account(&v, "dyn-1", "ACTIVATING");
    assert_eq!((&v["zoneId"], &v["dynamic"]), (&json!("eu"), &json!(true)));
    assert_eq!(v["certFingerprint"], "", "the kubeconfig has no CA");
    assert_eq!(
        api.dynamic_zones().await?,
        [("dyn-1".to_owned(), "eu".to_owned())]
    );

    // The same name again is a conflict; bad bodies are clear 400s.
    let a = api
        .call("POST", "/armory/accounts/dynamic", &create)
        .await?;
    assert_eq!(a.status, 409, "{}", a.json());
    for (body, says) in [
        (
            json!({"name": "dyn-2"}),
            "neither kubeconfigContents nor kubeconfigFile",
        ),
        (json!({"kubeconfigContents": kc}), "missing field `name`"),
        (
            json!({"name": "Bad_Name", "kubeconfigContents": kc}),
            "account name",
        ),
        (
            json!({"name": "dyn-2", "kubeconfigContents": "not: [a kubeconfig"}),
            "kubeconfig",
        ),
        (
            json!({"name": "dyn-2", "kubeconfigFile": "relative.yaml"}),
            "absolute path",
        ),
        (
            json!({"name": "dyn-2", "serviceAccount": true}),
            "serviceAccount",
        ),
    ] {
        let a = api
            .call("POST", "/armory/accounts/dynamic", &body.to_string())
            .await?;
        assert_eq!(a.status, 400, "{body}: {}", a.json());
        let message = a.json()["message"].as_str().unwrap_or_default().to_owned();
        assert!(message.contains(says), "{body}: {message}");
    }
    let a = api.call("POST", "/armory/accounts/dynamic", "{").await?;
    assert_eq!(a.status, 400);
    let huge = "x".repeat(2 << 20);
    let a = api.call("POST", "/armory/accounts/dynamic", &huge).await?;
    assert_eq!(a.status, 413);

    // A kubeconfigFile is read by the sidecar.
    let file = dir.path().join("dyn-file.kubeconfig");
    std::fs::write(&file, kubeconfig("https://10.0.0.8:6443"))?;
    let body = json!({"name": "dyn-file", "kubeconfigFile": file.display().to_string()});
    let a = api
        .call("POST", "/armory/accounts/dynamic", &body.to_string())
        .await?;
    assert_eq!(a.status, 202, "{}", a.json());

    // An agent serves it: ACTIVE, with its stream counted, and the facade
    // serves its cache.
    let cache = api.serve("dyn-1").await?;
    let v = api.wait_state("dyn-1", "ACTIVE").await?;
    let polled = api
        .call("GET", "/agents/kubernetes/accounts/dyn-1", "")
        .await?;
    assert_eq!((polled.status, polled.json()), (200, v.clone()));
    assert_kubesvc_account(&v, "dyn-1", "ACTIVE");
    assert_eq!(v["connections"], 1, "{v}");
    let pods = api.call("GET", "/accounts/dyn-1/api/v1/pods", "").await?;
    assert_eq!(pods.status, 200);
    assert_eq!(pods.json()["items"][0]["metadata"]["name"], "web-1");

    // The namespaces known for it: those its cache holds (the agent lists
    // no `namespaces` kind here, so those its objects are in).
    let ns = api
        .call("GET", "/agents/kubernetes/accounts/dyn-1/namespaces", "")
        .await?;
    assert_eq!((ns.status, ns.json()), (200, json!(["demo"])));
    // Not served yet: the namespaces its definition names (none: all).
    let ns = api
        .call("GET", "/agents/kubernetes/accounts/dyn-file/namespaces", "")
        .await?;
    assert_eq!((ns.status, ns.json()), (200, json!([])));
    let ns = api
        .call("GET", "/agents/kubernetes/accounts/nope/namespaces", "")
        .await?;
    assert_eq!(ns.status, 404);

    // This sidecar, the one instance in its store.
    let cds = api.call("GET", "/armory/clouddrivers", "").await?;
    assert_eq!(cds.status, 200);
    let cds = cds.json();
    assert_eq!(cds.as_array().map(Vec::len), Some(1), "{cds}");
    assert_eq!(cds[0]["ready"], true, "{cds}");
    let id = cds[0]["id"].as_str().unwrap_or_default().to_owned();
    let one = api
        .call("GET", &format!("/armory/clouddrivers/{id}"), "")
        .await?;
    assert_eq!((one.status, one.json()), (200, cds[0].clone()));
    let a = api.call("GET", "/armory/clouddrivers/nope", "").await?;
    assert_eq!(a.status, 404);

    // The agent that serves it, and a disconnect that ends its stream.
    let agents = api.call("GET", "/armory/agents", "").await?;
    assert_eq!(agents.status, 200);
    assert_eq!(
        agents.json(),
        json!([{"agentId": IDENTITY, "accounts": ["dyn-1"], "caching": true, "type": "kubernetes"}])
    );
    let id = IDENTITY.replace('/', "%2F");
    let one = api.call("GET", &format!("/armory/agents/{id}"), "").await?;
    assert_eq!(
        (one.status, &one.json()["agentId"]),
        (200, &json!(IDENTITY))
    );
    let a = api.call("GET", "/armory/agents/nobody", "").await?;
    assert_eq!(a.status, 404);

    // A write with no relay stream open is journaled, and shows in the
    // operation history.
    let write = api
        .call(
            "DELETE",
            "/accounts/dyn-1/api/v1/namespaces/demo/pods/web-1",
            "",
        )
        .await?;
    assert_eq!(write.status, 503);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let record = loop {
        let ops = api.call("GET", "/armory/agent/operations", "").await?;
        assert_eq!(ops.status, 200);
        if let Some(first) = ops.json().as_array().and_then(|a| a.first().cloned()) {
            break first;
        }
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "never journaled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(record["account"], "dyn-1", "{record}");
    assert_eq!(
        record["operationType"],
        "DELETE /api/v1/namespaces/demo/pods/web-1"
    );
    assert_eq!(record["finalOutcome"], "unavailable", "{record}");
    assert_eq!(record["resultReceivedFromAgent"]["agentId"], IDENTITY);
    let op_id = record["operationId"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let one = api
        .call("GET", &format!("/armory/agent/operations/{op_id}"), "")
        .await?;
    assert_eq!((one.status, one.json()), (200, record));
    let none = api
        .call("GET", "/armory/agent/operations/x:y:1", "")
        .await?;
    assert_eq!(none.status, 404);

    // Update: 202, the change is in spinlink's store at once.
    let update = json!({"name": "dyn-1", "kubeconfigContents": kc, "zoneId": "us"}).to_string();
    let a = api.call("PUT", "/armory/accounts/dynamic", &update).await?;
    assert_eq!(a.status, 202, "{}", a.json());
    assert_eq!(a.json()["zoneId"], "us");
    assert!(
        api.dynamic_zones()
            .await?
            .contains(&("dyn-1".to_owned(), "us".to_owned()))
    );
    let missing = json!({"name": "nope", "kubeconfigContents": kc}).to_string();
    let a = api
        .call("PUT", "/armory/accounts/dynamic", &missing)
        .await?;
    assert_eq!(a.status, 404);

    // Delete: 202; DELETING while its agent still streams, then gone.
    let a = api.call("DELETE", "/armory/accounts/dyn-1", "").await?;
    assert_eq!(a.status, 202, "{}", a.json());
    assert_kubesvc_account(&a.json(), "dyn-1", "DELETING");
    assert!(!api.dynamic_zones().await?.iter().any(|(n, _)| n == "dyn-1"));
    drop(cache);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while api.status_of("dyn-1").await?.0 != 404 {
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "dyn-1 never went");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pods = api.call("GET", "/accounts/dyn-1/api/v1/pods", "").await?;
    assert_eq!(pods.status, 404);
    let a = api.call("DELETE", "/armory/accounts/dyn-1", "").await?;
    assert_eq!(a.status, 404);

    // Disconnect: the agent's streams end here (it would reconnect).
    let file_cache = api.serve("dyn-file").await?;
    api.wait_state("dyn-file", "ACTIVE").await?;
    let a = api
        .call("POST", &format!("/armory/agent/{id}/disconnect"), "{}")
        .await?;
    assert_eq!(a.status, 202, "{}", a.json());
    // Accounts it served here before (dyn-1, deleted) are named too, as
    // in `POST /v1/agents/{identity}/disconnect`.
    let named = a.json()["accounts"].as_array().cloned().unwrap_or_default();
    assert!(named.contains(&json!("dyn-file")), "{named:?}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while api.status_of("dyn-file").await?.1["connections"] != 0 {
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "still connected");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(file_cache);
    let a = api
        .call("POST", "/armory/agent/nobody/disconnect", "")
        .await?;
    assert_eq!(a.status, 404);

    // Paths without meaning in spinlink say what to use instead.
    let a = api
        .call("GET", "/armory/clouddrivers/sql/pool/settings", "")
        .await?;
    assert_eq!(a.status, 501);
    assert!(
        a.json()["message"]
            .as_str()
            .unwrap_or_default()
            .contains("store")
    );
    let a = api.call("POST", "/armory/agent/operations", "x").await?;
    assert_eq!(a.status, 501);
    api.sidecar.stop().await
}

#[tokio::test]
async fn accounts_are_migrated_inactive_then_activated_deactivated_and_deleted()
-> anyhow::Result<()> {
    let fake = FakeClouddriver::start(Some(Duration::from_millis(50))).await?;
    fake.store(
        json!({"type": "kubernetes", "name": "legacy", "context": "c",
        "namespaces": ["apps"], "kubeconfigContents": kubeconfig("https://10.0.0.9:6443")}),
    );
    fake.store(json!({"type": "kubernetes", "name": "other",
        "kubeconfigContents": kubeconfig("https://10.0.0.10:6443")}));
    fake.reload();
    let dir = tempfile::tempdir()?;
    let api = start_api(&fake, dir.path()).await?;

    // Migrate: 202 with an empty array; INACTIVE, not handed to agents.
    let a = api
        .call(
            "POST",
            "/armory/accounts",
            r#"[{"name": "legacy", "zoneId": "eu"}]"#,
        )
        .await?;
    assert_eq!(a.status, 202, "{}", a.json());
    assert_eq!(a.json(), json!([]));
    let (code, v) = api.status_of("legacy").await?;
    assert_eq!(code, 200);
    assert_kubesvc_account(&v, "legacy", "INACTIVE");
    assert_eq!(v["zoneId"], "eu");
    assert!(api.dynamic_zones().await?.is_empty());

    // Already migrated: 409 naming it, while the valid one is still taken.
    let a = api
        .call(
            "POST",
            "/armory/accounts",
            r#"[{"name": "legacy"}, {"name": "other"}]"#,
        )
        .await?;
    assert_eq!(a.status, 409);
    assert_eq!(a.json(), json!(["legacy"]));
    assert_eq!(api.wait_state("other", "INACTIVE").await?["name"], "other");
    // Unknown to Clouddriver, or an empty list: 400.
    let a = api
        .call("POST", "/armory/accounts", r#"[{"name": "nowhere"}]"#)
        .await?;
    assert_eq!(a.status, 400);
    assert_eq!(a.json()["failed"][0]["name"], "nowhere");
    let a = api.call("POST", "/armory/accounts", "[]").await?;
    assert_eq!(a.status, 400);
    assert!(api.status_of("nowhere").await?.0 == 404);

    // Activate: handed to agents of its zone.
    let a = api
        .patch(r#"[{"name": "legacy", "state": "ACTIVE"}]"#)
        .await?;
    assert_eq!(a.status, 202, "{}", a.json());
    assert_eq!(api.status_of("legacy").await?.1["status"], "ACTIVATING");
    assert_eq!(
        api.dynamic_zones().await?,
        [("legacy".to_owned(), "eu".to_owned())]
    );
    let cache = api.serve("legacy").await?;
    api.wait_state("legacy", "ACTIVE").await?;

    // Deactivate: taken from agents, INACTIVE again; activating it once
    // more hands it out again from the kubeconfig kept meanwhile.
    let a = api
        .patch(r#"[{"name": "legacy", "state": "INACTIVE"}]"#)
        .await?;
    assert_eq!(a.status, 202, "{}", a.json());
    assert_eq!(api.status_of("legacy").await?.1["status"], "INACTIVE");
    assert!(api.dynamic_zones().await?.is_empty());
    drop(cache);
    let a = api
        .patch(r#"[{"name": "legacy", "state": "ACTIVE", "zoneId": "us"}]"#)
        .await?;
    assert_eq!(a.status, 202, "{}", a.json());
    assert_eq!(
        api.dynamic_zones().await?,
        [("legacy".to_owned(), "us".to_owned())]
    );
    // Only ACTIVE and INACTIVE can be asked for; unknown names are named.
    let a = api
        .patch(r#"[{"name": "legacy", "state": "DELETING"}, {"name": "ghost", "state": "ACTIVE"}]"#)
        .await?;
    assert_eq!(a.status, 400);
    let failed: Vec<Value> = a.json()["failed"].as_array().cloned().unwrap_or_default();
    assert_eq!(failed.len(), 2, "{failed:?}");
    let a = api
        .patch(r#"[{"name": "legacy", "state": "ACTIVE!"}]"#)
        .await?;
    assert_eq!(a.status, 400);

    // Delete by list: active and inactive alike; unknown names are 404.
    let a = api
        .call("DELETE", "/armory/accounts", r#"["legacy", "other"]"#)
        .await?;
    assert_eq!(a.status, 202, "{}", a.json());
    assert_eq!(api.status_of("other").await?.0, 404);
    assert!(api.dynamic_zones().await?.is_empty());
    let a = api
        .call("DELETE", "/armory/accounts", r#"["other"]"#)
        .await?;
    assert_eq!(a.status, 404);
    assert_eq!(a.json()["names"], json!(["other"]));
    let a = api.call("DELETE", "/armory/accounts", "{}").await?;
    assert_eq!(a.status, 400);
    api.sidecar.stop().await
}
