//! From [`Ast`] to [`Ingress`]: which directive is allowed where, with how
//! many arguments ([`crate::directives`]), what each one means,
//! and nginx's inheritance (`http` → `server` → `location` → nested
//! `location`). Start at [`Ingress::from_ast`].
//!
//! Inheritance follows nginx's merge functions: a level that sets a value
//! replaces the inherited one, and array directives (`proxy_set_header`,
//! `set_real_ip_from`, `ssl_certificate`) are replaced as a whole — a
//! location with one `proxy_set_header` of its own inherits none. Values
//! merge after the whole block is read, so a directive after a nested block
//! still applies to it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use crate::ast::{Ast, Directive};
use crate::directives::{self, Arity, Ctx, Lookup, Spec};
use crate::error::{Error, Result, Span, Warning};
use crate::model::*;
use crate::values::{self, HostPort};
use crate::{Options, Parsed};

/// nginx's `client_max_body_size` default: 1m.
pub const DEFAULT_CLIENT_MAX_BODY_SIZE: u64 = 1024 * 1024;
/// nginx's `proxy_read_timeout` / `grpc_read_timeout` default: 60s.
pub const DEFAULT_READ_TIMEOUT_MS: u64 = 60_000;
/// nginx's `proxy_connect_timeout` / `grpc_connect_timeout` default: 60s.
pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 60_000;
/// nginx's `proxy_send_timeout` default: 60s.
pub const DEFAULT_SEND_TIMEOUT_MS: u64 = 60_000;
/// nginx's `ssl_protocols` default since 1.23.4.
pub const DEFAULT_TLS_PROTOCOLS: [TlsProtocol; 2] = [TlsProtocol::TlsV1_2, TlsProtocol::TlsV1_3];
/// `client_body_buffer_size` when a configuration leaves it out: 16k
/// (nginx's is two memory pages, 8k on x86-64 and 16k on most other 64-bit
/// platforms; beyond it nginx writes the body to a file, and the gateway,
/// which writes no files, streams the rest).
pub const DEFAULT_CLIENT_BODY_BUFFER_SIZE: u64 = 16 * 1024;
/// nginx's `send_timeout` default: 60s.
pub const DEFAULT_CLIENT_SEND_TIMEOUT_MS: u64 = 60_000;
/// nginx's `client_body_timeout` default: 60s.
pub const DEFAULT_CLIENT_BODY_TIMEOUT_MS: u64 = 60_000;
/// The port of a `listen` or upstream `server` without one.
pub const DEFAULT_PORT: u16 = 80;

/// The inheritable settings of one level.
#[derive(Debug, Clone, Default)]
struct Conf {
    proxy_headers: Option<Vec<Header>>,
    grpc_headers: Option<Vec<Header>>,
    proxy_read_timeout: Option<u64>,
    grpc_read_timeout: Option<u64>,
    proxy_connect_timeout: Option<u64>,
    grpc_connect_timeout: Option<u64>,
    proxy_send_timeout: Option<u64>,
    body: Option<u64>,
    request_buffering: Option<bool>,
    body_buffer: Option<u64>,
    body_timeout: Option<u64>,
    real_ip_from: Option<Vec<String>>,
    real_ip_header: Option<RealIpHeader>,
    certs: Option<Vec<String>>,
    keys: Option<Vec<String>>,
    client_cert: Option<String>,
    verify: Option<VerifyClient>,
    protocols: Option<Vec<TlsProtocol>>,
    http2: Option<bool>,
    proxy_tls: UpTls,
    grpc_tls: UpTls,
}

/// `proxy_ssl_*` or `grpc_ssl_*` of one level.
#[derive(Debug, Clone, Default)]
struct UpTls {
    verify: Option<bool>,
    trusted: Option<String>,
    server_name: Option<bool>,
    name: Option<String>,
    cert: Option<String>,
    key: Option<String>,
}

impl UpTls {
    fn merge(&mut self, parent: &UpTls) {
        fn or<T: Clone>(child: &mut Option<T>, parent: &Option<T>) {
            if child.is_none() {
                child.clone_from(parent);
            }
        }
        or(&mut self.verify, &parent.verify);
        or(&mut self.trusted, &parent.trusted);
        or(&mut self.server_name, &parent.server_name);
        or(&mut self.name, &parent.name);
        or(&mut self.cert, &parent.cert);
        or(&mut self.key, &parent.key);
    }
}

