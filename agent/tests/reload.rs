//! Hot reload of the configuration file, against the fake gateway: accounts
//! are added, removed and changed on the running connection without touching
//! the others, through the atomic `..data` symlink swap a mounted ConfigMap
//! does; a bad new file is refused and the running configuration stays.

mod common;

fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

use std::path::{Path, PathBuf};

use common::{FakeGateway, WAIT, write_plain_kubeconfig};
use spinlink_agent::{AccountState, Agent, AgentState, Config};
use tokio_util::sync::CancellationToken;

const DEAD_CLUSTER: &str = "http://127.0.0.1:9";

/// A directory laid out as the kubelet mounts a ConfigMap:
/// `agent.yaml -> ..data/agent.yaml`, `..data -> ..<version>`.
struct Mounted {
    dir: PathBuf,
    version: u32,
}

impl Mounted {
    fn new(dir: &Path, text: &str) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let mut m = Mounted {
            dir: dir.to_owned(),
            version: 0,
        };
        m.swap(text);
        std::os::unix::fs::symlink("..data/agent.yaml", dir.join("agent.yaml")).unwrap();
        m
    }

    fn path(&self) -> PathBuf {
        self.dir.join("agent.yaml")
    }

    /// Writes a new version and swaps `..data` to it atomically (rename).
    fn swap(&mut self, text: &str) {
        self.version += 1;
        let version = format!("..2026_v{}", self.version);
        std::fs::create_dir(self.dir.join(&version)).unwrap();
        std::fs::write(self.dir.join(&version).join("agent.yaml"), text).unwrap();
        let tmp = self.dir.join("..data_tmp");
        std::os::unix::fs::symlink(&version, &tmp).unwrap();
        std::fs::rename(&tmp, self.dir.join("..data")).unwrap();
    }
}

async fn wait_state(
    state: &mut tokio::sync::watch::Receiver<AgentState>,
    what: &str,
    f: impl FnMut(&AgentState) -> bool,
) {
    tokio::time::timeout(WAIT, state.wait_for(f))
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
        .unwrap();
}

fn streams_of(gw: &FakeGateway, account: &str) -> usize {
    gw.with(|r| {
        r.streams
            .iter()
            .filter(|s| s.account.as_deref() == Some(account))
            .count()
    })
}

#[tokio::test]
async fn accounts_are_added_removed_and_changed_live() {
    init_logs();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let gw = FakeGateway::start(dir).await;
    let kc =
        |name: &str| write_plain_kubeconfig(&dir.join(format!("{name}.kubeconfig")), DEAD_CLUSTER);
    let (dev, other, third) = (kc("dev"), kc("other"), kc("third"));
    let yaml = |accounts: &[(&str, &Path)], extra: &str| {
        format!(
            "reloadIntervalSeconds: 1\n{}{extra}",
            gw.agent_yaml(accounts)
        )
    };
    let mut mount = Mounted::new(
        &dir.join("config"),
        &yaml(&[("dev", &dev), ("other", &other)], ""),
    );
    let agent = Agent::new(Config::from_file(&mount.path()).unwrap()).unwrap();
    let mut state = agent.state();
    let metrics = agent.metrics();
    let stop = CancellationToken::new();
    let task = tokio::spawn(agent.run(stop.clone()));
    gw.wait_for("four streams", |r| r.streams.len() >= 4).await;
    let connections = gw.with(|r| r.hellos.len());

    // dev removed, third added, other unchanged.
    mount.swap(&yaml(&[("other", &other), ("third", &third)], ""));
    wait_state(&mut state, "third to stream and dev to go", |s| {
        s.accounts.get("third") == Some(&AccountState::Streaming) && !s.accounts.contains_key("dev")
    })
    .await;
    gw.wait_for("third's streams", |r| r.streams.len() >= 6)
        .await;
    assert_eq!(streams_of(&gw, "other"), 2, "other was not touched");
    assert_eq!(streams_of(&gw, "third"), 2);
    gw.with(|r| {
        // Same connection; the new Hello asked for third only.
        assert!(r.hellos.iter().all(|(c, _)| *c == r.hellos[0].0));
        let (_, last) = r.hellos.last().unwrap();
        let names: Vec<&str> = last.accounts.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, ["third"]);
        assert_eq!(r.hellos.len(), connections + 1);
    });

    // A bad file is refused; nothing changes.
    mount.swap(&yaml(&[("other", &other)], "bogusKey: 1\n"));
    let refused = "spinlink_agent_config_reloads_total{result=\"refused\"} 1";
    tokio::time::timeout(WAIT, async {
        while !metrics.encode().contains(refused) {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the bad file is refused");
    assert!(state.borrow().accounts.contains_key("third"));
    assert_eq!(gw.with(|r| r.streams.len()), 6);

    // A changed account restarts its own streams, and only its own.
    mount.swap(&yaml(&[("other", &other), ("third", &third)], "").replace(
        "    - name: third\n",
        "    - name: third\n      namespaces: [team-a]\n",
    ));
    gw.wait_for("third's new streams", |r| r.streams.len() >= 8)
        .await;
    assert_eq!(
        streams_of(&gw, "third"),
        4,
        "{:#?}",
        gw.with(|r| r.streams.clone())
    );
    assert_eq!(streams_of(&gw, "other"), 2);
    let text = metrics.encode();
    assert!(
        text.contains("spinlink_agent_config_reloads_total{result=\"applied\"} 2"),
        "{text}"
    );

    // A kubeconfig rewritten in place (rotated credentials; a mounted Secret
    // swaps it atomically) restarts its account, and only it, with the
    // configuration file unchanged.
    let rotated = dir.join("other.kubeconfig.new");
    write_plain_kubeconfig(&rotated, "http://127.0.0.1:10");
    std::fs::rename(&rotated, &other).unwrap();
    gw.wait_for("other's new streams", |r| r.streams.len() >= 10)
        .await;
    assert_eq!(streams_of(&gw, "other"), 4);
    assert_eq!(streams_of(&gw, "third"), 4);
    gw.with(|r| {
        let (_, last) = r.hellos.last().unwrap();
        let names: Vec<&str> = last.accounts.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, ["other"]);
        assert_eq!(last.accounts[0].api_server, "http://127.0.0.1:10/");
    });
    let text = metrics.encode();
    assert!(
        text.contains("spinlink_agent_config_reloads_total{result=\"applied\"} 3"),
        "{text}"
    );

    stop.cancel();
    tokio::time::timeout(WAIT, task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    gw.stop().await;
}
