use super::*;

struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        for name in ["ca.crt", "agent.crt", "agent.key", "kubeconfig"] {
            std::fs::write(dir.path().join(name), b"x").unwrap();
        }
        Self { dir }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    fn yaml(&self, accounts: &str) -> String {
        format!(
            "agentId: dev-agent\n\
             gateway:\n  url: https://127.0.0.1:7443\n  caFile: {ca}\n  certFile: {crt}\n  keyFile: {key}\n\
             kubernetes:\n  accounts:\n{accounts}",
            ca = self.path("ca.crt"),
            crt = self.path("agent.crt"),
            key = self.path("agent.key"),
        )
    }

    fn account(&self, name: &str) -> String {
        format!(
            "    - name: {name}\n      kubeconfigFile: {}\n",
            self.path("kubeconfig")
        )
    }
}

#[test]
fn full_example_parses_with_defaults() {
    let f = Files::new();
    let yaml = f.yaml(&f.account("dev"));
    let c = Config::from_yaml_str(&yaml, "agent.yaml").unwrap();
    assert_eq!(c.agent_id, "dev-agent");
    assert_eq!(c.gateway.url, "https://127.0.0.1:7443");
    assert_eq!(c.reconnect, ReconnectConfig::default());
    assert_eq!(
        c.reconnect.initial_backoff_millis,
        DEFAULT_INITIAL_BACKOFF_MILLIS
    );
    assert_eq!(c.heartbeat_seconds, DEFAULT_HEARTBEAT_SECONDS);
    assert_eq!(c.kubernetes.accounts.len(), 1);
    assert_eq!(c.kubernetes.accounts[0].name, "dev");
    assert!(!c.kubernetes.accounts[0].service_account);
    assert_eq!(c.origin, "agent.yaml");
}

#[test]
fn explicit_values_override_defaults() {
    let f = Files::new();
    let yaml = format!(
        "{}reconnect:\n  initialBackoffMillis: 10\n  maxBackoffMillis: 20\n  moveSpreadMaxMillis: 0\nheartbeatSeconds: 5\n",
        f.yaml(&f.account("dev"))
    );
    let c = Config::from_yaml_str(&yaml, "agent.yaml").unwrap();
    assert_eq!(c.reconnect.initial(), Duration::from_millis(10));
    assert_eq!(c.reconnect.max(), Duration::from_millis(20));
    assert_eq!(c.reconnect.move_spread_max(), Duration::ZERO);
    assert_eq!(c.heartbeat_seconds, 5);
}