impl Conf {
    fn merge(mut self, parent: &Conf) -> Conf {
        fn or<T: Clone>(child: &mut Option<T>, parent: &Option<T>) {
            if child.is_none() {
                child.clone_from(parent);
            }
        }
        or(&mut self.proxy_headers, &parent.proxy_headers);
        or(&mut self.grpc_headers, &parent.grpc_headers);
        or(&mut self.proxy_read_timeout, &parent.proxy_read_timeout);
        or(&mut self.grpc_read_timeout, &parent.grpc_read_timeout);
        or(
            &mut self.proxy_connect_timeout,
            &parent.proxy_connect_timeout,
        );
        or(&mut self.grpc_connect_timeout, &parent.grpc_connect_timeout);
        or(&mut self.proxy_send_timeout, &parent.proxy_send_timeout);
        or(&mut self.body, &parent.body);
        or(&mut self.request_buffering, &parent.request_buffering);
        or(&mut self.body_buffer, &parent.body_buffer);
        or(&mut self.body_timeout, &parent.body_timeout);
        or(&mut self.real_ip_from, &parent.real_ip_from);
        or(&mut self.real_ip_header, &parent.real_ip_header);
        or(&mut self.certs, &parent.certs);
        or(&mut self.keys, &parent.keys);
        or(&mut self.client_cert, &parent.client_cert);
        or(&mut self.verify, &parent.verify);
        or(&mut self.protocols, &parent.protocols);
        or(&mut self.http2, &parent.http2);
        self.proxy_tls.merge(&parent.proxy_tls);
        self.grpc_tls.merge(&parent.grpc_tls);
        self
    }
}

/// A pass directive waiting for the upstream names to be known.
struct Pass<'a> {
    grpc: bool,
    directive: &'a Directive,
}

impl Ingress {
    /// Resolves a parsed configuration whose includes are already resolved
    /// (an `include` left in it is [`Error::UnresolvedInclude`]).
    pub fn from_ast(ast: &Ast, options: &Options) -> Result<Parsed> {
        let conf_prefix = options
            .conf_prefix
            .clone()
            .unwrap_or_else(|| crate::conf_prefix_of(&ast.file));
        let mut r = Resolver {
            options,
            conf_prefix,
            warnings: Vec::new(),
            upstreams: HashMap::new(),
        };
        let ingress = r.main(&ast.directives, &ast.file)?;
        Ok(Parsed {
            ingress,
            warnings: r.warnings,
        })
    }
}

struct Resolver<'o> {
    options: &'o Options,
    conf_prefix: PathBuf,
    warnings: Vec<Warning>,
    /// Upstream block names, lowercased (nginx compares them without case),
    /// to the name as written.
    upstreams: HashMap<String, String>,
}

fn invalid(message: String, span: &Span) -> Error {
    Error::InvalidValue {
        message,
        span: span.clone(),
    }
}

fn outside(message: String, span: &Span) -> Error {
    Error::OutsideSubset {
        message,
        span: span.clone(),
    }
}

fn duplicate(d: &Directive) -> Error {
    Error::Duplicate {
        name: d.name.clone(),
        span: d.span.clone(),
    }
}

/// What nginx says when a slot parser (time, size) refuses a value.
fn invalid_slot(d: &Directive) -> Error {
    invalid(format!("\"{}\" directive invalid value", d.name), &d.span)
}

/// What nginx says when an enum or bitmask slot refuses a value.
fn invalid_enum(d: &Directive, arg: &str) -> Error {
    invalid(format!("invalid value \"{arg}\""), &d.span)
}

/// An address as nginx prints it in messages (`0.0.0.0:80`, `[::]:443`).
fn addr_display(address: &str, port: u16) -> String {
    if address == "*" {
        format!("0.0.0.0:{port}")
    } else if address.contains(':') {
        format!("[{address}]:{port}")
    } else {
        format!("{address}:{port}")
    }
}

/// The first argument; the arity check has made sure there is one.
fn arg0(d: &Directive) -> &str {
    d.args.first().map(String::as_str).unwrap_or_default()
}

fn set_once<T>(slot: &mut Option<T>, value: T, d: &Directive) -> Result<()> {
    if slot.is_some() {
        return Err(duplicate(d));
    }
    *slot = Some(value);
    Ok(())
}

