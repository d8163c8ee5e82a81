//! Agent mode: the in-cluster service account. The API server is
//! `KUBERNETES_SERVICE_HOST`:`KUBERNETES_SERVICE_PORT`, its CA `ca.crt` in
//! the service account directory, and the bearer token `token` there — read
//! again whenever the file changes, because the kubelet rotates projected
//! tokens (every hour or so) by swapping the mount's `..data` symlink.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use http::{HeaderValue, Request};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

/// Reading the in-cluster configuration failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `KUBERNETES_SERVICE_HOST` is not set: not running in a pod.
    #[error("KUBERNETES_SERVICE_HOST is not set (not running in a pod?)")]
    NoHost,
    /// A file of the service account could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// `ca.crt` holds no certificate.
    #[error("{0}: no PEM certificate")]
    NoCertificate(PathBuf),
    /// The API server address is not a URL.
    #[error("API server address {0:?} is not a URL")]
    Url(String),
}

/// The service account token, re-read when its file changes.
#[derive(Debug, Clone)]
pub struct TokenFile {
    path: PathBuf,
    /// Modification time and header value of the last read.
    cached: Arc<Mutex<Option<(SystemTime, HeaderValue)>>>,
}

impl TokenFile {
    /// The token at `path` (read on first use).
    pub fn new(path: PathBuf) -> Self {
        Self {
            path,
            cached: Arc::default(),
        }
    }

    /// `Bearer <token>`, from the cache unless the file changed. `None` when
    /// the file cannot be read (the request then goes without a token and
    /// the API server answers 401, which is logged where it is seen).
    pub fn header(&self) -> Option<HeaderValue> {
        // Following the symlinks: a swapped `..data` shows a new mtime.
        let modified = std::fs::metadata(&self.path)
            .and_then(|m| m.modified())
            .ok()?;
        let mut cached = self.cached.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, value)) = cached.as_ref()
            && *at == modified
        {
            return Some(value.clone());
        }
        let token = std::fs::read_to_string(&self.path).ok()?;
        let mut value = HeaderValue::from_str(&format!("Bearer {}", token.trim())).ok()?;
        value.set_sensitive(true);
        *cached = Some((modified, value.clone()));
        Some(value)
    }
}

/// The kube-rs configuration of the in-cluster service account in `dir`
/// (without credentials: [`TokenFile`] adds them to every request), and its
/// token file.
pub fn config(dir: &Path) -> Result<(kube::Config, TokenFile), Error> {
    config_with_env(dir, |name| std::env::var(name).ok())
}

/// [`config`] with the environment read through `env` (tests).
pub fn config_with_env(
    dir: &Path,
    env: impl Fn(&str) -> Option<String>,
) -> Result<(kube::Config, TokenFile), Error> {
    let host = env("KUBERNETES_SERVICE_HOST")
        .filter(|h| !h.is_empty())
        .ok_or(Error::NoHost)?;
    let port = env("KUBERNETES_SERVICE_PORT")
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "443".to_owned());
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host
    };
    let url = format!("https://{host}:{port}");
    let uri: http::Uri = url.parse().map_err(|_| Error::Url(url.clone()))?;
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read(&path).map_err(|source| Error::Read { path, source })
    };
    let ca = read("ca.crt")?;
    let certs: Vec<Vec<u8>> = CertificateDer::pem_slice_iter(&ca)
        .filter_map(Result::ok)
        .map(|c| c.as_ref().to_vec())
        .collect();
    if certs.is_empty() {
        return Err(Error::NoCertificate(dir.join("ca.crt")));
    }
    let namespace = read("namespace")
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .map(|n| n.trim().to_owned())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "default".to_owned());
    let mut config = kube::Config::new(uri);
    config.root_cert = Some(certs);
    config.default_namespace = namespace;
    Ok((config, TokenFile::new(dir.join("token"))))
}

/// A client for `config` that sends the token of `token` with every request;
/// its API server connections count in `connections`.
pub fn client(
    config: kube::Config,
    token: TokenFile,
    connections: prometheus_client::metrics::gauge::Gauge,
) -> kube::Result<kube::Client> {
    Ok(crate::apiserver::builder(&config, connections)?
        .with_layer(&BearerLayer(token))
        .build())
}

/// Sets `Authorization` from the token file on every request.
#[derive(Debug, Clone)]
pub struct BearerLayer(pub TokenFile);

impl<S> tower::Layer<S> for BearerLayer {
    type Service = Bearer<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Bearer {
            inner,
            token: self.0.clone(),
        }
    }
}

/// The service [`BearerLayer`] makes.
#[derive(Debug, Clone)]
pub struct Bearer<S> {
    inner: S,
    token: TokenFile,
}

impl<S, B> tower::Service<Request<B>> for Bearer<S>
where
    S: tower::Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        if let Some(value) = self.token.header() {
            req.headers_mut().insert(http::header::AUTHORIZATION, value);
        }
        self.inner.call(req)
    }
}
