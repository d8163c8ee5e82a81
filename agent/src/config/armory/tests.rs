use std::path::Path;

use super::super::*;
use super::SYSTEM_CA_BUNDLES;

/// A directory holding an Armory file, its override, and the files they name.
struct Dir {
    dir: tempfile::TempDir,
}

impl Dir {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "ca.pem",
            "agent.pem",
            "agent.key",
            "kubecfg-a.yaml",
            "kubecfg-b.yaml",
        ] {
            std::fs::write(dir.path().join(name), b"x").unwrap();
        }
        Self { dir }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    /// Writes `text` with `{dir}` replaced by the directory.
    fn write(&self, name: &str, text: &str) -> std::path::PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text.replace("{dir}", &self.path(""))).unwrap();
        path
    }

    fn load(&self, text: &str) -> Result<Loaded> {
        Config::load(&self.write("armory-agent.yml", text))
    }
}

fn warned(loaded: &Loaded) -> Vec<&str> {
    loaded.warnings.iter().map(|w| w.key.as_str()).collect()
}

/// Agent mode as Armory's documentation shows it: the agent in the target
/// cluster, its own service account, plaintext to Clouddriver.
const AGENT_MODE: &str = "\
clouddriver:
  grpc: spin-clouddriver-grpc.spinnaker:9091
kubernetes:
  accounts:
    - name: prod
      serviceAccount: true
      kinds: [replicaSet, service, ingress, daemonSet, deployment, pod, statefulSet, job, cronJob]
";

#[test]
fn agent_mode_maps_to_the_native_keys() {
    let d = Dir::new();
    let loaded = d.load(AGENT_MODE).unwrap();
    assert_eq!(loaded.format, Format::Armory { local: None });
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    let c = &loaded.config;
    // No TLS settings: plaintext, as Armory derives it.
    assert_eq!(c.gateway.url, "http://spin-clouddriver-grpc.spinnaker:9091");
    assert!(c.gateway.insecure);
    assert!(!c.agent_id.is_empty());
    let a = &c.kubernetes.accounts[0];
    assert_eq!(a.name, "prod");
    assert!(a.service_account);
    // Singular camelCase kind names become Kubernetes kind names, which
    // match the resources they name.
    assert_eq!(a.kinds[0], "ReplicaSet");
    assert_eq!(a.kinds[8], "CronJob");
    let filter = crate::kinds::KindFilter::of(a);
    let rs = crate::kinds::WatchedKind::new("apps", "v1", "replicasets", "ReplicaSet", true);
    let cm = crate::kinds::WatchedKind::new("", "v1", "configmaps", "ConfigMap", true);
    assert!(filter.wants(&rs));
    assert!(!filter.wants(&cm));
}

/// Infrastructure mode: many kubeconfigs (both of Armory's spellings), mTLS
/// with an encrypted key, budgets, backoff in nanoseconds, ports.
const INFRASTRUCTURE_MODE: &str = "\
clouddriver:
  grpc: agents.spinnaker.example.com:443
  tls:
    serverName: clouddriver-grpc
    cacertFile: {dir}ca.pem
    clientCertFile: {dir}agent.pem
    clientKeyFile: {dir}agent.key
    clientKeyFilePassword: s3cret-pass
  keepAliveHeartbeatSeconds: 15
  keepAliveTimeOutSeconds: 5
  backoff:
    baseDelay: 2000000000
    maxDelay: 60000000000
kubernetes:
  accounts:
    - name: a
      kubeConfigFile: {dir}kubecfg-a.yaml
      context: ctx-a
      namespaces: [team-a, team-b]
    - name: b
      kubeconfigFile: {dir}kubecfg-b.yaml
      omitKinds: [event]
      customResourceDefinitions:
        - kind: CronTab.stable.example.com
tasks:
  totalBudget: 20
  budgetPerAccount: 5
server:
  port: 8082
";