impl Resolver<'_> {
    /// Checks a directive against the table as `ngx_conf_handler` does:
    /// known name, allowed context, block or not, argument count, and for
    /// flags the value. `None`: lenient mode skipped it.
    fn check(&mut self, d: &Directive, ctx: Ctx) -> Result<Option<&'static Spec>> {
        if d.name == "include" {
            return Err(Error::UnresolvedInclude {
                span: d.span.clone(),
            });
        }
        let spec = match directives::lookup(&d.name, ctx) {
            Lookup::Found(spec) => spec,
            Lookup::NotAllowedHere => {
                return Err(Error::NotAllowedHere {
                    name: d.name.clone(),
                    span: d.span.clone(),
                });
            }
            Lookup::OutsideSubset => return self.skip_or_fail(d, true),
            Lookup::Unknown => return self.skip_or_fail(d, false),
        };
        if spec.block && d.block.is_none() {
            return Err(Error::Arity {
                message: format!("directive \"{}\" has no opening \"{{\"", d.name),
                span: d.span.clone(),
            });
        }
        if !spec.block && d.block.is_some() {
            return Err(Error::Arity {
                message: format!("directive \"{}\" is not terminated by \";\"", d.name),
                span: d.span.clone(),
            });
        }
        if !spec.args.allows(d.args.len()) {
            return Err(Error::Arity {
                message: format!("invalid number of arguments in \"{}\" directive", d.name),
                span: d.span.clone(),
            });
        }
        if spec.args == Arity::Flag && values::parse_flag(arg0(d)).is_none() {
            return Err(invalid(
                format!(
                    "invalid value \"{}\" in \"{}\" directive, it must be \"on\" or \"off\"",
                    arg0(d),
                    d.name
                ),
                &d.span,
            ));
        }
        Ok(Some(spec))
    }

    /// A directive this crate does not serve: an error, or in lenient mode a
    /// warning and `None` (the directive and its block are skipped).
    fn skip_or_fail(
        &mut self,
        d: &Directive,
        known_to_nginx: bool,
    ) -> Result<Option<&'static Spec>> {
        if self.options.lenient {
            let message = if known_to_nginx {
                format!("directive \"{}\" is outside the subset, skipped", d.name)
            } else {
                format!("unknown directive \"{}\", skipped", d.name)
            };
            self.warnings.push(Warning {
                message,
                span: d.span.clone(),
            });
            return Ok(None);
        }
        Err(if known_to_nginx {
            outside(format!("directive \"{}\"", d.name), &d.span)
        } else {
            Error::UnknownDirective {
                name: d.name.clone(),
                span: d.span.clone(),
            }
        })
    }

    fn main(&mut self, dirs: &[Directive], file: &Path) -> Result<Ingress> {
        let mut events = false;
        let mut http: Option<Ingress> = None;
        for d in dirs {
            if self.check(d, Ctx::MAIN)?.is_none() {
                continue;
            }
            match d.name.as_str() {
                "events" => {
                    if events {
                        return Err(duplicate(d));
                    }
                    events = true;
                    for c in d.block.as_deref().unwrap_or_default() {
                        self.check(c, Ctx::EVENTS)?;
                    }
                }
                "http" => {
                    if http.is_some() {
                        return Err(duplicate(d));
                    }
                    http = Some(self.http(d.block.as_deref().unwrap_or_default())?);
                }
                _ => {} // accepted and ignored (directives::IGNORED)
            }
        }
        if !events {
            return Err(Error::MissingEvents {
                file: file.to_path_buf(),
            });
        }
        Ok(http.unwrap_or_default())
    }

    /// Settings allowed at several levels. `true` when `d` was one of them.
    fn common(&mut self, d: &Directive, conf: &mut Conf) -> Result<bool> {
        match d.name.as_str() {
            "proxy_set_header" | "grpc_set_header" => {
                let [name, value] = d.args.as_slice() else {
                    return Ok(true);
                };
                let slot = if d.name == "proxy_set_header" {
                    &mut conf.proxy_headers
                } else {
                    &mut conf.grpc_headers
                };
                slot.get_or_insert_with(Vec::new).push(Header {
                    name: name.clone(),
                    value: value.clone(),
                });
            }
            "proxy_read_timeout"
            | "grpc_read_timeout"
            | "proxy_connect_timeout"
            | "grpc_connect_timeout"
            | "proxy_send_timeout"
            | "client_body_timeout" => {
                let ms = values::parse_msec(arg0(d)).ok_or_else(|| invalid_slot(d))?;
                let slot = match d.name.as_str() {
                    "proxy_read_timeout" => &mut conf.proxy_read_timeout,
                    "grpc_read_timeout" => &mut conf.grpc_read_timeout,
                    "proxy_connect_timeout" => &mut conf.proxy_connect_timeout,
                    "proxy_send_timeout" => &mut conf.proxy_send_timeout,
                    "client_body_timeout" => &mut conf.body_timeout,
                    _ => &mut conf.grpc_connect_timeout,
                };
                set_once(slot, ms, d)?;
            }
            "client_max_body_size" | "client_body_buffer_size" => {
                let size = values::parse_size(arg0(d)).ok_or_else(|| invalid_slot(d))?;
                let slot = if d.name == "client_max_body_size" {
                    &mut conf.body
                } else {
                    &mut conf.body_buffer
                };
                set_once(slot, size, d)?;
            }
            // The `http` block's is read in `http`; the gateway times every
            // connection alike, before it knows the request's location.
            "send_timeout" => {
                return Err(outside(
                    "send_timeout in a server or location block (the gateway applies the http block's to every connection)".into(),
                    &d.span,
                ));
            }
            "proxy_request_buffering" => {
                let on = values::parse_flag(arg0(d)).unwrap_or_default();
                set_once(&mut conf.request_buffering, on, d)?;
            }
            "set_real_ip_from" => {
                let v = arg0(d);
                let cidr = match values::parse_cidr(v) {
                    Some(c) => c,
                    None if v.starts_with("unix:") => {
                        return Err(outside(format!("\"{v}\" in set_real_ip_from"), &d.span));
                    }
                    None if !v.contains(['/', ':'])
                        && v.bytes().any(|b| b.is_ascii_alphabetic()) =>
                    {
                        return Err(outside(
                            format!("host name \"{v}\" in set_real_ip_from"),
                            &d.span,
                        ));
                    }
                    None => {
                        return Err(invalid(
                            format!("host not found in set_real_ip_from \"{v}\""),
                            &d.span,
                        ));
                    }
                };
                conf.real_ip_from.get_or_insert_with(Vec::new).push(cidr);
            }
            "real_ip_header" => {
                // No duplicate check in ngx_http_realip: the last one wins.
                let v = arg0(d);
                conf.real_ip_header = Some(if v == "proxy_protocol" {
                    RealIpHeader::ProxyProtocol
                } else {
                    RealIpHeader::Header(v.to_string())
                });
            }
            "ssl_certificate" | "ssl_certificate_key" => {
                let path = self.full_path(arg0(d));
                let slot = if d.name == "ssl_certificate" {
                    &mut conf.certs
                } else {
                    &mut conf.keys
                };
                slot.get_or_insert_with(Vec::new).push(path);
            }
            "ssl_client_certificate" => {
                let path = self.full_path(arg0(d));
                set_once(&mut conf.client_cert, path, d)?;
            }
            "ssl_verify_client" => {
                let v = arg0(d);
                let mode = if v.eq_ignore_ascii_case("on") {
                    VerifyClient::On
                } else if v.eq_ignore_ascii_case("off") {
                    VerifyClient::Off
                } else if v.eq_ignore_ascii_case("optional") {
                    VerifyClient::Optional
                } else if v.eq_ignore_ascii_case("optional_no_ca") {
                    VerifyClient::OptionalNoCa
                } else {
                    return Err(invalid_enum(d, v));
                };
                set_once(&mut conf.verify, mode, d)?;
            }
            "ssl_protocols" => {
                let mut protocols = Vec::new();
                for v in &d.args {
                    let p = match v.to_ascii_lowercase().as_str() {
                        "sslv2" => TlsProtocol::SslV2,
                        "sslv3" => TlsProtocol::SslV3,
                        "tlsv1" => TlsProtocol::TlsV1,
                        "tlsv1.1" => TlsProtocol::TlsV1_1,
                        "tlsv1.2" => TlsProtocol::TlsV1_2,
                        "tlsv1.3" => TlsProtocol::TlsV1_3,
                        _ => return Err(invalid_enum(d, v)),
                    };
                    if !protocols.contains(&p) {
                        protocols.push(p);
                    }
                }
                protocols.sort();
                set_once(&mut conf.protocols, protocols, d)?;
            }
            "http2" => {
                let on = values::parse_flag(arg0(d)).unwrap_or_default();
                set_once(&mut conf.http2, on, d)?;
            }
            name if name.starts_with("proxy_ssl_") || name.starts_with("grpc_ssl_") => {
                let (tls, setting) = match name.strip_prefix("proxy_ssl_") {
                    Some(rest) => (&mut conf.proxy_tls, rest),
                    None => (&mut conf.grpc_tls, &name["grpc_ssl_".len()..]),
                };
                match setting {
                    "verify" => {
                        let on = values::parse_flag(arg0(d)).unwrap_or_default();
                        set_once(&mut tls.verify, on, d)?;
                    }
                    "server_name" => {
                        let on = values::parse_flag(arg0(d)).unwrap_or_default();
                        set_once(&mut tls.server_name, on, d)?;
                    }
                    "trusted_certificate" => {
                        let path = self.full_path(arg0(d));
                        set_once(&mut tls.trusted, path, d)?;
                    }
                    "certificate" => {
                        let path = self.full_path(arg0(d));
                        set_once(&mut tls.cert, path, d)?;
                    }
                    "certificate_key" => {
                        let path = self.full_path(arg0(d));
                        set_once(&mut tls.key, path, d)?;
                    }
                    "name" => {
                        if arg0(d).contains('$') {
                            return Err(outside(format!("variables in \"{name}\""), &d.span));
                        }
                        set_once(&mut tls.name, arg0(d).to_string(), d)?;
                    }
                    _ => return Ok(false),
                }
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Relative file names in ssl_* directives are relative to the conf
    /// prefix (`ngx_conf_full_name(…, 1)`); names with variables are kept.
    fn full_path(&self, name: &str) -> String {
        if name.starts_with('/') || name.contains('$') || name.starts_with("data:") {
            name.to_string()
        } else {
            self.conf_prefix.join(name).to_string_lossy().into_owned()
        }
    }

    fn http(&mut self, block: &[Directive]) -> Result<Ingress> {
        let mut conf = Conf::default();
        let mut servers = Vec::new();
        let mut upstreams = Vec::new();
        let mut send_timeout = None;
        for d in block {
            if self.check(d, Ctx::HTTP)?.is_none() {
                continue;
            }
            match d.name.as_str() {
                "server" => servers.push(d),
                "upstream" => upstreams.push(self.upstream(d)?),
                "send_timeout" => {
                    let ms = values::parse_msec(arg0(d)).ok_or_else(|| invalid_slot(d))?;
                    set_once(&mut send_timeout, ms, d)?;
                }
                _ => {
                    self.common(d, &mut conf)?;
                }
            }
        }
        let servers = servers
            .into_iter()
            .map(|d| self.server(d, &conf))
            .collect::<Result<Vec<_>>>()?;
        self.check_listens(&servers)?;
        Ok(Ingress {
            servers,
            upstreams,
            client_send_timeout_ms: send_timeout,
        })
    }

    fn upstream(&mut self, d: &Directive) -> Result<Upstream> {
        let name = arg0(d).to_string();
        if name.contains('$') || name.is_empty() {
            return Err(invalid(
                format!("invalid upstream name \"{name}\""),
                &d.span,
            ));
        }
        if self
            .upstreams
            .insert(name.to_ascii_lowercase(), name.clone())
            .is_some()
        {
            return Err(invalid(format!("duplicate upstream \"{name}\""), &d.span));
        }
        let mut servers = Vec::new();
        for c in d.block.as_deref().unwrap_or_default() {
            if self.check(c, Ctx::UPSTREAM)?.is_none() {
                continue;
            }
            if c.name == "server" {
                servers.push(self.upstream_server(c)?);
            }
        }
        if servers.is_empty() {
            return Err(invalid("no servers are inside upstream".into(), &d.span));
        }
        Ok(Upstream {
            name,
            servers,
            source: d.span.to_string(),
        })
    }

    fn upstream_server(&mut self, d: &Directive) -> Result<UpstreamServer> {
        let addr = arg0(d);
        if addr.starts_with("unix:") {
            return Err(outside(format!("unix socket \"{addr}\""), &d.span));
        }
        let hp = values::parse_host_port(addr, false)
            .map_err(|e| invalid(format!("{e} in upstream \"{addr}\""), &d.span))?;
        let mut s = UpstreamServer {
            host: hp.host,
            port: hp.port.unwrap_or(DEFAULT_PORT),
            weight: 1,
            max_fails: 1,
            fail_timeout_ms: 10_000,
            backup: false,
            down: false,
        };
        let bad = |p: &str| invalid(format!("invalid parameter \"{p}\""), &d.span);
        let number = |p: &str, v: &str| -> Result<u32> {
            if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad(p));
            }
            v.parse::<u32>().map_err(|_| bad(p))
        };
        for p in d.args.iter().skip(1) {
            if let Some(v) = p.strip_prefix("weight=") {
                s.weight = number(p, v)?;
                if s.weight == 0 {
                    return Err(bad(p));
                }
            } else if let Some(v) = p.strip_prefix("max_fails=") {
                s.max_fails = number(p, v)?;
            } else if let Some(v) = p.strip_prefix("fail_timeout=") {
                let secs = values::parse_time(v, true).ok_or_else(|| bad(p))?;
                s.fail_timeout_ms = secs.saturating_mul(1000);
            } else if p == "backup" {
                s.backup = true;
            } else if p == "down" {
                s.down = true;
            } else if let Some(v) = p.strip_prefix("max_conns=") {
                number(p, v)?;
                self.warnings.push(Warning {
                    message: format!("\"{p}\" is accepted and not enforced"),
                    span: d.span.clone(),
                });
            } else {
                return Err(bad(p));
            }
        }
        Ok(s)
    }

    fn server(&mut self, d: &Directive, parent: &Conf) -> Result<Server> {
        let mut conf = Conf::default();
        let mut listens = Vec::new();
        let mut names: Vec<String> = Vec::new();
        let mut locations = Vec::new();
        for c in d.block.as_deref().unwrap_or_default() {
            if self.check(c, Ctx::SERVER)?.is_none() {
                continue;
            }
            match c.name.as_str() {
                "listen" => listens.push(self.listen(c)?),
                "server_name" => {
                    for n in &c.args {
                        names.push(server_name(n, &c.span)?);
                    }
                }
                "location" => locations.push(c),
                _ => {
                    self.common(c, &mut conf)?;
                }
            }
        }
        let eff = conf.merge(parent);
        if listens.is_empty() {
            listens.push(Listen {
                address: "*".into(),
                port: DEFAULT_PORT,
                ssl: false,
                http2: false,
                proxy_protocol: false,
                default_server: false,
            });
        }
        if names.is_empty() {
            names.push(String::new());
        }
        let locations = self.locations(&locations, &eff, None)?;
        let tls = if listens.iter().any(|l| l.ssl) {
            Some(tls(&eff, &d.span)?)
        } else {
            None
        };
        let real_ip = eff
            .real_ip_from
            .as_ref()
            .filter(|from| !from.is_empty())
            .map(|from| RealIp {
                trusted: from.clone(),
                header: eff
                    .real_ip_header
                    .clone()
                    .unwrap_or_else(|| RealIpHeader::Header("X-Real-IP".into())),
            });
        Ok(Server {
            http2: eff.http2.unwrap_or(false) || listens.iter().any(|l| l.http2),
            listens,
            server_names: names,
            tls,
            real_ip,
            locations,
            source: d.span.to_string(),
        })
    }

    fn listen(&mut self, d: &Directive) -> Result<Listen> {
        let addr = arg0(d);
        if addr.starts_with("unix:") {
            return Err(outside(format!("unix socket \"{addr}\""), &d.span));
        }
        let hp: HostPort = values::parse_host_port(addr, true).map_err(|e| {
            invalid(
                format!("{e} in \"{addr}\" of the \"listen\" directive"),
                &d.span,
            )
        })?;
        let mut l = Listen {
            address: hp.host,
            port: hp.port.unwrap_or(DEFAULT_PORT),
            ssl: false,
            http2: false,
            proxy_protocol: false,
            default_server: false,
        };
        for p in d.args.iter().skip(1) {
            match p.as_str() {
                "default_server" | "default" => l.default_server = true,
                "ssl" => l.ssl = true,
                "http2" => l.http2 = true,
                "proxy_protocol" => l.proxy_protocol = true,
                "quic" => return Err(outside("\"listen … quic\"".into(), &d.span)),
                "bind" | "reuseport" | "deferred" => self.socket_option(p, d),
                _ if [
                    "backlog=",
                    "rcvbuf=",
                    "sndbuf=",
                    "so_keepalive=",
                    "ipv6only=",
                    "fastopen=",
                    "accept_filter=",
                    "setfib=",
                ]
                .iter()
                .any(|o| p.starts_with(o)) =>
                {
                    self.socket_option(p, d)
                }
                _ => return Err(invalid(format!("invalid parameter \"{p}\""), &d.span)),
            }
        }
        Ok(l)
    }

    fn socket_option(&mut self, p: &str, d: &Directive) {
        self.warnings.push(Warning {
            message: format!("listen option \"{p}\" is accepted and ignored"),
            span: d.span.clone(),
        });
    }

    /// nginx allows one `default_server` per address and port, and warns on
    /// a server name repeated on one.
    fn check_listens(&mut self, servers: &[Server]) -> Result<()> {
        let mut defaults = HashSet::new();
        let mut names: BTreeMap<(String, u16), HashSet<String>> = BTreeMap::new();
        for s in servers {
            for l in &s.listens {
                let key = (l.address.clone(), l.port);
                if l.default_server && !defaults.insert(key.clone()) {
                    return Err(invalid(
                        format!(
                            "a duplicate default server for {}",
                            addr_display(&l.address, l.port)
                        ),
                        &span_of(&s.source),
                    ));
                }
                let seen = names.entry(key).or_default();
                for n in &s.server_names {
                    if !seen.insert(n.clone()) {
                        self.warnings.push(Warning {
                            message: format!(
                                "conflicting server name \"{n}\" on {}, ignored",
                                addr_display(&l.address, l.port)
                            ),
                            span: span_of(&s.source),
                        });
                    }
                }
            }
        }
        Ok(())
    }

    fn locations(
        &mut self,
        dirs: &[&Directive],
        parent_conf: &Conf,
        parent: Option<(MatchKind, &str)>,
    ) -> Result<Vec<Location>> {
        let mut out: Vec<Location> = Vec::new();
        for d in dirs {
            let loc = self.location(d, parent_conf, parent)?;
            if out
                .iter()
                .any(|o| o.match_kind == loc.match_kind && o.path == loc.path)
            {
                return Err(invalid(
                    format!("duplicate location \"{}\"", loc.path),
                    &d.span,
                ));
            }
            out.push(loc);
        }
        Ok(out)
    }

    fn location(
        &mut self,
        d: &Directive,
        parent_conf: &Conf,
        parent: Option<(MatchKind, &str)>,
    ) -> Result<Location> {
        let (kind, path) = location_match(d)?;
        if let Some((pkind, ppath)) = parent {
            if pkind == MatchKind::Exact {
                return Err(invalid(
                    format!("location \"{path}\" cannot be inside the exact location \"{ppath}\""),
                    &d.span,
                ));
            }
            if !path.starts_with(ppath) {
                return Err(invalid(
                    format!("location \"{path}\" is outside location \"{ppath}\""),
                    &d.span,
                ));
            }
        }
        let mut conf = Conf::default();
        let mut nested = Vec::new();
        let mut proxy: Option<&Directive> = None;
        let mut grpc: Option<&Directive> = None;
        for c in d.block.as_deref().unwrap_or_default() {
            if self.check(c, Ctx::LOCATION)?.is_none() {
                continue;
            }
            match c.name.as_str() {
                "location" => nested.push(c),
                "proxy_pass" => {
                    if proxy.replace(c).is_some() {
                        return Err(duplicate(c));
                    }
                }
                "grpc_pass" => {
                    if grpc.replace(c).is_some() {
                        return Err(duplicate(c));
                    }
                }
                "set_real_ip_from" | "real_ip_header" => {
                    return Err(outside(format!("\"{}\" inside location", c.name), &c.span));
                }
                _ => {
                    self.common(c, &mut conf)?;
                }
            }
        }
        let pass = match (proxy, grpc) {
            (Some(_), Some(g)) => {
                return Err(outside(
                    "both \"proxy_pass\" and \"grpc_pass\" in one location".into(),
                    &g.span,
                ));
            }
            (Some(p), None) => Some(Pass {
                grpc: false,
                directive: p,
            }),
            (None, Some(g)) => Some(Pass {
                grpc: true,
                directive: g,
            }),
            (None, None) => None,
        };
        let eff = conf.merge(parent_conf);
        let target = pass.map(|p| self.target(&p)).transpose()?;
        let is_grpc = matches!(
            target.as_ref().map(|t| t.protocol),
            Some(Protocol::Grpc | Protocol::Grpcs)
        );
        let (headers, timeout, connect_timeout) = if is_grpc {
            (
                eff.grpc_headers.clone(),
                eff.grpc_read_timeout,
                eff.grpc_connect_timeout,
            )
        } else {
            (
                eff.proxy_headers.clone(),
                eff.proxy_read_timeout,
                eff.proxy_connect_timeout,
            )
        };
        let body = eff.body.unwrap_or(DEFAULT_CLIENT_MAX_BODY_SIZE);
        let upstream_tls = match target.as_ref().map(|t| t.protocol) {
            Some(Protocol::Https) => Some(upstream_tls(&eff.proxy_tls, "proxy", &d.span)?),
            Some(Protocol::Grpcs) => Some(upstream_tls(&eff.grpc_tls, "grpc", &d.span)?),
            _ => None,
        };
        let locations = self.locations(&nested, &eff, Some((kind, &path)))?;
        Ok(Location {
            match_kind: kind,
            path,
            target,
            headers: headers.unwrap_or_default(),
            read_timeout_ms: timeout.unwrap_or(DEFAULT_READ_TIMEOUT_MS),
            connect_timeout_ms: connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT_MS),
            // HTTP/2 upstreams (gRPC) have no send timeout of their own.
            send_timeout_ms: (!is_grpc)
                .then_some(eff.proxy_send_timeout)
                .flatten()
                .unwrap_or(DEFAULT_SEND_TIMEOUT_MS),
            client_max_body_size: (body != 0).then_some(body),
            // gRPC streams are never read ahead (ngx_http_grpc_handler sets
            // `request_body_no_buffering`).
            request_buffering: !is_grpc && eff.request_buffering.unwrap_or(true),
            client_body_buffer_size: eff.body_buffer.unwrap_or(DEFAULT_CLIENT_BODY_BUFFER_SIZE),
            client_body_timeout_ms: eff.body_timeout.unwrap_or(DEFAULT_CLIENT_BODY_TIMEOUT_MS),
            upstream_tls,
            locations,
            source: d.span.to_string(),
        })
    }

    /// `proxy_pass` / `grpc_pass` as `ngx_http_proxy_pass` /
    /// `ngx_http_grpc_pass` read them.
    fn target(&mut self, pass: &Pass<'_>) -> Result<Target> {
        let d = pass.directive;
        let url = arg0(d);
        if url.contains('$') {
            return Err(outside(format!("variables in \"{}\"", d.name), &d.span));
        }
        let lower = url.to_ascii_lowercase();
        let (protocol, rest) = if pass.grpc {
            if lower.starts_with("grpc://") {
                (Protocol::Grpc, &url[7..])
            } else if lower.starts_with("grpcs://") {
                (Protocol::Grpcs, &url[8..])
            } else {
                (Protocol::Grpc, url)
            }
        } else if lower.starts_with("http://") {
            (Protocol::Http, &url[7..])
        } else if lower.starts_with("https://") {
            (Protocol::Https, &url[8..])
        } else {
            return Err(invalid("invalid URL prefix".into(), &d.span));
        };
        if rest.starts_with("unix:") {
            return Err(outside(format!("unix socket in \"{url}\""), &d.span));
        }
        let (hostport, uri) = match rest.find(['/', '?']) {
            Some(i) => (&rest[..i], Some(rest[i..].to_string())),
            None => (rest, None),
        };
        if pass.grpc && uri.is_some() {
            return Err(outside(format!("a URI in \"{url}\""), &d.span));
        }
        let hp = values::parse_host_port(hostport, false)
            .map_err(|e| invalid(format!("{e} in upstream \"{rest}\""), &d.span))?;
        let upstream = self.upstreams.get(&hp.host.to_ascii_lowercase()).cloned();
        let backend = match (upstream, hp.port) {
            (Some(name), None) => Backend::Upstream { name },
            (Some(name), Some(port)) => {
                return Err(invalid(
                    format!("upstream \"{name}\" may not have port {port}"),
                    &d.span,
                ));
            }
            (None, Some(port)) => Backend::Address {
                host: hp.host,
                port,
            },
            (None, None) => {
                let port = match protocol {
                    Protocol::Http => 80,
                    Protocol::Https => 443,
                    // ngx_http_grpc_pass sets no default port.
                    Protocol::Grpc | Protocol::Grpcs => {
                        return Err(invalid(
                            format!("no port in upstream \"{hostport}\""),
                            &d.span,
                        ));
                    }
                };
                Backend::Address {
                    host: hp.host,
                    port,
                }
            }
        };
        Ok(Target {
            protocol,
            backend,
            uri,
        })
    }
}

