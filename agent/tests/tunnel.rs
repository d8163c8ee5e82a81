//! The agent against a fake gateway, with clusters that cannot be reached:
//! Hello, stream opening and metadata, refusals, token renewal, reconnects.

mod common;

use std::time::Duration;

use common::{FakeGateway, write_plain_kubeconfig};
use spinlink_agent::{AccountState, Agent, Config};
use spinlink_proto::v1::{self, cache_down, cache_up, relay_down, relay_up};
use tokio_util::sync::CancellationToken;

/// A port nothing listens on: the cluster is unreachable.
const DEAD_CLUSTER: &str = "http://127.0.0.1:9";

struct Running {
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<spinlink_agent::Result<()>>,
    state: tokio::sync::watch::Receiver<spinlink_agent::AgentState>,
}

fn start_agent(yaml: &str) -> Running {
    let config = Config::from_yaml_str(yaml, "test.yaml").unwrap();
    let agent = Agent::new(config).unwrap();
    let state = agent.state();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(agent.run(shutdown.clone()));
    Running {
        shutdown,
        task,
        state,
    }
}

impl Running {
    async fn stop(self) {
        self.shutdown.cancel();
        let result = tokio::time::timeout(common::WAIT, self.task).await;
        result.expect("agent stops").unwrap().unwrap();
    }
}

/// A relayed `GET /api/v1/namespaces`, request `id`.
fn list_namespaces(id: u64) -> v1::RelayDown {
    v1::RelayDown {
        msg: Some(relay_down::Msg::Head(v1::RequestHead {
            id,
            method: "GET".into(),
            path: "/api/v1/namespaces".into(),
            end_stream: true,
            ..Default::default()
        })),
    }
}

/// An agent serving `dev` and `other` (both clusters unreachable) through a
/// fake gateway that refuses `other`.
async fn dev_and_refused_other() -> (tempfile::TempDir, FakeGateway, Running) {
    let dir = tempfile::tempdir().unwrap();
    let gw = FakeGateway::start(dir.path()).await;
    gw.refuse("other");
    let dev = write_plain_kubeconfig(&dir.path().join("dev.kubeconfig"), DEAD_CLUSTER);
    let other = write_plain_kubeconfig(&dir.path().join("other.kubeconfig"), DEAD_CLUSTER);
    let agent = start_agent(&gw.agent_yaml(&[("dev", &dev), ("other", &other)]));
    (dir, gw, agent)
}