#[test]
fn unknown_key_is_named_with_origin() {
    let f = Files::new();
    let yaml = format!("{}heartbeatSecs: 5\n", f.yaml(&f.account("dev")));
    let err = Config::from_yaml_str(&yaml, "agent.yaml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("heartbeatSecs"), "{err}");
    assert!(err.contains("agent.yaml"), "{err}");

    let yaml = f.yaml(&format!("{}      namespace: x\n", f.account("dev")));
    let err = Config::from_yaml_str(&yaml, "agent.yaml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("namespace"), "{err}");
}

#[test]
fn missing_account_name() {
    let f = Files::new();
    let yaml = f.yaml(&format!("    - kubeconfigFile: {}\n", f.path("kubeconfig")));
    let err = Config::from_yaml_str(&yaml, "agent.yaml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("kubernetes.accounts[0].name"), "{err}");
    assert!(err.contains("required"), "{err}");
}

#[test]
fn both_kubeconfig_and_service_account() {
    let f = Files::new();
    let yaml = f.yaml(&format!("{}      serviceAccount: true\n", f.account("dev")));
    let err = Config::from_yaml_str(&yaml, "agent.yaml")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("kubernetes.accounts[0].kubeconfigFile"),
        "{err}"
    );
    assert!(err.contains("exactly one of"), "{err}");
}

#[test]
fn kubeconfig_secret_and_service_account_dir() {
    let f = Files::new();
    let parse = |account: &str| Config::from_yaml_str(&f.yaml(account), "agent.yaml");
    let c = parse(concat!(
        "    - name: dev\n",
        "      kubeconfigSecret: {namespace: spinlink, name: kc}\n",
        "      serviceAccountDir: /sa\n",
    ))
    .unwrap();
    let a = &c.kubernetes.accounts[0];
    assert_eq!(a.kubeconfig_secret.as_ref().unwrap().name, "kc");
    assert_eq!(a.service_account_dir.as_deref(), Some(Path::new("/sa")));
    for (account, named) in [
        (
            "    - name: dev
      kubeconfigSecret: {namespace: spinlink}
",
            "kubernetes.accounts[0].kubeconfigSecret.name",
        ),
        (
            "    - name: dev
      kubeconfigSecret: {namespace: s, name: k, keys: x}
",
            "keys",
        ),
        (
            "    - name: dev
      serviceAccount: true
      kubeconfigSecret: {namespace: s, name: k}
",
            "exactly one of",
        ),
    ] {
        let err = parse(account).unwrap_err().to_string();
        assert!(err.contains(named), "{account}: {err}");
    }
    let yaml = format!(
        "{}      serviceAccountDir: /sa
",
        f.account("dev")
    );
    let err = parse(&yaml).unwrap_err().to_string();
    assert!(
        err.contains("kubernetes.accounts[0].serviceAccountDir"),
        "{err}"
    );
}

#[test]
fn neither_kubeconfig_nor_service_account() {
    let f = Files::new();
    let err = Config::from_yaml_str(&f.yaml("    - name: dev\n"), "agent.yaml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("is required"), "{err}");
}

#[test]
fn service_account_alone_is_fine() {
    let f = Files::new();
    let yaml = f.yaml("    - name: dev\n      serviceAccount: true\n");
    assert!(Config::from_yaml_str(&yaml, "agent.yaml").is_ok());
}

#[test]
fn duplicate_account_names() {
    let f = Files::new();
    let yaml = f.yaml(&format!("{}{}", f.account("dev"), f.account("dev")));
    let err = Config::from_yaml_str(&yaml, "agent.yaml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("kubernetes.accounts[1].name"), "{err}");
    assert!(err.contains("duplicate"), "{err}");
}

#[test]
fn missing_files_are_named() {
    let f = Files::new();
    let yaml = f
        .yaml(&f.account("dev"))
        .replace(&f.path("ca.crt"), "/nonexistent/ca.crt");
    let err = Config::from_yaml_str(&yaml, "agent.yaml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("gateway.caFile"), "{err}");
    assert!(err.contains("/nonexistent/ca.crt"), "{err}");

    let yaml = f
        .yaml(&f.account("dev"))
        .replace(&f.path("kubeconfig"), "/nonexistent/kc");
    let err = Config::from_yaml_str(&yaml, "agent.yaml")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("kubernetes.accounts[0].kubeconfigFile"),
        "{err}"
    );
}

#[test]
fn missing_agent_id_and_url() {
    let f = Files::new();
    let yaml = f
        .yaml(&f.account("dev"))
        .replace("agentId: dev-agent\n", "");
    let err = Config::from_yaml_str(&yaml, "agent.yaml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("agentId"), "{err}");

    let yaml = f
        .yaml(&f.account("dev"))
        .replace("  url: https://127.0.0.1:7443\n", "");
    let err = Config::from_yaml_str(&yaml, "agent.yaml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("gateway.url"), "{err}");
}

#[test]
fn plaintext_needs_insecure() {
    let f = Files::new();
    let yaml = f
        .yaml(&f.account("dev"))
        .replace("https://127.0.0.1:7443", "http://127.0.0.1:7443");
    let err = Config::from_yaml_str(&yaml, "agent.yaml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("insecure"), "{err}");

    let yaml = yaml.replace("gateway:\n", "gateway:\n  insecure: true\n");
    assert!(Config::from_yaml_str(&yaml, "agent.yaml").is_ok());
}

#[test]
fn backoff_bounds_are_checked() {
    let f = Files::new();
    let yaml = format!(
        "{}reconnect:\n  initialBackoffMillis: 100\n  maxBackoffMillis: 10\n",
        f.yaml(&f.account("dev"))
    );
    let err = Config::from_yaml_str(&yaml, "agent.yaml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("reconnect.maxBackoffMillis"), "{err}");
}

#[test]
fn from_file_names_the_file() {
    let f = Files::new();
    let path = f.dir.path().join("agent.yaml");
    std::fs::write(&path, f.yaml(&f.account("dev")) + "bogus: 1\n").unwrap();
    let err = Config::from_file(&path).unwrap_err().to_string();
    assert!(err.contains(&path.display().to_string()), "{err}");
    assert!(err.contains("bogus"), "{err}");

    let err = Config::from_file(&f.dir.path().join("nope.yaml"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("nope.yaml"), "{err}");
}

#[test]
fn a_list_and_its_omit_list_together_are_refused() {
    let f = Files::new();
    for (keys, named) in [
        (
            "      kinds: [pods]\n      omitKinds: [secrets]\n",
            "kubernetes.accounts[0].omitKinds",
        ),
        (
            "      namespaces: [a]\n      omitNamespaces: [b]\n",
            "kubernetes.accounts[0].omitNamespaces",
        ),
    ] {
        let yaml = f.yaml(&format!("{}{keys}", f.account("dev")));
        let err = Config::from_yaml_str(&yaml, "agent.yaml")
            .unwrap_err()
            .to_string();
        assert!(err.contains(named), "{err}");
        assert!(err.contains("not both"), "{err}");
    }
    // Each alone is fine, and so are the kind forms and CRD entries.
    let yaml = f.yaml(&format!(
        "{}      kinds: [Deployment, configmaps, crontabs.stable.example.com]\n      \
         omitNamespaces: [kube-system]\n      customResourceDefinitions:\n      \
         - kind: CronTab.stable.example.com\n      - widgets.example.com\n",
        f.account("dev")
    ));
    let c = Config::from_yaml_str(&yaml, "agent.yaml").unwrap();
    let a = &c.kubernetes.accounts[0];
    assert_eq!(a.kinds.len(), 3);
    assert_eq!(
        a.custom_resource_definitions[1].name(),
        "widgets.example.com"
    );
}

#[test]
fn cache_and_budget_keys_parse_and_are_checked() {
    let f = Files::new();
    let yaml = format!(
        "{}cache:\n  unackedWindow: 7\n  pageSize: 3\ntasks:\n  totalBudget: 2\n  budgetPerAccount: 1\n",
        f.yaml(&f.account("dev"))
    );
    let c = Config::from_yaml_str(&yaml, "agent.yaml").unwrap();
    assert_eq!((c.cache.unacked_window, c.cache.page_size), (7, 3));
    assert_eq!((c.tasks.total_budget, c.tasks.budget_per_account), (2, 1));
    let yaml = format!("{}tasks:\n  totalBudget: 0\n", f.yaml(&f.account("dev")));
    let err = Config::from_yaml_str(&yaml, "agent.yaml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("tasks.totalBudget"), "{err}");
    let yaml = format!("{}cache:\n  windowSize: 3\n", f.yaml(&f.account("dev")));
    let err = Config::from_yaml_str(&yaml, "agent.yaml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("windowSize"), "{err}");
}

#[test]
fn impersonation_names_a_user_or_a_service_account() {
    let f = Files::new();
    let parse = |keys: &str| {
        let yaml = f.yaml(&format!("{}      impersonate:\n{keys}", f.account("dev")));
        Config::from_yaml_str(&yaml, "agent.yaml")
    };
    let c = parse("        serviceAccount: team-a/deployer\n        groups: [ops]\n").unwrap();
    let imp = c.kubernetes.accounts[0].impersonate.clone().unwrap();
    assert_eq!(
        imp.user_name().unwrap(),
        "system:serviceaccount:team-a:deployer"
    );
    assert_eq!(imp.groups, vec!["ops"]);
    for (keys, says) in [
        ("        user: a\n        serviceAccount: b/c\n", "not both"),
        ("        groups: [x]\n", "required"),
        ("        serviceAccount: nope\n", "namespace/name"),
        ("        user: \"bad\\nvalue\"\n", "header value"),
        ("        usr: a\n", "usr"),
    ] {
        let err = parse(keys).unwrap_err().to_string();
        assert!(err.contains(says), "{keys}: {err}");
        if says != "usr" {
            assert!(err.contains("kubernetes.accounts[0].impersonate"), "{err}");
        }
    }
}

#[test]
fn spinnaker_crd_mapping_keys_are_refused_by_name() {
    let f = Files::new();
    for (entry, named) in [
        (
            "      - kind: CronTab.stable.example.com\n        spinnakerKind: crontabs\n",
            "kubernetes.accounts[0].customResourceDefinitions[0].spinnakerKind",
        ),
        (
            "      - kind: CronTab.stable.example.com\n        versioned: true\n",
            "kubernetes.accounts[0].customResourceDefinitions[0].versioned",
        ),
        (
            "      - versioned: true\n",
            "kubernetes.accounts[0].customResourceDefinitions[0].versioned",
        ),
    ] {
        let yaml = f.yaml(&format!(
            "{}      customResourceDefinitions:\n{entry}",
            f.account("dev")
        ));
        let err = Config::from_yaml_str(&yaml, "agent.yaml")
            .unwrap_err()
            .to_string();
        assert!(err.contains(named), "{entry}: {err}");
    }
}

#[test]
fn reload_interval_parses_and_files_are_remembered() {
    let f = Files::new();
    let yaml = format!("{}reloadIntervalSeconds: 0\n", f.yaml(&f.account("dev")));
    let c = Config::from_yaml_str(&yaml, "agent.yaml").unwrap();
    assert_eq!(c.reload_interval_seconds, 0);
    assert_eq!(c.file, None);
    let path = f.dir.path().join("agent.yaml");
    std::fs::write(&path, &yaml).unwrap();
    let c = Config::from_file(&path).unwrap();
    assert_eq!(c.file.as_deref(), Some(path.as_path()));
}

#[test]
fn dynamic_accounts_allow_no_configured_account_in_infrastructure_mode_only() {
    let f = Files::new();
    let none = f.yaml("    []\n");
    let err = Config::from_yaml_str(&none, "agent.yaml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("kubernetes.accounts"), "{err}");
    let dynamic = format!("{none}dynamicAccounts: {{enabled: true, zone: eu-1}}\n");
    let c = Config::from_yaml_str(&dynamic, "agent.yaml").unwrap();
    assert!(c.dynamic_accounts.enabled);
    assert_eq!(c.dynamic_accounts.zone, "eu-1");

    let in_cluster = format!(
        "{}dynamicAccounts: {{enabled: true}}\n",
        f.yaml("    - name: dev\n      serviceAccount: true\n")
    );
    let err = Config::from_yaml_str(&in_cluster, "agent.yaml")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("kubernetes.accounts[0].serviceAccount") && err.contains("infrastructure"),
        "{err}"
    );
    let with_leader = format!(
        "{}dynamicAccounts: {{enabled: true}}\nleaderElection: {{enabled: true}}\n",
        f.yaml(&f.account("dev"))
    );
    let err = Config::from_yaml_str(&with_leader, "agent.yaml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("dynamicAccounts.enabled"), "{err}");
    let zone_alone = format!(
        "{}dynamicAccounts: {{zone: eu}}\n",
        f.yaml(&f.account("dev"))
    );
    let err = Config::from_yaml_str(&zone_alone, "agent.yaml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("dynamicAccounts.zone"), "{err}");
}

#[test]
fn an_inline_kubeconfig_is_a_source_and_is_never_printed() {
    let f = Files::new();
    let mut c = Config::from_yaml_str(&f.yaml(&f.account("dev")), "agent.yaml").unwrap();
    let mut assigned = AccountConfig {
        name: "assigned".into(),
        kubeconfig_inline: Some(InlineKubeconfig(std::sync::Arc::new(
            b"users: [{user: {token: s3cr3t-token}}]".to_vec(),
        ))),
        ..AccountConfig::default()
    };
    c.kubernetes.accounts.push(assigned.clone());
    c.validate().unwrap();
    let printed = format!("{c:?}");
    assert!(!printed.contains("s3cr3t"), "{printed}");
    // Exactly one source.
    assigned.service_account = true;
    c.kubernetes.accounts[1] = assigned;
    assert!(c.validate().is_err());
}