/// `location [=|^~] path` and the one-word forms `=path`, `^~path`.
fn location_match(d: &Directive) -> Result<(MatchKind, String)> {
    let (modifier, name) = match d.args.as_slice() {
        [m, name] => (m.as_str(), name.as_str()),
        [name] => {
            if name.len() > 1 && name.starts_with('=') {
                ("=", &name[1..])
            } else if name.len() > 2 && name.starts_with("^~") {
                ("^~", &name[2..])
            } else if name.starts_with('~') {
                ("~", name.as_str())
            } else if name.starts_with('@') {
                ("@", name.as_str())
            } else {
                ("", name.as_str())
            }
        }
        _ => ("", ""),
    };
    match modifier {
        "=" => Ok((MatchKind::Exact, name.to_string())),
        "" | "^~" => Ok((MatchKind::Prefix, name.to_string())),
        "~" | "~*" => Err(outside(format!("regex location \"{name}\""), &d.span)),
        "@" => Err(outside(format!("named location \"{name}\""), &d.span)),
        m => Err(invalid(
            format!("invalid location modifier \"{m}\""),
            &d.span,
        )),
    }
}

/// `server_name` entries: lowercased; wildcards only as `*.name` or
/// `name.*`; regexes and variables are outside the subset.
fn server_name(n: &str, span: &Span) -> Result<String> {
    if n.starts_with('~') {
        return Err(outside(format!("regex server name \"{n}\""), span));
    }
    if n.contains('$') {
        return Err(outside(format!("server name \"{n}\""), span));
    }
    let stars = n.matches('*').count();
    let ok_wild =
        stars == 0 || (stars == 1 && (n.starts_with("*.") || (n.ends_with(".*") && n.len() > 2)));
    if !ok_wild {
        return Err(invalid(
            format!("invalid server name or wildcard \"{n}\""),
            span,
        ));
    }
    Ok(n.to_ascii_lowercase())
}