#[tokio::test]
async fn hello_streams_metadata_and_refusal() {
    let (_dir, gw, mut agent) = dev_and_refused_other().await;

    gw.wait_for("both streams of dev", |r| r.streams.len() >= 2)
        .await;
    gw.wait_for("open on both streams", |r| {
        !r.cache_up.is_empty() && !r.relay_up.is_empty()
    })
    .await;

    gw.with(|r| {
        let (_, hello) = &r.hellos[0];
        assert_eq!(hello.agent_id, "a1");
        assert_eq!(hello.agent_version, env!("CARGO_PKG_VERSION"));
        let names: Vec<_> = hello.accounts.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, vec!["dev", "other"]);
        let dev = &hello.accounts[0];
        assert!(
            dev.api_server.starts_with("http://127.0.0.1:9"),
            "{}",
            dev.api_server
        );
        // Kinds come from discovery, which an unreachable cluster has none of.
        assert!(dev.kinds.is_empty(), "{:?}", dev.kinds);

        for s in &r.streams {
            assert_eq!(s.account.as_deref(), Some("dev"), "{s:?}");
            assert!(s.token_valid, "token bound to the connection: {s:?}");
        }
        let methods: Vec<_> = r.streams.iter().map(|s| s.method).collect();
        assert!(methods.contains(&"cache") && methods.contains(&"relay"));
        assert!(r.bad_first.is_empty(), "{:?}", r.bad_first);
        let (account, first) = &r.cache_up[0];
        assert_eq!(account, "dev");
        // Numbering starts from the process start time, so a restarted agent
        // keeps counting upwards.
        assert!(first.seq > 1_000_000_000_000_000, "{}", first.seq);
        let Some(cache_up::Msg::Open(open)) = &first.msg else {
            panic!("first cache message {first:?}")
        };
        assert_eq!(
            (open.account.as_str(), open.agent_id.as_str()),
            ("dev", "a1")
        );
        let Some(relay_up::Msg::Open(open)) = &r.relay_up[0].1.msg else {
            panic!("first relay message")
        };
        assert_eq!(open.account, "dev");
    });

    // The refused account retried Hello, alone, and never opened a stream.
    gw.wait_for("a Hello retry for the refused account", |r| {
        r.hellos
            .iter()
            .skip(1)
            .any(|(_, h)| h.accounts.iter().any(|a| a.name == "other"))
    })
    .await;
    gw.with(|r| {
        assert!(
            r.streams
                .iter()
                .all(|s| s.account.as_deref() != Some("other"))
        );
        let retry = &r.hellos[1].1;
        assert_eq!(retry.accounts.len(), 1);
    });
    let state = agent
        .state
        .wait_for(|s| s.connected && s.accounts.contains_key("other"))
        .await
        .unwrap()
        .clone();
    assert_eq!(
        state.accounts.get("other"),
        Some(&AccountState::Refused("not yours".into()))
    );
    assert!(matches!(
        state.accounts.get("dev"),
        Some(AccountState::Streaming)
    ));

    // Heartbeats arrive, with sequence numbers increasing by one.
    gw.wait_for("a heartbeat", |r| {
        r.cache_up
            .iter()
            .any(|(_, m)| matches!(m.msg, Some(cache_up::Msg::Heartbeat(_))))
    })
    .await;
    gw.with(|r| {
        let seqs: Vec<u64> = r.cache_up.iter().map(|(_, m)| m.seq).collect();
        let expected: Vec<u64> = (seqs[0]..seqs[0] + seqs.len() as u64).collect();
        assert_eq!(seqs, expected);
    });

    // A relayed request against an unreachable cluster fails with 502.
    gw.relay_down("dev", list_namespaces(41)).await;
    gw.wait_for("relay error 502", |r| {
        r.relay_up.iter().any(|(_, m)| {
            matches!(&m.msg, Some(relay_up::Msg::Error(e)) if e.id == 41 && e.status == 502)
        })
    })
    .await;

    agent.stop().await;
    gw.stop().await;
}

/// A new connection's first `Hello` turned away for the identity's rate is
/// asked again on that connection: the agent once dropped it and dialled
/// anew, a handshake per refusal against the same bound.
#[tokio::test]
async fn a_first_hello_refused_for_the_rate_is_asked_again_on_its_connection() {
    let dir = tempfile::tempdir().unwrap();
    let gw = FakeGateway::start(dir.path()).await;
    gw.exceed_hello_rate(true);
    let dev = write_plain_kubeconfig(&dir.path().join("dev.kubeconfig"), DEAD_CLUSTER);
    let agent = start_agent(&gw.agent_yaml(&[("dev", &dev)]));
    gw.wait_for("three Hellos refused for the rate", |r| {
        r.rate_refused.len() >= 3
    })
    .await;
    gw.exceed_hello_rate(false);
    gw.wait_for("a Hello answered and dev's streams open", |r| {
        !r.hellos.is_empty() && r.streams.len() >= 2
    })
    .await;
    gw.with(|r| {
        let first = r.rate_refused[0];
        assert!(
            r.rate_refused.iter().all(|c| *c == first),
            "a refused Hello made the agent dial anew: {:?}",
            r.rate_refused
        );
        assert!(
            r.hellos.iter().all(|(c, _)| *c == first) && r.streams.iter().all(|s| s.conn == first),
            "the answered Hello and the streams came on the refused connection"
        );
    });
    agent.stop().await;
    gw.stop().await;
}

/// The gateway bounds Hellos per identity, and a restarted agent's Hellos
/// count against the same bound as its refused accounts' retries: a retry
/// refused for the rate must leave the connection, and the account streams
/// it carries, as they are (it once ended the connection, and every account
/// went offline until the agent had reconnected).
#[tokio::test]
async fn a_retry_refused_for_the_hello_rate_keeps_the_connection() {
    let (_dir, gw, agent) = dev_and_refused_other().await;
    gw.wait_for("both streams of dev", |r| r.streams.len() >= 2)
        .await;

    gw.exceed_hello_rate(true);
    gw.wait_for("three retries refused for the rate", |r| {
        r.rate_refused.len() >= 3
    })
    .await;
    gw.exceed_hello_rate(false);
    let hellos = gw.with(|r| r.hellos.len());
    gw.wait_for("a retry answered again", |r| r.hellos.len() > hellos)
        .await;
    gw.with(|r| {
        let first = r.hellos[0].0;
        assert!(
            r.rate_refused.iter().all(|c| *c == first),
            "every retry came on the first connection: {:?}",
            r.rate_refused
        );
        assert!(
            r.hellos.iter().all(|(c, _)| *c == first),
            "no Hello from a new connection"
        );
        assert!(
            r.streams.iter().all(|s| s.conn == first) && r.streams.len() == 2,
            "dev's two streams stayed open, none reopened: {:?}",
            r.streams
        );
    });
    assert!(matches!(
        agent.state.borrow().accounts.get("dev"),
        Some(AccountState::Streaming)
    ));
    agent.stop().await;
    gw.stop().await;
}

