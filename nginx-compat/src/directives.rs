//! The directive table: every directive this crate accepts, where nginx
//! allows it and how many arguments it takes, mirroring the `ngx_command_t`
//! entries of the nginx modules that define them.
//!
//! Three groups:
//! - `HANDLED`: the ingress subset, turned into the model.
//! - `IGNORED` ([`ignored_names`]): directives a complete `nginx.conf` carries that mean
//!   nothing to the gateway (workers, events, logging, MIME types, buffer and
//!   socket tuning). They are checked for context and argument count, flags
//!   for `on`/`off`, and then skipped. `types { … }` is skipped whole.
//! - `OUTSIDE_SUBSET`: well-known nginx directives the gateway does not
//!   serve. They are errors (warnings in lenient mode) worded as such, so an
//!   operator can tell "not supported" from a typo.

/// The block a directive appears in (a bit set, like nginx's `*_CONF` flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ctx(u8);

impl Ctx {
    pub(crate) const MAIN: Ctx = Ctx(1);
    pub(crate) const EVENTS: Ctx = Ctx(2);
    pub(crate) const HTTP: Ctx = Ctx(4);
    pub(crate) const SERVER: Ctx = Ctx(8);
    pub(crate) const LOCATION: Ctx = Ctx(16);
    pub(crate) const UPSTREAM: Ctx = Ctx(32);

    const fn or(self, other: Ctx) -> Ctx {
        Ctx(self.0 | other.0)
    }

    fn contains(self, other: Ctx) -> bool {
        self.0 & other.0 != 0
    }
}

const HS: Ctx = Ctx::HTTP.or(Ctx::SERVER);
const HSL: Ctx = HS.or(Ctx::LOCATION);
const MHSL: Ctx = HSL.or(Ctx::MAIN);
const SL: Ctx = Ctx::SERVER.or(Ctx::LOCATION);

/// Argument counts, as `ngx_conf_handler` checks them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arity {
    /// `NGX_CONF_TAKE*`: bit `n` set when `n` arguments are allowed
    /// (at most 7, nginx's `NGX_CONF_MAX_ARGS` less the name).
    Take(u8),
    /// `NGX_CONF_FLAG`: one argument, `on` or `off`.
    Flag,
    /// `NGX_CONF_1MORE`.
    OneMore,
    /// `NGX_CONF_2MORE`.
    TwoMore,
}

impl Arity {
    pub(crate) fn allows(self, n: usize) -> bool {
        match self {
            Arity::Take(mask) => n < 8 && mask & (1 << n) != 0,
            Arity::Flag => n == 1,
            Arity::OneMore => n >= 1,
            Arity::TwoMore => n >= 2,
        }
    }
}

const T0: Arity = Arity::Take(1);
const T1: Arity = Arity::Take(2);
const T2: Arity = Arity::Take(4);
const T12: Arity = Arity::Take(2 | 4);

/// One `ngx_command_t`, reduced to what is checked.
#[derive(Debug)]
pub(crate) struct Spec {
    pub(crate) name: &'static str,
    pub(crate) ctx: Ctx,
    pub(crate) block: bool,
    pub(crate) args: Arity,
}

const fn spec(name: &'static str, ctx: Ctx, block: bool, args: Arity) -> Spec {
    Spec {
        name,
        ctx,
        block,
        args,
    }
}

