//! Where sidecar instances come from, each a source of an [`UpstreamSet`]:
//! the static list (published once, at start); [`DnsDiscovery`], which
//! resolves a name every `upstreamPool.dnsRefreshSeconds` — every address it
//! resolves to is one instance, dialled by address, checked by name; and
//! [`EndpointSliceDiscovery`], a kube-rs watch of a Service's
//! `discovery.k8s.io/v1` EndpointSlices — every ready endpoint address is an
//! instance.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use super::{Target, UpstreamSet};
use crate::config::upstreams::EndpointSliceConfig;

/// Resolves `host:port` to addresses; the system resolver unless a test
/// supplies another.
pub type Resolver =
    Arc<dyn Fn(String, u16) -> BoxFuture<'static, std::io::Result<Vec<SocketAddr>>> + Send + Sync>;

/// The system resolver (`getaddrinfo` on a blocking thread).
pub fn system_resolver() -> Resolver {
    Arc::new(|host, port| {
        Box::pin(async move {
            Ok(tokio::net::lookup_host((host.as_str(), port))
                .await?
                .collect())
        })
    })
}

/// One `discovery: dns` upstream: its name re-resolved periodically.
pub struct DnsDiscovery {
    set: Arc<UpstreamSet>,
    source: usize,
    target: Target,
    interval: Duration,
    resolver: Resolver,
}

impl std::fmt::Debug for DnsDiscovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DnsDiscovery")
            .field("target", &self.target.url())
            .field("interval", &self.interval)
            .finish_non_exhaustive()
    }
}

impl DnsDiscovery {
    /// Discovery of `target`'s host into a new source of `set`.
    pub fn new(set: Arc<UpstreamSet>, target: Target, interval: Duration) -> Self {
        let source = set.add_discovered_source();
        Self {
            set,
            source,
            target,
            interval,
            resolver: system_resolver(),
        }
    }

    /// Resolves with `resolver` instead of the system's.
    #[must_use]
    pub fn with_resolver(mut self, resolver: Resolver) -> Self {
        self.resolver = resolver;
        self
    }

    /// Resolves once and publishes the instances. A failed or empty answer
    /// keeps the instances of the last good one (a resolver hiccup must not
    /// empty the pool); the error is returned for logging.
    pub async fn refresh(&self) -> std::io::Result<usize> {
        let addrs = (self.resolver)(self.target.host().to_owned(), self.target.port()).await?;
        let addrs: BTreeSet<SocketAddr> = addrs.into_iter().collect();
        if addrs.is_empty() {
            return Err(std::io::Error::other("resolved to no address"));
        }
        let n = addrs.len();
        let instances = addrs.into_iter().map(|a| self.target.instance(a)).collect();
        self.set.update(self.source, instances);
        Ok(n)
    }

    /// Re-resolves every interval until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            match self.refresh().await {
                Ok(n) => tracing::debug!(upstream = self.target.url(), instances = n, "resolved"),
                Err(e) => tracing::warn!(
                    upstream = self.target.url(),
                    error = %e,
                    "resolving upstream failed; keeping its last instances"
                ),
            }
        }
    }
}