#[tokio::test]
async fn short_lived_tokens_are_renewed_without_dropping_streams() {
    let dir = tempfile::tempdir().unwrap();
    let gw = FakeGateway::start(dir.path()).await;
    gw.token_ttl(2);
    let dev = write_plain_kubeconfig(&dir.path().join("dev.kubeconfig"), DEAD_CLUSTER);
    let agent = start_agent(&gw.agent_yaml(&[("dev", &dev)]));
    gw.wait_for("both streams", |r| r.streams.len() >= 2).await;
    // Renewals every ~1.3 s: four Hellos take a few TTLs.
    gw.wait_for("three renewals", |r| r.hellos.len() >= 4).await;
    gw.with(|r| {
        // All on the first connection, which never dropped a stream.
        assert!(r.hellos.iter().all(|(c, _)| *c == r.hellos[0].0));
        assert_eq!(r.streams.len(), 2, "{:?}", r.streams);
        assert!(r.streams.iter().all(|s| s.token_valid));
    });
    agent.stop().await;
    gw.stop().await;
}

#[tokio::test]
async fn streams_opened_after_a_renewal_use_the_new_token() {
    use spinlink_agent::connection::{connect, session::Session, stream_request};
    let dir = tempfile::tempdir().unwrap();
    let gw = FakeGateway::start(dir.path()).await;
    gw.token_ttl(3);
    let dev = write_plain_kubeconfig(&dir.path().join("dev.kubeconfig"), DEAD_CLUSTER);
    let config =
        spinlink_agent::Config::from_yaml_str(&gw.agent_yaml(&[("dev", &dev)]), "agent.yaml")
            .unwrap();
    let client = connect(&config.gateway).await.unwrap();
    let info = v1::AccountInfo {
        name: "dev".into(),
        ..Default::default()
    };
    let session = Session::new(client, "a1".into(), vec![info]);
    let grant = session.hello(&[]).await.unwrap().granted[0].clone();
    let renew_at = session.renew_at().expect("an expiring token");
    tokio::time::sleep_until(renew_at).await;
    assert_eq!(session.renew().await.unwrap(), 1);
    // Past the first token's expiry (and before the renewed one is due):
    // only the renewed one is still good.
    let unix_now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    };
    while unix_now() < grant.expires_at_unix {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let first = grant.token;
    let token = session.token("dev").await.unwrap();
    assert_ne!(token, first);
    let open = v1::RelayUp {
        msg: Some(v1::relay_up::Msg::Open(v1::RelayOpen {
            account: "dev".into(),
            agent_id: "a1".into(),
        })),
    };
    let request = stream_request(futures::stream::iter([open]), "dev", &token).unwrap();
    let _ = session.client().relay(request).await;
    gw.with(|r| {
        assert_eq!(r.hellos.len(), 2, "no Hello beyond the renewal");
        let stream = r.streams.last().expect("the relay stream");
        assert_eq!(stream.token.as_deref(), Some(token.as_str()));
        assert!(stream.token_valid);
    });
    gw.stop().await;
}