/// The ingress subset.
pub(crate) const HANDLED: &[Spec] = &[
    spec("events", Ctx::MAIN, true, T0),
    spec("http", Ctx::MAIN, true, T0),
    spec("server", Ctx::HTTP, true, T0),
    spec("server", Ctx::UPSTREAM, false, Arity::OneMore),
    spec("upstream", Ctx::HTTP, true, T1),
    spec("location", SL, true, T12),
    spec("listen", Ctx::SERVER, false, Arity::OneMore),
    spec("server_name", Ctx::SERVER, false, Arity::OneMore),
    spec("http2", HS, false, Arity::Flag),
    spec("ssl_certificate", HS, false, T1),
    spec("ssl_certificate_key", HS, false, T1),
    spec("ssl_client_certificate", HS, false, T1),
    spec("ssl_verify_client", HS, false, T1),
    spec("ssl_protocols", HS, false, Arity::OneMore),
    spec("proxy_pass", Ctx::LOCATION, false, T1),
    spec("grpc_pass", Ctx::LOCATION, false, T1),
    spec("proxy_set_header", HSL, false, T2),
    spec("grpc_set_header", HSL, false, T2),
    spec("proxy_read_timeout", HSL, false, T1),
    spec("grpc_read_timeout", HSL, false, T1),
    spec("proxy_connect_timeout", HSL, false, T1),
    spec("grpc_connect_timeout", HSL, false, T1),
    spec("proxy_send_timeout", HSL, false, T1),
    // TLS to upstreams (`proxy_pass https://`, `grpc_pass grpcs://`).
    spec("proxy_ssl_verify", HSL, false, Arity::Flag),
    spec("grpc_ssl_verify", HSL, false, Arity::Flag),
    spec("proxy_ssl_trusted_certificate", HSL, false, T1),
    spec("grpc_ssl_trusted_certificate", HSL, false, T1),
    spec("proxy_ssl_server_name", HSL, false, Arity::Flag),
    spec("grpc_ssl_server_name", HSL, false, Arity::Flag),
    spec("proxy_ssl_name", HSL, false, T1),
    spec("grpc_ssl_name", HSL, false, T1),
    spec("proxy_ssl_certificate", HSL, false, T1),
    spec("grpc_ssl_certificate", HSL, false, T1),
    spec("proxy_ssl_certificate_key", HSL, false, T1),
    spec("grpc_ssl_certificate_key", HSL, false, T1),
    spec("client_max_body_size", HSL, false, T1),
    spec("client_body_buffer_size", HSL, false, T1),
    spec("client_body_timeout", HSL, false, T1),
    spec("proxy_request_buffering", HSL, false, Arity::Flag),
    // In `http` only (one value for every connection); in a server or
    // location it is refused as outside the subset.
    spec("send_timeout", HSL, false, T1),
    spec("set_real_ip_from", HSL, false, T1),
    spec("real_ip_header", HSL, false, T1),
];

/// Accepted and ignored: they have no meaning for the gateway.
pub(crate) const IGNORED: &[Spec] = &[
    // Process and worker settings (core module).
    spec("user", Ctx::MAIN, false, T12),
    spec("worker_processes", Ctx::MAIN, false, T1),
    spec("worker_rlimit_nofile", Ctx::MAIN, false, T1),
    spec("worker_shutdown_timeout", Ctx::MAIN, false, T1),
    spec("worker_cpu_affinity", Ctx::MAIN, false, Arity::OneMore),
    spec("pid", Ctx::MAIN, false, T1),
    spec("daemon", Ctx::MAIN, false, Arity::Flag),
    spec("master_process", Ctx::MAIN, false, Arity::Flag),
    spec("pcre_jit", Ctx::MAIN, false, Arity::Flag),
    spec("timer_resolution", Ctx::MAIN, false, T1),
    spec("env", Ctx::MAIN, false, T1),
    spec("error_log", MHSL, false, Arity::OneMore),
    // events { }.
    spec("worker_connections", Ctx::EVENTS, false, T1),
    spec("use", Ctx::EVENTS, false, T1),
    spec("multi_accept", Ctx::EVENTS, false, Arity::Flag),
    spec("accept_mutex", Ctx::EVENTS, false, Arity::Flag),
    // Logging, MIME types, file sending, connection tuning.
    spec("access_log", HSL, false, Arity::OneMore),
    spec("log_format", Ctx::HTTP, false, Arity::TwoMore),
    spec("types", HSL, true, T0),
    spec("default_type", HSL, false, T1),
    spec("types_hash_max_size", HSL, false, T1),
    spec("types_hash_bucket_size", HSL, false, T1),
    spec("server_names_hash_max_size", Ctx::HTTP, false, T1),
    spec("server_names_hash_bucket_size", Ctx::HTTP, false, T1),
    spec("sendfile", HSL, false, Arity::Flag),
    spec("tcp_nopush", HSL, false, Arity::Flag),
    spec("tcp_nodelay", HSL, false, Arity::Flag),
    spec("keepalive_timeout", HSL, false, T12),
    spec("keepalive_requests", HSL, false, T1),
    spec("server_tokens", HSL, false, T1),
    spec("charset", HSL, false, T1),
    // TLS session caching: an optimisation the gateway makes its own way.
    spec("ssl_session_cache", HS, false, T12),
    spec("ssl_session_timeout", HS, false, T1),
    spec("ssl_session_tickets", HS, false, Arity::Flag),
    spec("ssl_prefer_server_ciphers", HS, false, Arity::Flag),
    // Upstream connection handling the gateway always does (HTTP/1.1,
    // pooled connections, answers streamed to the client).
    spec("proxy_http_version", HSL, false, T1),
    spec("proxy_buffering", HSL, false, Arity::Flag),
    spec("keepalive", Ctx::UPSTREAM, false, T1),
];