/// Why an EndpointSlice watch could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kubeconfig file could not be read or used.
    #[error("kubeconfig: {0}")]
    Kubeconfig(#[source] kube::config::KubeconfigError),
    /// Neither in-cluster configuration nor `KUBECONFIG` was found.
    #[error("no cluster configuration: {0}")]
    InferConfig(#[source] kube::config::InferConfigError),
    /// The client could not be built.
    #[error("Kubernetes client: {0}")]
    Client(#[source] kube::Error),
}

/// The label EndpointSlices carry naming their Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// One `discovery: endpointSlices` upstream: a watch of its Service's
/// EndpointSlices.
pub struct EndpointSliceDiscovery {
    set: Arc<UpstreamSet>,
    source: usize,
    target: Target,
    config: EndpointSliceConfig,
    api: kube::Api<k8s_openapi::api::discovery::v1::EndpointSlice>,
}

impl std::fmt::Debug for EndpointSliceDiscovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EndpointSliceDiscovery")
            .field("target", &self.target.url())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl EndpointSliceDiscovery {
    /// Connects a client (kubeconfig or in-cluster) for `target`'s slices,
    /// as a new source of `set`. Nothing is listed until [`run`](Self::run).
    pub async fn new(
        set: Arc<UpstreamSet>,
        target: Target,
        config: EndpointSliceConfig,
    ) -> Result<Self, Error> {
        let client_config = match &config.kubeconfig {
            Some(path) => {
                let kubeconfig =
                    kube::config::Kubeconfig::read_from(path).map_err(Error::Kubeconfig)?;
                kube::Config::from_custom_kubeconfig(
                    kubeconfig,
                    &kube::config::KubeConfigOptions::default(),
                )
                .await
                .map_err(Error::Kubeconfig)?
            }
            None => kube::Config::infer().await.map_err(Error::InferConfig)?,
        };
        let namespace = config
            .namespace
            .clone()
            .unwrap_or_else(|| client_config.default_namespace.clone());
        let client = kube::Client::try_from(client_config).map_err(Error::Client)?;
        let source = set.add_discovered_source();
        Ok(Self {
            set,
            source,
            target,
            api: kube::Api::namespaced(client, &namespace),
            config,
        })
    }

    /// The instances `slices` name: every address of every endpoint not
    /// known to be unready, at the chosen port.
    pub fn instances<'a>(
        &self,
        slices: impl IntoIterator<Item = &'a k8s_openapi::api::discovery::v1::EndpointSlice>,
    ) -> Vec<Target> {
        let mut out = BTreeSet::new();
        for slice in slices {
            let ports = slice.ports.as_deref().unwrap_or_default();
            let port = match &self.config.port_name {
                Some(name) => ports
                    .iter()
                    .find(|p| p.name.as_deref() == Some(name.as_str()))
                    .and_then(|p| p.port),
                None if ports.len() == 1 => ports[0].port,
                None => None,
            };
            let Some(port) = port
                .and_then(|p| u16::try_from(p).ok())
                .or((ports.is_empty() && self.config.port_name.is_none())
                    .then_some(self.target.port()))
            else {
                continue;
            };
            for endpoint in slice.endpoints.iter().flatten() {
                // An absent `ready` means ready (the API's own reading).
                if endpoint.conditions.as_ref().and_then(|c| c.ready) == Some(false) {
                    continue;
                }
                for address in &endpoint.addresses {
                    if let Ok(ip) = address.parse::<std::net::IpAddr>() {
                        out.insert(SocketAddr::new(ip, port));
                    }
                }
            }
        }
        out.into_iter().map(|a| self.target.instance(a)).collect()
    }

    /// Watches the slices until `shutdown`, publishing the instances after
    /// the initial list and after every change. A broken watch is resumed
    /// with backoff, keeping the last instances meanwhile.
    pub async fn run(self, shutdown: CancellationToken) {
        use futures::StreamExt;
        use kube::runtime::WatchStreamExt;
        use kube::runtime::watcher::{self, Event};
        use std::collections::BTreeMap;

        let selector = format!("{SERVICE_NAME_LABEL}={}", self.config.service);
        let stream = watcher::watcher(
            self.api.clone(),
            watcher::Config::default().labels(&selector),
        )
        .default_backoff();
        let mut stream = std::pin::pin!(stream);
        let mut slices = BTreeMap::new();
        let mut init: Option<BTreeMap<String, _>> = None;
        let name = |s: &k8s_openapi::api::discovery::v1::EndpointSlice| {
            s.metadata.name.clone().unwrap_or_default()
        };
        loop {
            let event = tokio::select! {
                _ = shutdown.cancelled() => return,
                event = stream.next() => event,
            };
            let publish = match event {
                None => return,
                Some(Err(e)) => {
                    tracing::warn!(upstream = self.target.url(), error = %e, "EndpointSlice watch failed; retrying");
                    false
                }
                Some(Ok(Event::Init)) => {
                    init = Some(BTreeMap::new());
                    false
                }
                Some(Ok(Event::InitApply(s))) => {
                    if let Some(init) = init.as_mut() {
                        init.insert(name(&s), s);
                    }
                    false
                }
                Some(Ok(Event::InitDone)) => {
                    slices = init.take().unwrap_or_default();
                    true
                }
                Some(Ok(Event::Apply(s))) => {
                    slices.insert(name(&s), s);
                    true
                }
                Some(Ok(Event::Delete(s))) => {
                    slices.remove(&name(&s));
                    true
                }
            };
            if publish {
                let instances = self.instances(slices.values());
                tracing::debug!(
                    upstream = self.target.url(),
                    instances = instances.len(),
                    "EndpointSlices changed"
                );
                self.set.update(self.source, instances);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn each_address_is_an_instance_and_the_name_is_re_resolved() {
        let answers: Arc<Mutex<Vec<std::io::Result<Vec<SocketAddr>>>>> =
            Arc::new(Mutex::new(vec![
                Ok(vec!["10.0.0.2:7001".parse().unwrap()]),
                Err(std::io::Error::other("SERVFAIL")),
                Ok(vec![
                    "10.0.0.1:7001".parse().unwrap(),
                    "10.0.0.2:7001".parse().unwrap(),
                    "10.0.0.1:7001".parse().unwrap(),
                ]),
            ]));
        let asked = Arc::new(Mutex::new(Vec::new()));
        let resolver: Resolver = {
            let answers = answers.clone();
            let asked = asked.clone();
            Arc::new(move |host, port| {
                asked.lock().unwrap().push((host, port));
                let next = answers.lock().unwrap().pop();
                Box::pin(async move { next.unwrap_or_else(|| Ok(Vec::new())) })
            })
        };
        let set = Arc::new(UpstreamSet::default());
        let mut changes = set.subscribe();
        let target = Target::parse("http://sidecar.spinlink.svc:7001").unwrap();
        let dns =
            DnsDiscovery::new(set.clone(), target, Duration::from_secs(30)).with_resolver(resolver);
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(dns.run(shutdown.clone()));
        let urls = |set: &UpstreamSet| -> Vec<String> {
            set.instances().iter().map(|i| i.url().to_owned()).collect()
        };
        // First answer (popped from the end): two distinct addresses.
        changes.changed().await.unwrap();
        assert_eq!(urls(&set), ["http://10.0.0.1:7001", "http://10.0.0.2:7001"]);
        // 30 s later: SERVFAIL keeps them; 30 s more: one address left.
        tokio::time::sleep(Duration::from_secs(31)).await;
        assert_eq!(urls(&set).len(), 2);
        changes.changed().await.unwrap();
        assert_eq!(urls(&set), ["http://10.0.0.2:7001"]);
        assert!(
            asked
                .lock()
                .unwrap()
                .iter()
                .all(|q| *q == ("sidecar.spinlink.svc".to_owned(), 7001))
        );
        // An empty answer keeps the last instances too.
        tokio::time::sleep(Duration::from_secs(31)).await;
        assert_eq!(urls(&set), ["http://10.0.0.2:7001"]);
        shutdown.cancel();
        task.await.unwrap();
    }
}