fn tls(eff: &Conf, span: &Span) -> Result<Tls> {
    let certs = eff.certs.clone().unwrap_or_default();
    if certs.is_empty() {
        return Err(invalid(
            "no \"ssl_certificate\" is defined for the \"listen ... ssl\" directive".into(),
            span,
        ));
    }
    let keys = eff.keys.clone().unwrap_or_default();
    let mut certificates = Vec::new();
    for (i, cert) in certs.iter().enumerate() {
        let Some(key) = keys.get(i) else {
            return Err(invalid(
                format!("no \"ssl_certificate_key\" is defined for certificate \"{cert}\""),
                span,
            ));
        };
        certificates.push(CertificateKey {
            certificate: cert.clone(),
            key: key.clone(),
        });
    }
    let verify_client = eff.verify.unwrap_or_default();
    if matches!(verify_client, VerifyClient::On | VerifyClient::Optional)
        && eff.client_cert.is_none()
    {
        return Err(invalid(
            "no ssl_client_certificate for ssl_verify_client".into(),
            span,
        ));
    }
    Ok(Tls {
        certificates,
        client_certificate: eff.client_cert.clone(),
        verify_client,
        protocols: eff
            .protocols
            .clone()
            .unwrap_or_else(|| DEFAULT_TLS_PROTOCOLS.to_vec()),
    })
}