#[test]
fn infrastructure_mode_with_mtls_maps_every_key() {
    let d = Dir::new();
    let loaded = d.load(INFRASTRUCTURE_MODE).unwrap();
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    let c = &loaded.config;
    let gw = &c.gateway;
    // TLS settings and no `insecure`: TLS (Armory 1.0.47's derivation).
    assert_eq!(gw.url, "https://agents.spinnaker.example.com:443");
    assert!(!gw.insecure);
    assert_eq!(gw.server_name.as_deref(), Some("clouddriver-grpc"));
    assert_eq!(gw.ca_file.as_deref(), Some(Path::new(&d.path("ca.pem"))));
    assert_eq!(
        gw.cert_file.as_deref(),
        Some(Path::new(&d.path("agent.pem")))
    );
    assert_eq!(
        gw.key_file.as_deref(),
        Some(Path::new(&d.path("agent.key")))
    );
    assert_eq!(gw.key_password, Some(Password("s3cret-pass".into())));
    assert_eq!(gw.keepalive_interval_seconds, 15);
    assert_eq!(gw.keepalive_timeout_seconds, 5);
    assert_eq!(c.reconnect.initial_backoff_millis, 2_000);
    assert_eq!(c.reconnect.max_backoff_millis, 60_000);
    assert_eq!(c.tasks.total_budget, 20);
    assert_eq!(c.tasks.budget_per_account, 5);
    assert_eq!(c.admin.listen, Some("127.0.0.1:8082".parse().unwrap()));
    let [a, b] = &c.kubernetes.accounts[..] else {
        panic!("two accounts");
    };
    assert_eq!(
        a.kubeconfig_file.as_deref(),
        Some(Path::new(&d.path("kubecfg-a.yaml")))
    );
    assert_eq!(a.context.as_deref(), Some("ctx-a"));
    assert_eq!(a.namespaces, ["team-a", "team-b"]);
    assert_eq!(
        b.kubeconfig_file.as_deref(),
        Some(Path::new(&d.path("kubecfg-b.yaml")))
    );
    assert_eq!(b.omit_kinds, ["Event"]);
    assert_eq!(
        b.custom_resource_definitions[0].name(),
        "CronTab.stable.example.com"
    );
    // The password never shows in Debug output.
    assert!(!format!("{c:?}").contains("s3cret-pass"));
}

#[test]
fn keys_without_a_meaning_are_accepted_with_one_warning_each() {
    let d = Dir::new();
    let loaded = d
        .load(
            "\
clouddriver:
  grpc: localhost:9091
  auth:
    token: abc
  responseRetries:
    enabled: true
    maxRetries: 3
pprof:
  enabled: true
  port: 6060
hub:
  connection:
    grpc: agents.cloud.armory.io:443
logging:
  level: debug
  format: json
kubernetes:
  retries:
    enabled: true
  accounts:
    - name: a
      kubeconfigFile: {dir}kubecfg-a.yaml
      metrics: true
      permissions:
        READ: [dev]
        WRITE: [ops]
      maxResumableResourceAgeMs: 300000
      customResourceDefinitions:
        - kind: CronTab.stable.example.com
          scope: Namespaced
",
        )
        .unwrap();
    assert_eq!(
        warned(&loaded),
        [
            "clouddriver.auth",
            "clouddriver.responseRetries",
            "kubernetes.accounts[0].customResourceDefinitions[0].scope",
            "kubernetes.accounts[0].metrics",
            "kubernetes.accounts[0].permissions",
            "kubernetes.accounts[0].maxResumableResourceAgeMs",
            "kubernetes.retries",
            "pprof",
            "logging",
            "hub",
        ]
    );
    for w in &loaded.warnings {
        let text = w.to_string();
        // It names the file and says why.
        assert!(text.starts_with(&d.path("armory-agent.yml")), "{text}");
        assert!(text.contains("ignored: ") && w.reason.len() > 20, "{text}");
        // The token is never repeated.
        assert!(!text.contains("abc"), "{text}");
    }
    // The meaningful keys around them still apply.
    assert_eq!(loaded.config.gateway.url, "http://localhost:9091");
}

#[test]
fn an_account_block_copied_from_clouddriver_is_accepted() {
    // Armory: "If you are migrating accounts from Clouddriver, you can just
    // copy the same block of configuration here. Unused properties are
    // ignored."
    let d = Dir::new();
    let loaded = d
        .load(
            "\
kubernetes:
  accounts:
    - name: a
      kubeconfigFile: {dir}kubecfg-a.yaml
      providerVersion: V2
      requiredGroupMembership: []
      dockerRegistries: []
      configureImagePullSecrets: true
      cacheThreads: 1
      namespaces: []
      omitNamespaces: []
      kinds: []
      omitKinds: []
      customResources: []
      cachingPolicies: []
      onlySpinnakerManaged: false
      liveManifestCalls: true
",
        )
        .unwrap();
    let mut keys = warned(&loaded);
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "kubernetes.accounts[0].cacheThreads",
            "kubernetes.accounts[0].cachingPolicies",
            "kubernetes.accounts[0].configureImagePullSecrets",
            "kubernetes.accounts[0].customResources",
            "kubernetes.accounts[0].dockerRegistries",
            "kubernetes.accounts[0].liveManifestCalls",
            "kubernetes.accounts[0].onlySpinnakerManaged",
            "kubernetes.accounts[0].providerVersion",
            "kubernetes.accounts[0].requiredGroupMembership",
        ]
    );
    // Empty lists keep every namespace and kind, as in Clouddriver.
    let a = &loaded.config.kubernetes.accounts[0];
    assert!(a.namespaces.is_empty() && a.kinds.is_empty() && a.omit_kinds.is_empty());
}

