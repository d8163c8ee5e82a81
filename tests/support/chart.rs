//! The Helm charts as a cluster would run them, without a cluster: render
//! with Helm's own SDK (`deploy/tools/helm.py`), issue the certificates the
//! rendered cert-manager `Certificate`s ask for (a stand-in for
//! cert-manager, from the same issuers), and turn a rendered pod template's
//! container into a command line here — its volumes (ConfigMaps, Secrets,
//! emptyDirs) written to directories, every mount path in its arguments and
//! in the mounted files pointed at them, its environment resolved as the
//! kubelet resolves it (literal values, `fieldRef`, `secretKeyRef`) and
//! `$(VAR)` in its arguments expanded.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;
use serde_json::Value;
use spinlink_tls::dev::{DevCa, Leaf};

/// The repository's root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// Runs `python3 deploy/tools/helm.py ARGS`; stdout on success.
pub fn helm(args: &[&str]) -> Result<String, String> {
    let out = Command::new("python3")
        .arg(root().join("deploy/tools/helm.py"))
        .args(args)
        .current_dir(root())
        .output()
        .map_err(|e| format!("running python3: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        Ok(stdout)
    } else {
        Err(format!(
            "helm.py {args:?} exited with {}:\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Every YAML document of `text` that is not empty.
pub fn documents(text: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("bad YAML: {e}\n{text}")))
        .filter(|v| !v.is_null())
        .collect()
}

/// The objects chart `chart` (under deploy/helm) renders with `values`, as
/// release `name` in `namespace`.
pub fn render(chart: &str, values: &[&Path], name: &str, namespace: &str) -> Vec<Value> {
    render_path(
        &root().join("deploy/helm").join(chart),
        values,
        name,
        namespace,
    )
}

/// The objects the chart at `dir` (a directory or a packaged `.tgz`)
/// renders with `values`, as release `name` in `namespace`.
pub fn render_path(dir: &Path, values: &[&Path], name: &str, namespace: &str) -> Vec<Value> {
    let mut args = vec!["template".to_owned(), dir.display().to_string()];
    for v in values {
        args.extend(["-f".to_owned(), v.display().to_string()]);
    }
    args.extend([
        "--name".into(),
        name.into(),
        "--namespace".into(),
        namespace.into(),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let text = helm(&args).unwrap_or_else(|e| panic!("{e}"));
    documents(&text)
}

/// The rendered object of `kind` named `name`.
pub fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} was rendered"))
}

/// Secrets and ConfigMaps by name: key → content.
pub type Data = BTreeMap<String, BTreeMap<String, String>>;

/// The data of every rendered ConfigMap (`data`) and Secret (`stringData`;
/// the charts render no base64 `data`).
pub fn data(objects: &[Value]) -> Data {
    let mut out = Data::new();
    for o in objects {
        if o["kind"] != "ConfigMap" && o["kind"] != "Secret" {
            continue;
        }
        let name = o["metadata"]["name"].as_str().unwrap().to_owned();
        let field = if o["kind"] == "Secret" {
            assert!(o.get("data").is_none(), "secret {name} renders base64 data");
            "stringData"
        } else {
            "data"
        };
        let entry = out.entry(name).or_default();
        for (k, v) in o[field].as_object().into_iter().flatten() {
            entry.insert(k.clone(), v.as_str().unwrap_or_default().to_owned());
        }
    }
    out
}

/// What cert-manager would write for the rendered `Certificate`s: a Secret
/// per certificate (`tls.crt`, `tls.key`, `ca.crt` — the issuer's root),
/// each issued from the CA its `issuerRef` names. Self-signed roots
/// (`isCA`) become the CAs of the `Issuer`s that name their Secret.
pub fn issue_certificates(objects: &[Value]) -> Data {
    let certs: Vec<&Value> = objects
        .iter()
        .filter(|o| o["kind"] == "Certificate")
        .collect();
    // Roots first: secret name → CA.
    let mut roots: BTreeMap<String, DevCa> = BTreeMap::new();
    let mut out = Data::new();
    for c in certs.iter().filter(|c| c["spec"]["isCA"] == true) {
        let spec = &c["spec"];
        let ca = DevCa::generate(spec["commonName"].as_str().unwrap()).unwrap();
        let secret = spec["secretName"].as_str().unwrap().to_owned();
        out.insert(
            secret.clone(),
            BTreeMap::from([("ca.crt".to_owned(), ca.cert_pem().to_owned())]),
        );
        roots.insert(secret, ca);
    }
    // CA Issuers: issuer name → the root its Secret holds.
    let issuers: BTreeMap<String, String> = objects
        .iter()
        .filter(|o| o["kind"] == "Issuer" || o["kind"] == "ClusterIssuer")
        .filter_map(|o| {
            let secret = o["spec"]["ca"]["secretName"].as_str()?;
            Some((
                o["metadata"]["name"].as_str()?.to_owned(),
                secret.to_owned(),
            ))
        })
        .collect();
    for c in certs.iter().filter(|c| c["spec"]["isCA"] != true) {
        let spec = &c["spec"];
        let issuer = spec["issuerRef"]["name"].as_str().unwrap();
        let root = issuers
            .get(issuer)
            .and_then(|secret| roots.get(secret))
            .unwrap_or_else(|| panic!("certificate issuer {issuer} is not a rendered CA"));
        let usages: Vec<&str> = spec["usages"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let cn = spec["commonName"].as_str().unwrap_or_default();
        let mut leaf = if usages.contains(&"server auth") {
            let leaf = Leaf::server(cn);
            if usages.contains(&"client auth") {
                leaf.also_client()
            } else {
                leaf
            }
        } else {
            Leaf::client(cn)
        };
        for dns in spec["dnsNames"].as_array().into_iter().flatten() {
            leaf = leaf.with_dns(dns.as_str().unwrap());
        }
        for uri in spec["uris"].as_array().into_iter().flatten() {
            leaf = leaf.with_uri(uri.as_str().unwrap());
        }
        let issued = root.issue(&leaf).unwrap();
        out.insert(
            spec["secretName"].as_str().unwrap().to_owned(),
            BTreeMap::from([
                ("tls.crt".to_owned(), issued.cert_pem),
                ("tls.key".to_owned(), issued.key_pem),
                ("ca.crt".to_owned(), root.cert_pem().to_owned()),
            ]),
        );
    }
    out
}

/// A rendered container made runnable here.
#[derive(Debug, Clone)]
pub struct Container {
    /// Its arguments, `$(VAR)` expanded and mount paths pointed at the
    /// directories its volumes were written to.
    pub args: Vec<String>,
    /// Its environment, resolved.
    pub env: Vec<(String, String)>,
}

/// Container `name` of pod spec `spec`, with its volumes written under
/// `root` from `data` (ConfigMaps and Secrets by name) and `fields` the
/// values of its `fieldRef`s (`status.podIP`, …).
pub fn container(
    spec: &Value,
    name: &str,
    data: &Data,
    root: &Path,
    fields: &[(&str, String)],
) -> Container {
    let c = spec["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name} in the pod spec"));
    let volumes = spec["volumes"].as_array().cloned().unwrap_or_default();
    // Mount path → directory, longest first so nested paths win.
    let mut mounts: Vec<(String, PathBuf)> = Vec::new();
    let mut written: Vec<PathBuf> = Vec::new();
    for m in c["volumeMounts"].as_array().into_iter().flatten() {
        let vname = m["name"].as_str().unwrap();
        let volume = volumes
            .iter()
            .find(|v| v["name"] == vname)
            .unwrap_or_else(|| panic!("volume {vname} is mounted but not defined"));
        let dir = root.join(vname);
        std::fs::create_dir_all(&dir).unwrap();
        let source = volume["configMap"]["name"]
            .as_str()
            .or(volume["secret"]["secretName"].as_str());
        if let Some(source) = source {
            let files = data
                .get(source)
                .unwrap_or_else(|| panic!("volume {vname} names {source}, which nothing wrote"));
            for (key, text) in files {
                let path = dir.join(key);
                std::fs::write(&path, text).unwrap();
                written.push(path);
            }
        } else {
            assert!(
                volume.get("emptyDir").is_some(),
                "volume {vname}: only configMap, secret and emptyDir volumes run here"
            );
        }
        mounts.push((m["mountPath"].as_str().unwrap().to_owned(), dir));
    }
    mounts.sort_by_key(|(path, _)| std::cmp::Reverse(path.len()));
    let remount = |text: &str| {
        let mut text = text.to_owned();
        for (path, dir) in &mounts {
            text = text.replace(&format!("{path}/"), &format!("{}/", dir.display()));
        }
        text
    };
    for path in written {
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, remount(&text)).unwrap();
    }

    let mut env = Vec::new();
    for e in c["env"].as_array().into_iter().flatten() {
        let key = e["name"].as_str().unwrap().to_owned();
        let value = if let Some(v) = e["value"].as_str() {
            v.to_owned()
        } else if let Some(field) = e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
            fields
                .iter()
                .find(|(f, _)| *f == field)
                .unwrap_or_else(|| panic!("env {key}: field {field} is not known here"))
                .1
                .clone()
        } else if let Some(secret) = e["valueFrom"]["secretKeyRef"]["name"].as_str() {
            let k = e["valueFrom"]["secretKeyRef"]["key"].as_str().unwrap();
            data.get(secret)
                .and_then(|d| d.get(k))
                .unwrap_or_else(|| panic!("env {key}: secret {secret} key {k} is missing"))
                .clone()
        } else {
            panic!("env {key}: {e} cannot be resolved here")
        };
        env.push((key, value));
    }
    let args = c["args"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| {
            let mut a = a.as_str().unwrap().to_owned();
            for (k, v) in &env {
                a = a.replace(&format!("$({k})"), v);
            }
            remount(&a)
        })
        .collect();
    Container { args, env }
}