/// nginx directives the gateway does not serve.
pub(crate) const OUTSIDE_SUBSET: &[&str] = &[
    "add_header",
    "allow",
    "auth_basic",
    "auth_basic_user_file",
    "auth_request",
    "client_header_timeout",
    "deny",
    "error_page",
    "expires",
    "grpc_buffer_size",
    "grpc_next_upstream",
    "grpc_send_timeout",
    "gzip",
    "if",
    "index",
    "large_client_header_buffers",
    "limit_except",
    "limit_req",
    "limit_req_zone",
    "map",
    "proxy_buffer_size",
    "proxy_buffers",
    "proxy_busy_buffers_size",
    "proxy_cache",
    "proxy_cookie_domain",
    "proxy_cookie_path",
    "proxy_hide_header",
    "proxy_ignore_client_abort",
    "proxy_intercept_errors",
    "proxy_next_upstream",
    "proxy_next_upstream_timeout",
    "proxy_next_upstream_tries",
    "proxy_pass_header",
    "proxy_redirect",
    "real_ip_recursive",
    "resolver",
    "return",
    "rewrite",
    "root",
    "satisfy",
    "ssl_ciphers",
    "ssl_dhparam",
    "ssl_stapling",
    "ssl_trusted_certificate",
    "ssl_verify_depth",
    "stream",
    "sub_filter",
    "try_files",
];

/// What the table says about a name in a context.
#[derive(Debug)]
pub(crate) enum Lookup {
    /// Known and allowed here.
    Found(&'static Spec),
    /// Known, but not in this block.
    NotAllowedHere,
    /// A real nginx directive the gateway does not serve.
    OutsideSubset,
    /// Neither.
    Unknown,
}

pub(crate) fn lookup(name: &str, ctx: Ctx) -> Lookup {
    let mut known = false;
    for spec in HANDLED.iter().chain(IGNORED) {
        if spec.name == name {
            known = true;
            if spec.ctx.contains(ctx) {
                return Lookup::Found(spec);
            }
        }
    }
    if known {
        Lookup::NotAllowedHere
    } else if OUTSIDE_SUBSET.contains(&name) {
        Lookup::OutsideSubset
    } else {
        Lookup::Unknown
    }
}

/// Whether `name` is one of the accepted-and-ignored directives.
pub fn is_ignored(name: &str) -> bool {
    IGNORED.iter().any(|s| s.name == name)
}

/// The nginx directives outside the subset: refused by name (or skipped
/// with `--lenient`), never taken for unknown ones.
pub fn outside_subset_names() -> impl Iterator<Item = &'static str> {
    OUTSIDE_SUBSET.iter().copied()
}

/// The names of the accepted-and-ignored directives, for documentation and
/// `--help` texts.
pub fn ignored_names() -> impl Iterator<Item = &'static str> {
    let mut seen = Vec::new();
    IGNORED.iter().filter_map(move |s| {
        if seen.contains(&s.name) {
            None
        } else {
            seen.push(s.name);
            Some(s.name)
        }
    })
}