#[test]
fn a_key_neither_format_knows_is_an_error_naming_it_and_the_file() {
    let d = Dir::new();
    for (text, key) in [
        ("clouddriver:\n  grcp: localhost:9091\n", "grcp"),
        ("prometheus:\n  enabled: true\n  path: /m\n", "path"),
        (
            "kubernetes:\n  accounts:\n    - name: a\n      kubeconfigFile: {dir}kubecfg-a.yaml\n      kindz: [pod]\n",
            "kindz",
        ),
        ("clouddriver: {}\nfrobnicate: true\n", "frobnicate"),
    ] {
        let err = d.load(text).unwrap_err().to_string();
        assert!(err.contains(key), "{err}");
        assert!(err.contains("armory-agent.yml"), "{err}");
    }
}

#[test]
fn refusals_name_the_armory_key() {
    let d = Dir::new();
    let cases = [
        // Both spellings at once.
        (
            "kubernetes:\n  accounts:\n    - name: a\n      kubeConfigFile: {dir}kubecfg-a.yaml\n      kubeconfigFile: {dir}kubecfg-b.yaml\n",
            "kubernetes.accounts[0].kubeConfigFile",
        ),
        (
            "clouddriver:\n  tls:\n    insecureSkipVerify: true\nkubernetes:\n  accounts:\n    - {name: a, serviceAccount: true}\n",
            "clouddriver.tls.insecureSkipVerify",
        ),
        // Native validation, reported under the key the operator wrote.
        (
            "clouddriver:\n  tls:\n    cacertFile: {dir}missing.pem\nkubernetes:\n  accounts:\n    - {name: a, serviceAccount: true}\n",
            "clouddriver.tls.cacertFile",
        ),
        (
            "kubernetes:\n  accounts:\n    - name: a\n      kubeConfigFile: {dir}missing.yaml\n",
            "kubernetes.accounts[0].kubeConfigFile",
        ),
        (
            "kubernetes:\n  accounts:\n    - name: a\n      kubeconfigFile: 'encryptedFile:vault!e:secret!n:kubernetes!k:a'\n",
            "kubernetes.accounts[0].kubeconfigFile",
        ),
        // One format per file.
        (
            "agentId: x\nclouddriver:\n  grpc: localhost:9091\n",
            "clouddriver",
        ),
    ];
    for (text, key) in cases {
        let err = d.load(text).unwrap_err().to_string();
        assert!(err.contains(key), "{key}: {err}");
        assert!(err.contains("armory-agent.yml"), "{err}");
    }
}

