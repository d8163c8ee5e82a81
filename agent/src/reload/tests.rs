use super::*;

fn names(config: &Config) -> Vec<&str> {
    config
        .kubernetes
        .accounts
        .iter()
        .map(|a| a.name.as_str())
        .collect()
}

#[test]
fn an_armory_file_reloads_when_its_override_changes() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubecfg.yaml");
    std::fs::write(&kubeconfig, b"x").unwrap();
    let main = dir.path().join("armory-agent.yml");
    let account = |name: &str| {
        format!(
            "    - name: {name}\n      kubeconfigFile: {}\n",
            kubeconfig.display()
        )
    };
    std::fs::write(
        &main,
        format!(
            "clouddriver:\n  grpc: localhost:9091\nkubernetes:\n  accounts:\n{}",
            account("a")
        ),
    )
    .unwrap();
    let mut watcher = ConfigWatcher::new(main.clone(), Duration::from_secs(1), Metrics::new());
    assert!(watcher.check().is_none(), "nothing changed yet");

    // The override appears: its account list is the one served.
    let local = dir.path().join("armory-agent-local.yaml");
    std::fs::write(
        &local,
        format!("kubernetes:\n  accounts:\n{}{}", account("a"), account("b")),
    )
    .unwrap();
    let config = watcher.check().expect("the override is a change");
    assert_eq!(names(&config), ["a", "b"]);
    assert!(watcher.check().is_none());

    // It changes again: an account goes.
    std::fs::write(
        &local,
        format!("kubernetes:\n  accounts:\n{}", account("b")),
    )
    .unwrap();
    let config = watcher.check().expect("a changed override is a change");
    assert_eq!(names(&config), ["b"]);

    // A broken override is refused; the running configuration stays.
    std::fs::write(&local, "kubernetes:\n  acounts: []\n").unwrap();
    assert!(watcher.check().is_none());
}
