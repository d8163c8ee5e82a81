//! Test helpers: a kube-sim server on 127.0.0.1:0 and a small HTTP client.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use spinlink_kube_sim::{Server, Sim};
use tokio_util::sync::CancellationToken;

/// Upper bound for anything a test waits for.
pub const WAIT: Duration = Duration::from_secs(10);

pub struct Running {
    pub url: String,
    pub sim: Sim,
    pub shutdown: CancellationToken,
    pub task: tokio::task::JoinHandle<std::io::Result<()>>,
    client: Client<HttpConnector, Full<Bytes>>,
}

pub async fn start(sim: Sim) -> Running {
    let server = Server::bind(sim.clone(), SocketAddr::from(([127, 0, 0, 1], 0)), None)
        .await
        .unwrap();
    let url = server.url();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(server.run(shutdown.clone()));
    Running {
        url,
        sim,
        shutdown,
        task,
        client: Client::builder(TokioExecutor::new()).build_http(),
    }
}

pub struct Resp {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Resp {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn content_type(&self) -> &str {
        self.headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }
}

impl Running {
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Resp {
        self.send_bytes(method, path, headers, body.as_bytes().to_vec())
            .await
    }

    /// Sends a body of any bytes.
    pub async fn send_bytes(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> Resp {
        let mut req = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.url));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(Full::new(Bytes::from(body))).unwrap();
        let resp = tokio::time::timeout(WAIT, self.client.request(req))
            .await
            .expect("response in time")
            .unwrap();
        let status = resp.status();
        let headers = resp.headers().clone();
        let body = tokio::time::timeout(WAIT, resp.into_body().collect())
            .await
            .expect("body in time")
            .unwrap()
            .to_bytes();
        Resp {
            status,
            headers,
            body,
        }
    }

    pub async fn open(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> hyper::Response<Incoming> {
        let mut req = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.url));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(Full::new(Bytes::from(body.to_string()))).unwrap();
        tokio::time::timeout(WAIT, self.client.request(req))
            .await
            .expect("response in time")
            .unwrap()
    }

    pub async fn get(&self, path: &str) -> Resp {
        self.send(Method::GET, path, &[], "").await
    }

    pub async fn get_accept(&self, path: &str, accept: &str) -> Resp {
        self.send(Method::GET, path, &[("accept", accept)], "")
            .await
    }

    pub async fn post(&self, path: &str, body: &Value) -> Resp {
        self.send(
            Method::POST,
            path,
            &[("content-type", "application/json")],
            &body.to_string(),
        )
        .await
    }

    pub async fn put(&self, path: &str, body: &Value) -> Resp {
        self.send(
            Method::PUT,
            path,
            &[("content-type", "application/json")],
            &body.to_string(),
        )
        .await
    }

    pub async fn patch(&self, path: &str, content_type: &str, body: &str) -> Resp {
        self.send(Method::PATCH, path, &[("content-type", content_type)], body)
            .await
    }

    pub async fn delete(&self, path: &str) -> Resp {
        self.send(Method::DELETE, path, &[], "").await
    }

    /// Opens a watch; read events with [`Lines::next`].
    pub async fn watch(&self, path: &str) -> Lines {
        let resp = self.open(Method::GET, path, &[], "").await;
        assert_eq!(resp.status(), StatusCode::OK);
        Lines {
            body: resp.into_body(),
            buf: Vec::new(),
        }
    }
}

/// Newline-delimited JSON read from a streaming body.
pub struct Lines {
    body: Incoming,
    buf: Vec<u8>,
}

impl Lines {
    /// The next event, `None` when the stream ended; panics after [`WAIT`].
    pub async fn next(&mut self) -> Option<Value> {
        tokio::time::timeout(WAIT, self.next_inner())
            .await
            .expect("watch event in time")
    }

    async fn next_inner(&mut self) -> Option<Value> {
        loop {
            if let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=pos).collect();
                return Some(serde_json::from_slice(&line).unwrap());
            }
            match self.body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
                _ => return None,
            }
        }
    }
}

/// A fixture file as JSON.
pub fn fixture(rel: &str) -> Value {
    let path = format!("{}/fixtures/{rel}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap()
}

/// A fixture file's bytes, for answers compared byte for byte.
pub fn fixture_bytes(rel: &str) -> Vec<u8> {
    let path = format!("{}/fixtures/{rel}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A fixture's JSON lines.
pub fn fixture_lines(rel: &str) -> Vec<Value> {
    let path = format!("{}/fixtures/{rel}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The set of keys of a JSON object.
pub fn keys(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v
        .as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default();
    k.sort();
    k
}

pub fn configmap(name: &str, labels: Value) -> Value {
    serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": labels}, "data": {"k": "v"}})
}