#[test]
fn a_key_password_is_never_quoted() {
    let d = Dir::new();
    let tls = |password: &str| {
        format!(
            "clouddriver:\n  grpc: gw:443\n  tls:\n    cacertFile: {{dir}}ca.pem\n    \
             clientCertFile: {{dir}}agent.pem\n    clientKeyFilePassword: {password}\n\
             kubernetes:\n  accounts:\n    - {{name: a, serviceAccount: true}}\n"
        )
    };
    // A password YAML reads as a number is the text it was written as.
    let loaded = d.load(&tls("9876543210")).unwrap();
    assert_eq!(
        loaded.config.gateway.key_password,
        Some(Password("9876543210".into()))
    );
    // The key is read from the certificate file when clientKeyFile is unset.
    assert_eq!(
        loaded.config.gateway.key_file,
        loaded.config.gateway.cert_file
    );
    // One of the wrong shape is refused without being repeated.
    let err = d.load(&tls("[hunter2-secret]")).unwrap_err().to_string();
    assert!(err.contains("password must be a string"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");
}

#[test]
fn without_a_ca_file_the_system_bundle_verifies_the_gateway() {
    let d = Dir::new();
    let result = d.load(
        "clouddriver:\n  grpc: gw.example.com:443\n  insecure: false\n\
         kubernetes:\n  accounts:\n    - {name: a, serviceAccount: true}\n",
    );
    let system = std::env::var_os("SSL_CERT_FILE")
        .map(std::path::PathBuf::from)
        .into_iter()
        .chain(SYSTEM_CA_BUNDLES.iter().map(std::path::PathBuf::from))
        .find(|p| p.is_file());
    match system {
        Some(bundle) => {
            let c = result.unwrap().config;
            assert_eq!(c.gateway.url, "https://gw.example.com:443");
            assert_eq!(c.gateway.ca_file, Some(bundle));
        }
        None => {
            let err = result.unwrap_err().to_string();
            assert!(err.contains("clouddriver.tls.cacertFile"), "{err}");
        }
    }
}

#[test]
fn the_local_override_is_read_on_top() {
    let d = Dir::new();
    d.write(
        "armory-agent-local.yaml",
        "\
clouddriver:
  grpc: other-gateway:9091
kubernetes:
  accounts:
    - name: b
      kubeconfigFile: {dir}kubecfg-b.yaml
    - name: c
      kubeconfigFile: {dir}kubecfg-a.yaml
",
    );
    let loaded = d
        .load(
            "\
clouddriver:
  grpc: localhost:9091
  keepAliveHeartbeatSeconds: 7
kubernetes:
  accounts:
    - name: a
      kubeconfigFile: {dir}kubecfg-a.yaml
",
        )
        .unwrap();
    assert_eq!(
        loaded.format,
        Format::Armory {
            local: Some(d.dir.path().join("armory-agent-local.yaml"))
        }
    );
    let c = &loaded.config;
    // A scalar of the override wins; the keys beside it stay.
    assert_eq!(c.gateway.url, "http://other-gateway:9091");
    assert_eq!(c.gateway.keepalive_interval_seconds, 7);
    // A list of the override replaces the main file's.
    let names: Vec<&str> = c
        .kubernetes
        .accounts
        .iter()
        .map(|a| a.name.as_str())
        .collect();
    assert_eq!(names, ["b", "c"]);
    // An error in the override names the override.
    d.write("armory-agent-local.yaml", "kubernetes:\n  acounts: []\n");
    let err = Config::load(&d.dir.path().join("armory-agent.yml"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("armory-agent-local.yaml") && err.contains("acounts"),
        "{err}"
    );
}

#[test]
fn a_native_file_is_still_native_and_ignores_an_armory_override() {
    let d = Dir::new();
    d.write(
        "armory-agent-local.yaml",
        "clouddriver:\n  grpc: elsewhere:1\n",
    );
    let loaded = d
        .load(
            "agentId: a1\ngateway:\n  url: http://localhost:9091\n  insecure: true\n\
             kubernetes:\n  accounts:\n    - name: a\n      kubeconfigFile: {dir}kubecfg-a.yaml\n",
        )
        .unwrap();
    assert_eq!(loaded.format, Format::Native);
    assert_eq!(loaded.config.gateway.url, "http://localhost:9091");
    // And a native file still refuses Armory's keys.
    let err = d
        .load("agentId: a1\nclouddriver:\n  grpc: x:1\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("clouddriver"), "{err}");
}

#[test]
fn the_native_file_it_converts_to_loads_as_the_same_configuration() {
    let d = Dir::new();
    for text in [AGENT_MODE, INFRASTRUCTURE_MODE] {
        let path = d.write("armory-agent.yml", text);
        let sources = Sources::read(&path).unwrap();
        let armory = sources.load().unwrap().config;
        let converted = sources.armory_to_native().unwrap().unwrap();
        let yaml = serde_norway::to_string(&converted.native).unwrap();
        // The output is a native file: no Armory key is left in it.
        assert!(!yaml.contains("clouddriver:"), "{yaml}");
        let native_path = d.write("native.yaml", &yaml);
        let native = Config::load(&native_path).unwrap();
        assert_eq!(native.format, Format::Native);
        let mut native = native.config;
        native.origin = armory.origin.clone();
        native.file = armory.file.clone();
        assert_eq!(native, armory, "{yaml}");
    }
}

#[test]
fn fuzz_armory_files() {
    spinlink_fuzzing::Fuzz::new("agent-armory-config")
        .seeds([
            AGENT_MODE.to_owned(),
            INFRASTRUCTURE_MODE.to_owned(),
            format!("{AGENT_MODE}\n---local\nkubernetes:\n  accounts: []\nclouddriver: {{grpc: x:1}}\n"),
            "pprof: {enabled: true}\nhub: {auth: {token: t}}\nserver: {port: 1}\nprometheus: {enabled: true}\n"
                .to_owned(),
        ])
        .run(armory::fuzz_armory_file);
}
