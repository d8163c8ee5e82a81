//! The load loop: `concurrency` workers send GETs over kept-alive HTTP/1.1
//! connections until exactly `requests` have been answered (plus `warmup`
//! unmeasured ones first), timing each from send to the last body byte.
//! Bounded by the request count, never by "until stopped".

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// What one load run measured.
#[derive(Debug)]
pub struct LoadResult {
    /// One latency per measured request.
    pub latencies: Vec<Duration>,
    /// Body size of the last answer.
    pub body_bytes: usize,
    /// Wall time of the measured part.
    pub wall: Duration,
}

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

fn client() -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(64)
        .build(connector)
}

async fn get(client: &HttpClient, url: &http::Uri) -> anyhow::Result<usize> {
    let req = http::Request::get(url.clone())
        .header(http::header::ACCEPT, "application/json")
        .body(Empty::new())?;
    let resp = client.request(req).await.context("sending")?;
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .context("reading")?
        .to_bytes();
    if !status.is_success() {
        bail!("{url}: {status}: {}", String::from_utf8_lossy(&body));
    }
    Ok(body.len())
}

/// GETs `url` `warmup` times, then `requests` times from `concurrency`
/// workers, and returns the measured latencies.
pub async fn run(
    url: &str,
    requests: usize,
    concurrency: usize,
    warmup: usize,
) -> anyhow::Result<LoadResult> {
    let uri: http::Uri = url.parse().with_context(|| format!("bad URL {url}"))?;
    let client = client();
    for _ in 0..warmup {
        get(&client, &uri).await?;
    }
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..concurrency.max(1) {
        let (client, uri, next) = (client.clone(), uri.clone(), next.clone());
        workers.spawn(async move {
            let mut latencies = Vec::new();
            let mut bytes = 0;
            while next.fetch_add(1, Ordering::Relaxed) < requests {
                let t = Instant::now();
                bytes = get(&client, &uri).await?;
                latencies.push(t.elapsed());
            }
            anyhow::Ok((latencies, bytes))
        });
    }
    let mut latencies = Vec::with_capacity(requests);
    let mut body_bytes = 0;
    while let Some(done) = workers.join_next().await {
        let (l, b) = done??;
        latencies.extend(l);
        body_bytes = body_bytes.max(b);
    }
    Ok(LoadResult {
        latencies,
        body_bytes,
        wall: start.elapsed(),
    })
}

/// GETs `url` once and returns the body.
pub async fn fetch(url: &str) -> anyhow::Result<Bytes> {
    let uri: http::Uri = url.parse().with_context(|| format!("bad URL {url}"))?;
    let req = http::Request::get(uri).body(Empty::new())?;
    let resp = client().request(req).await.context("sending")?;
    let status = resp.status();
    let body = resp.into_body().collect().await?.to_bytes();
    if !status.is_success() {
        bail!("{url}: {status}");
    }
    Ok(body)
}

/// Lists `url` page by page as kubectl does (`limit=<page>`, then each
/// `continue` token until none is left) and returns the time it took, the
/// number of requests and the bytes received. Bounded by `max_pages`.
pub async fn list_all(
    url: &str,
    page: usize,
    max_pages: usize,
) -> anyhow::Result<(Duration, usize, usize)> {
    #[derive(serde::Deserialize)]
    struct Meta {
        #[serde(rename = "continue", default)]
        next: Option<String>,
    }
    #[derive(serde::Deserialize)]
    struct Head {
        metadata: Meta,
    }
    let client = client();
    let start = Instant::now();
    let (mut bytes, mut token) = (0, String::new());
    for pages in 1..=max_pages {
        let sep = if url.contains('?') { '&' } else { '?' };
        let mut page_url = format!("{url}{sep}limit={page}");
        if !token.is_empty() {
            page_url.push_str(&format!("&continue={token}"));
        }
        let uri: http::Uri = page_url.parse()?;
        let req = http::Request::get(uri)
            .header(http::header::ACCEPT, "application/json")
            .body(Empty::new())?;
        let resp = client.request(req).await.context("sending")?;
        let status = resp.status();
        let body = resp.into_body().collect().await?.to_bytes();
        if !status.is_success() {
            bail!("{page_url}: {status}");
        }
        bytes += body.len();
        let head: Head = serde_json::from_slice(&body).context("not a List")?;
        match head.metadata.next.filter(|t| !t.is_empty()) {
            // kube-sim tokens are URL-safe base64; escape `=` padding anyway.
            Some(t) => token = t.replace('=', "%3D"),
            None => return Ok((start.elapsed(), pages, bytes)),
        }
    }
    bail!("{url}: more than {max_pages} pages")
}
