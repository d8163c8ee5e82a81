//! nginx variables in header values (`proxy_set_header Host $host`):
//! compiled once at load time ([`Template::compile`], an unknown variable is
//! a configuration error), expanded per request ([`Template::expand_into`]).

/// `X-Forwarded-For`: read by `$proxy_add_x_forwarded_for`, and set by the
/// proxy when a location does not.
pub(super) const X_FORWARDED_FOR: http::HeaderName =
    http::HeaderName::from_static("x-forwarded-for");

/// One request's facts that variables read.
#[derive(Debug)]
pub struct Vars<'a> {
    /// `$host`: the request's host name (lowercase, no port), or the server's
    /// first name when the request named none.
    pub host: &'a str,
    /// The client's address as text (from the PROXY header when one was
    /// believed), written once per connection.
    pub remote_ip: &'a str,
    /// The client's port.
    pub remote_port: u16,
    /// `$scheme`.
    pub scheme: &'a str,
    /// `$server_name`: the selected server's first name.
    pub server_name: &'a str,
    /// `$server_port`: the gateway's port.
    pub server_port: u16,
    /// The request as received.
    pub req: &'a http::request::Parts,
    /// `$ssl_client_escaped_cert`: the client certificate as URL-escaped PEM.
    pub client_cert_escaped: &'a str,
    /// `$ssl_client_verify`: `SUCCESS`, `FAILED:…` or `NONE`.
    pub client_verify: &'a str,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Var {
    Host,
    RemoteAddr,
    RemotePort,
    ProxyAddXForwardedFor,
    Scheme,
    ServerName,
    ServerPort,
    RequestUri,
    Uri,
    Args,
    RequestMethod,
    SslClientEscapedCert,
    SslClientVerify,
    /// `$http_<name>`, the name lowercased with `_` as `-` (`None`: not a
    /// name a header can have, so always empty).
    Http(Option<http::HeaderName>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Lit(String),
    Var(Var),
}

/// A header value with its variables found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template(Vec<Part>);

fn var(name: &str) -> Option<Var> {
    Some(match name {
        "host" => Var::Host,
        "remote_addr" | "proxy_protocol_addr" | "realip_remote_addr" => Var::RemoteAddr,
        "remote_port" => Var::RemotePort,
        "proxy_add_x_forwarded_for" => Var::ProxyAddXForwardedFor,
        "scheme" => Var::Scheme,
        "server_name" => Var::ServerName,
        "server_port" => Var::ServerPort,
        "request_uri" => Var::RequestUri,
        "uri" | "document_uri" => Var::Uri,
        "args" | "query_string" => Var::Args,
        "request_method" => Var::RequestMethod,
        "ssl_client_escaped_cert" => Var::SslClientEscapedCert,
        "ssl_client_verify" => Var::SslClientVerify,
        other => {
            let name = other.strip_prefix("http_")?.replace('_', "-");
            Var::Http(http::HeaderName::from_bytes(name.as_bytes()).ok())
        }
    })
}

impl Template {
    /// Splits `value` into text and variables; an unknown variable is an error
    /// naming it.
    pub fn compile(value: &str) -> Result<Self, String> {
        let mut parts = Vec::new();
        let mut lit = String::new();
        let mut rest = value;
        while let Some(i) = rest.find('$') {
            lit.push_str(&rest[..i]);
            let after = &rest[i + 1..];
            let (name, tail) = if let Some(braced) = after.strip_prefix('{') {
                let end = braced
                    .find('}')
                    .ok_or_else(|| format!("the closing bracket in \"{value}\" is missing"))?;
                (&braced[..end], &braced[end + 1..])
            } else {
                let end = after
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(after.len());
                (&after[..end], &after[end..])
            };
            if name.is_empty() {
                return Err(format!("invalid variable name in \"{value}\""));
            }
            let v = var(name).ok_or_else(|| format!("unknown variable \"${name}\""))?;
            if !lit.is_empty() {
                parts.push(Part::Lit(std::mem::take(&mut lit)));
            }
            parts.push(Part::Var(v));
            rest = tail;
        }
        lit.push_str(rest);
        if !lit.is_empty() {
            parts.push(Part::Lit(lit));
        }
        Ok(Self(parts))
    }

    /// The value for one request, written at the end of `out`.
    pub fn expand_into(&self, v: &Vars<'_>, out: &mut String) {
        for part in &self.0 {
            match part {
                Part::Lit(s) => out.push_str(s),
                Part::Var(var) => expand_var(var, v, out),
            }
        }
    }
}

