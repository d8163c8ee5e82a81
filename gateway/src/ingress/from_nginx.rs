//! An nginx configuration as a gateway configuration: what
//! `spinlink nginx convert` prints and `spinlink gateway --nginx-config`
//! runs (the same YAML, so the two cannot drift).
//!
//! The listen address and port come from the servers' `listen`s (one port);
//! `listen … proxy_protocol` turns on `listener.proxyProtocol` with the
//! `set_real_ip_from` CIDRs as `trustedProxies` (PROXY headers are believed
//! only from them); the model itself becomes `ingress`.

use serde_norway::{Mapping, Value};
use spinlink_nginx_compat as nginx;

use super::CompileError;

fn err(key: &str, message: impl Into<String>) -> CompileError {
    CompileError {
        key: key.to_owned(),
        message: message.into(),
    }
}

/// The gateway configuration (YAML) that serves `ingress`. Relative
/// certificate paths are made absolute against `conf_prefix` (nginx's: the
/// main file's directory), so the YAML works from any directory.
pub fn config_yaml(
    ingress: &nginx::Ingress,
    conf_prefix: &std::path::Path,
) -> Result<String, CompileError> {
    let mut ingress = ingress.clone();
    let absolute = |p: &mut String| {
        if !p.is_empty() && std::path::Path::new(p.as_str()).is_relative() {
            *p = conf_prefix.join(p.as_str()).display().to_string();
        }
    };
    for tls in ingress.servers.iter_mut().filter_map(|s| s.tls.as_mut()) {
        for pair in &mut tls.certificates {
            absolute(&mut pair.certificate);
            absolute(&mut pair.key);
        }
        if let Some(ca) = tls.client_certificate.as_mut() {
            absolute(ca);
        }
    }
    let ingress = &ingress;
    let listen = ingress
        .servers
        .iter()
        .flat_map(|s| s.listens.iter())
        .next()
        .ok_or_else(|| err("servers", "no server"))?;
    let listen_addr = match listen.address.as_str() {
        "*" => format!("0.0.0.0:{}", listen.port),
        a if a.contains(':') => format!("[{a}]:{}", listen.port),
        a => format!("{a}:{}", listen.port),
    };
    let mut root = Mapping::new();
    root.insert("listen".into(), Value::String(listen_addr));
    let proxy = ingress
        .servers
        .iter()
        .any(|s| s.listens.iter().any(|l| l.proxy_protocol));
    if proxy {
        let mut trusted: Vec<String> = Vec::new();
        for s in &ingress.servers {
            for t in s.real_ip.iter().flat_map(|r| r.trusted.iter()) {
                let cidr = if t.contains('/') {
                    t.clone()
                } else if t.contains(':') {
                    format!("{t}/128")
                } else {
                    format!("{t}/32")
                };
                if !trusted.contains(&cidr) {
                    trusted.push(cidr);
                }
            }
        }
        if trusted.is_empty() {
            return Err(err(
                "servers",
                "`listen … proxy_protocol` without `set_real_ip_from`: the gateway \
                 believes PROXY headers only from trusted load balancers",
            ));
        }
        let mut listener = Mapping::new();
        listener.insert("proxyProtocol".into(), Value::Bool(true));
        listener.insert(
            "trustedProxies".into(),
            Value::Sequence(trusted.into_iter().map(Value::String).collect()),
        );
        root.insert("listener".into(), Value::Mapping(listener));
    }
    let model = serde_norway::to_value(ingress).map_err(|e| err("ingress", e.to_string()))?;
    root.insert("ingress".into(), model);
    serde_norway::to_string(&Value::Mapping(root)).map_err(|e| err("ingress", e.to_string()))
}