#[tokio::test]
async fn reconnects_when_the_gateway_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let gw = FakeGateway::start(dir.path()).await;
    let addr = gw.addr;
    let dev = write_plain_kubeconfig(&dir.path().join("dev.kubeconfig"), DEAD_CLUSTER);
    let mut agent = start_agent(&gw.agent_yaml(&[("dev", &dev)]));
    gw.wait_for("streams", |r| r.streams.len() >= 2).await;
    agent.state.wait_for(|s| s.connected).await.unwrap();
    // Two heartbeats after open; the first is acknowledged, the second not.
    gw.wait_for("two heartbeats", |r| r.cache_up.len() >= 3)
        .await;
    let (open_before, acked, unacked) = gw.with(|r| {
        let seq = |i: usize| r.cache_up[i].1.seq;
        (seq(0), seq(1), seq(2))
    });
    gw.cache_down(v1::CacheDown {
        msg: Some(cache_down::Msg::Ack(v1::Ack { seq: acked })),
    })
    .await;
    // The ack is read before the connection goes (it is the next message).
    gw.wait_for("a heartbeat after the ack", |r| r.cache_up.len() >= 5)
        .await;

    gw.stop().await;
    agent.state.wait_for(|s| !s.connected).await.unwrap();

    let gw = FakeGateway::start_on(dir.path(), addr).await;
    gw.wait_for("streams again", |r| r.streams.len() >= 2).await;
    agent.state.wait_for(|s| s.connected).await.unwrap();
    gw.wait_for("open on the new cache stream", |r| !r.cache_up.is_empty())
        .await;
    gw.with(|r| {
        assert!(r.streams.iter().all(|s| s.token_valid));
        let (_, open) = &r.cache_up[0];
        assert!(matches!(open.msg, Some(cache_up::Msg::Open(_))));
        // `open` carries the last acknowledged number, and the window is
        // replayed after it: nothing unacknowledged is lost, nothing
        // acknowledged is sent again.
        assert_eq!(open.seq, acked);
        assert!(open.seq > open_before);
        let seqs: Vec<u64> = r.cache_up.iter().map(|(_, m)| m.seq).collect();
        assert_eq!(seqs[1], unacked, "{seqs:?}");
        let expected: Vec<u64> = (seqs[0]..seqs[0] + seqs.len() as u64).collect();
        assert_eq!(seqs, expected);
    });
    agent.stop().await;
    gw.stop().await;
}

#[tokio::test]
async fn a_moved_relay_stream_answers_until_the_sidecar_ends_it() {
    // The gateway asks the agent to move: the account's relay stream opens on
    // the new connection, then the old one says `RelayDrain`. A request the
    // sidecar sent on the old stream before it switched may still be on its
    // way, so the agent serves the old stream until the sidecar ends it,
    // however quiet it is meanwhile.
    let dir = tempfile::tempdir().unwrap();
    let gw = FakeGateway::start(dir.path()).await;
    gw.serve_control();
    let dev = write_plain_kubeconfig(&dir.path().join("dev.kubeconfig"), DEAD_CLUSTER);
    let agent = start_agent(&gw.agent_yaml(&[("dev", &dev)]));
    let on = |stream: usize, what: fn(&relay_up::Msg) -> bool| {
        move |r: &common::Records| {
            r.relay_up_on
                .iter()
                .any(|(a, s, m)| a == "dev" && *s == stream && m.msg.as_ref().is_some_and(what))
        }
    };
    let open: fn(&relay_up::Msg) -> bool = |m| matches!(m, relay_up::Msg::Open(_));
    let drain: fn(&relay_up::Msg) -> bool = |m| matches!(m, relay_up::Msg::Drain(_));
    gw.wait_for("the first relay stream", on(0, open)).await;

    gw.reconnect(Duration::from_secs(30)).await;
    gw.wait_for("the relay stream on the new connection", on(1, open))
        .await;
    gw.wait_for("RelayDrain on the old stream", on(0, drain))
        .await;
    // Three times longer than the quiet period after which agents used to
    // end a drained stream by themselves.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        gw.with(|r| r.relay_ended.is_empty()),
        "the agent ended a relay stream the sidecar had not"
    );

    // The request that was on its way is answered on the old stream (an
    // unreachable cluster: 502).
    gw.relay_down_on("dev", 0, list_namespaces(77))
        .await
        .unwrap();
    let answered: fn(&relay_up::Msg) -> bool =
        |m| matches!(m, relay_up::Msg::Error(e) if e.id == 77 && e.status == 502);
    gw.wait_for(
        "the late request's answer on the old stream",
        on(0, answered),
    )
    .await;

    // The sidecar ends the old stream: the agent ends its side, and the
    // new stream goes on.
    gw.end_relay("dev", 0);
    gw.wait_for("the agent to end the old stream", |r| {
        r.relay_ended.contains(&("dev".to_owned(), 0))
    })
    .await;
    assert!(gw.with(|r| !r.relay_ended.contains(&("dev".to_owned(), 1))));
    agent.stop().await;
    gw.stop().await;
}