fn expand_var(var: &Var, v: &Vars<'_>, out: &mut String) {
    use std::fmt::Write as _;
    // Written straight into `out`: no string per value, no list per header.
    // How many values it wrote (an empty one counts).
    let header = |name: &http::HeaderName, sep: &str, out: &mut String| -> usize {
        let values = v.req.headers.get_all(name).iter();
        let mut n = 0;
        for value in values.filter_map(|h| h.to_str().ok()) {
            if n > 0 {
                out.push_str(sep);
            }
            out.push_str(value);
            n += 1;
        }
        n
    };
    match var {
        Var::Host => out.push_str(v.host),
        Var::RemoteAddr => out.push_str(v.remote_ip),
        Var::RemotePort => {
            let _ = write!(out, "{}", v.remote_port);
        }
        Var::ProxyAddXForwardedFor => {
            // nginx joins several incoming X-Forwarded-For lines with ", ".
            if header(&X_FORWARDED_FOR, ", ", out) > 0 {
                out.push_str(", ");
            }
            out.push_str(v.remote_ip);
        }
        Var::Scheme => out.push_str(v.scheme),
        Var::ServerName => out.push_str(v.server_name),
        Var::ServerPort => {
            let _ = write!(out, "{}", v.server_port);
        }
        Var::RequestUri => out.push_str(v.req.uri.path_and_query().map_or("/", |p| p.as_str())),
        Var::Uri => out.push_str(v.req.uri.path()),
        Var::Args => out.push_str(v.req.uri.query().unwrap_or("")),
        Var::RequestMethod => out.push_str(v.req.method.as_str()),
        Var::SslClientEscapedCert => out.push_str(v.client_cert_escaped),
        Var::SslClientVerify => out.push_str(v.client_verify),
        Var::Http(Some(name)) => {
            // nginx joins repeated headers with ", " (cookies with "; ").
            let sep = if name == http::header::COOKIE {
                "; "
            } else {
                ", "
            };
            header(name, sep, out);
        }
        Var::Http(None) => {}
    }
}

/// `$proxy_add_x_forwarded_for` for one request, written at the end of
/// `out`.
pub fn forwarded_for_into(v: &Vars<'_>, out: &mut String) {
    expand_var(&Var::ProxyAddXForwardedFor, v, out);
}

/// `$ssl_client_escaped_cert`: the PEM text, escaped as nginx's
/// `ngx_escape_uri(NGX_ESCAPE_URI_COMPONENT)` does.
pub fn escape_pem(der: &[u8]) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut pem = String::from("-----BEGIN CERTIFICATE-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        pem.push_str(std::str::from_utf8(chunk).unwrap_or_default());
        pem.push('\n');
    }
    pem.push_str("-----END CERTIFICATE-----\n");
    let mut out = String::with_capacity(pem.len() * 2);
    for b in pem.bytes() {
        // Unreserved in nginx's URI-component table: letters, digits, - . _ ~
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(uri: &str, xff: &[&str]) -> http::request::Parts {
        let mut b = http::Request::builder()
            .uri(uri)
            .header("x-custom-thing", "v1");
        for x in xff {
            b = b.header("x-forwarded-for", *x);
        }
        b.body(()).unwrap().into_parts().0
    }

    #[test]
    fn variables_expand_like_nginx() {
        let req = parts("/a/b?x=1", &["1.1.1.1", "2.2.2.2"]);
        let v = Vars {
            host: "api.example.com",
            remote_ip: "203.0.113.9",
            remote_port: 4000,
            scheme: "https",
            server_name: "api.example.com",
            server_port: 443,
            req: &req,
            client_cert_escaped: "",
            client_verify: "NONE",
        };
        let t = |s: &str| {
            let mut out = String::new();
            Template::compile(s).unwrap().expand_into(&v, &mut out);
            out
        };
        assert_eq!(t("$host"), "api.example.com");
        assert_eq!(
            t("${scheme}://$host$request_uri"),
            "https://api.example.com/a/b?x=1"
        );
        assert_eq!(
            t("$proxy_add_x_forwarded_for"),
            "1.1.1.1, 2.2.2.2, 203.0.113.9"
        );
        assert_eq!(t("[$http_x_custom_thing]"), "[v1]");
        assert_eq!(
            t("$remote_addr:$remote_port $uri $args"),
            "203.0.113.9:4000 /a/b x=1"
        );
        assert_eq!(t("no vars"), "no vars");
    }

    #[test]
    fn unknown_variables_are_errors_naming_them() {
        assert_eq!(
            Template::compile("$connection_upgrade").unwrap_err(),
            "unknown variable \"$connection_upgrade\""
        );
        assert!(Template::compile("${host").is_err());
        assert!(Template::compile("a $ b").is_err());
    }

    #[test]
    fn escaped_cert_is_url_escaped_pem() {
        let e = escape_pem(&[0xfb, 0xff]);
        assert_eq!(
            e,
            "-----BEGIN%20CERTIFICATE-----%0A%2B%2F8%3D%0A-----END%20CERTIFICATE-----%0A"
        );
    }
}