/// The effective upstream TLS settings of a TLS location, checked as
/// nginx checks them when it sets up the location's SSL context
/// (`ngx_http_proxy_set_ssl`, `ngx_http_grpc_set_ssl`).
fn upstream_tls(t: &UpTls, family: &str, span: &Span) -> Result<UpstreamTls> {
    if let Some(cert) = &t.cert
        && t.key.is_none()
    {
        return Err(invalid(
            format!("no \"{family}_ssl_certificate_key\" is defined for certificate \"{cert}\""),
            span,
        ));
    }
    if t.verify == Some(true) && t.trusted.is_none() {
        return Err(invalid(
            format!("no {family}_ssl_trusted_certificate for {family}_ssl_verify"),
            span,
        ));
    }
    Ok(UpstreamTls {
        verify: t.verify,
        trusted_certificate: t.trusted.clone(),
        server_name: t.server_name.unwrap_or(false),
        name: t.name.clone(),
        certificate: t.cert.clone(),
        certificate_key: t.key.clone(),
    })
}

/// Turns a `file:line` string back into a span (for checks made on the
/// model).
fn span_of(source: &str) -> Span {
    let (file, line) = source
        .rsplit_once(':')
        .and_then(|(f, l)| l.parse().ok().map(|l| (f, l)))
        .unwrap_or((source, 0));
    Span::new(std::sync::Arc::from(Path::new(file)), line)
}

#[cfg(test)]
mod tests;
