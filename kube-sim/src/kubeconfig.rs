//! Writing a kubeconfig that points kubectl (or any client) at a kube-sim server.

use std::path::Path;

use base64::Engine as _;

/// Token of the dummy user (kube-sim accepts any bearer token, or none).
pub const DUMMY_TOKEN: &str = "kube-sim";

/// Writes a kubeconfig with one cluster/user/context named `context` pointing at
/// `server_url` (CA data embedded when given; a dummy token user); creates parent dirs.
pub fn write_kubeconfig(
    path: &Path,
    server_url: &str,
    context: &str,
    ca_pem: Option<&str>,
) -> std::io::Result<()> {
    if let Some(dir) = path.parent()
        && !dir.as_os_str().is_empty()
    {
        std::fs::create_dir_all(dir)?;
    }
    // JSON strings are valid YAML scalars, which makes quoting trivially right.
    let q = |s: &str| serde_json::Value::from(s).to_string();
    let ca = ca_pem
        .map(|pem| {
            format!(
                "\n    certificate-authority-data: {}",
                q(&base64::engine::general_purpose::STANDARD.encode(pem))
            )
        })
        .unwrap_or_default();
    let name = q(context);
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: {name}\n  cluster:\n    server: {server}{ca}\nusers:\n- name: {name}\n  user:\n    token: {token}\ncontexts:\n- name: {name}\n  context:\n    cluster: {name}\n    user: {name}\ncurrent-context: {name}\npreferences: {{}}\n",
        server = q(server_url),
        token = q(DUMMY_TOKEN),
    );
    std::fs::write(path, text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_parseable_kubeconfig() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/b/config");
        write_kubeconfig(&path, "https://127.0.0.1:1234", "sim", Some("PEM")).unwrap();
        let v: serde_json::Value =
            serde_norway::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(v["current-context"], "sim");
        assert_eq!(
            v["clusters"][0]["cluster"]["server"],
            "https://127.0.0.1:1234"
        );
        assert_eq!(
            v["clusters"][0]["cluster"]["certificate-authority-data"],
            "UEVN"
        );
        assert_eq!(v["contexts"][0]["context"]["user"], "sim");
        write_kubeconfig(&path, "http://127.0.0.1:1", "x", None).unwrap();
        let v: serde_json::Value =
            serde_norway::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert!(
            v["clusters"][0]["cluster"]
                .get("certificate-authority-data")
                .is_none()
        );
    }
}
