//! The packaging in `deploy/` and the `Dockerfile` stay true to the binary: the Kubernetes
//! manifests pass the Kubernetes 1.31 schemas (`kubernetes-validate`, offline: the schemas
//! ship with the package; CI installs it), every `DISSEM_*` setting they and the systemd
//! environment files give is a flag of the command that reads it (a renamed flag fails here,
//! not in an operator's cluster), and the image is built in two stages and runs as a user
//! that is not root, with its data on a volume. And a process stops on SIGTERM (what systemd
//! and Kubernetes send) with exit 0, keeping what it acknowledged. And the Grafana dashboard
//! queries only metric families a running node serves.

use std::path::{Path, PathBuf};
use std::process::Command;

use tests::{dissem_bin, numbered_put, runtime, start_up, temp_dir, wait_for};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the repository")
        .to_path_buf()
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// `dissem <command> --help`.
fn help(command: &str) -> String {
    let out = Command::new(dissem_bin())
        .args([command, "--help"])
        .output()
        .expect("dissem runs");
    assert!(out.status.success(), "dissem {command} --help");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The `DISSEM_*` names set in `text` (as `name: DISSEM_X` in YAML or `DISSEM_X=` in an
/// environment file or Dockerfile).
fn settings(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let l = line.trim().trim_start_matches("- ");
        let name = l
            .strip_prefix("name: ")
            .or_else(|| l.strip_prefix("ENV "))
            .unwrap_or(l);
        let name: String = name
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if name.starts_with("DISSEM_") && !out.contains(&name) {
            out.push(name);
        }
    }
    out
}

#[test]
fn every_setting_in_the_packaging_is_a_flag_of_its_command() {
    for (file, command) in [
        ("deploy/k8s/coordinators.yaml", "coordinator"),
        ("deploy/k8s/nodes.yaml", "node"),
        ("deploy/systemd/coordinator.env", "coordinator"),
        ("deploy/systemd/node.env", "node"),
        ("Dockerfile", "up"),
    ] {
        let text = read(file);
        let known = help(command);
        let set = settings(&text);
        assert!(set.len() >= 2 || file == "Dockerfile", "{file}: {set:?}");
        for name in set {
            assert!(
                known.contains(&format!("env: {name}=")),
                "{file} sets {name}, which `dissem {command}` does not read"
            );
        }
    }
    // the units run the commands their environment files are for
    for (unit, command, env) in [
        (
            "dissem-coordinator.service",
            "coordinator",
            "coordinator.env",
        ),
        ("dissem-node.service", "node", "node.env"),
    ] {
        let text = read(&format!("deploy/systemd/{unit}"));
        assert!(
            text.contains(&format!("ExecStart=/usr/local/bin/dissem {command}\n")),
            "{unit}"
        );
        assert!(
            text.contains(&format!("EnvironmentFile=/etc/dissem/{env}")),
            "{unit}"
        );
        assert!(
            text.contains("User=dissem") && !text.contains("User=root"),
            "{unit}"
        );
    }
}

#[test]
fn the_image_is_built_in_two_stages_and_runs_as_a_user_with_a_data_volume() {
    let text = read("Dockerfile");
    let froms: Vec<&str> = text.lines().filter(|l| l.starts_with("FROM ")).collect();
    assert_eq!(
        froms.len(),
        2,
        "a build stage and a runtime stage: {froms:?}"
    );
    assert!(froms[0].ends_with(" AS build"), "{froms:?}");
    assert!(
        text.contains("COPY --from=build "),
        "only the binary crosses over"
    );
    let user = text
        .lines()
        .rfind(|l| l.starts_with("USER "))
        .expect("a USER line");
    assert!(
        !user.contains("root") && !user.starts_with("USER 0"),
        "runs as {user}"
    );
    assert!(
        text.contains("VOLUME [\"/var/lib/dissem\"]"),
        "a data volume"
    );
    assert!(
        !text.lines().any(|l| l.starts_with("ADD http")),
        "nothing fetched by URL"
    );
    let ignore = read(".dockerignore");
    assert!(
        ignore.lines().any(|l| l == "target"),
        "the build context skips target/"
    );
}

#[test]
fn the_kubernetes_manifests_pass_the_schemas() {
    let files: Vec<PathBuf> = std::fs::read_dir(root().join("deploy/k8s"))
        .expect("deploy/k8s")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    assert!(files.len() >= 3, "{files:?}");
    let installed = Command::new("python3")
        .args(["-c", "import kubernetes_validate"])
        .status()
        .is_ok_and(|s| s.success());
    if !installed {
        let required = std::env::var_os("DISSEM_REQUIRE_PYTHON").is_some();
        assert!(
            !required,
            "python3 -m kubernetes_validate is missing (pip install kubernetes-validate)"
        );
        eprintln!(
            "skipped: kubernetes-validate is not installed (pip install kubernetes-validate)"
        );
        return;
    }
    let out = Command::new("python3")
        .args(["-m", "kubernetes_validate"])
        .args(["--kubernetes-version", "1.31.0", "--strict"])
        .args(&files)
        .output()
        .expect("python3 runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    // every resource was checked, none skipped for an unknown kind
    let passed = text.matches(" passed for resource ").count();
    assert!(passed >= 7, "{passed} resources passed:\n{text}");
}

#[test]
fn sigterm_stops_a_node_with_exit_0_and_it_keeps_what_it_acknowledged() {
    let dir = temp_dir("sigterm");
    let mut up = start_up(&dir, &[]);
    let url = up.url();
    let rt = runtime();
    let id = rt.block_on(async {
        let mut c = proto::v1::ingest_client::IngestClient::new(tests::channel(&url));
        c.put(numbered_put("term", 1))
            .await
            .expect("put")
            .into_inner()
            .id
            .expect("an id")
    });
    up.signal("TERM");
    let status = rt.block_on(wait_for(
        "the process to end after SIGTERM",
        std::time::Duration::from_secs(15),
        || {
            let s = up.try_wait();
            async move { s }
        },
    ));
    assert!(status.success(), "exit status after SIGTERM: {status}");
    let again = start_up(&dir, &[]);
    let url = again.url();
    rt.block_on(async {
        let got = proto::v1::objects_client::ObjectsClient::new(tests::channel(&url))
            .get(proto::v1::GetObjectRequest { id: Some(id) })
            .await
            .expect("the acknowledged object after the restart");
        assert_eq!(got.into_inner().id, Some(id));
    });
    drop(again);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The metric families a dashboard query names (`dissem_*`, a histogram's `_bucket`, `_sum`
/// and `_count` series under their family's name).
fn families_in(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("dissem_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(&name)
            .to_string();
        out.push(family);
    }
    out
}

/// The Grafana dashboard (`deploy/grafana/dissem.json`) queries only metric families a
/// running `dissem up` serves on `/metrics`: with a federation link, a failing subscription
/// and a delivered object, every family the dashboard names appears (a renamed metric fails
/// here, not on an operator's screen).
#[test]
fn the_grafana_dashboard_queries_only_series_the_binary_serves() {
    let dash: serde_json::Value =
        serde_json::from_str(&read("deploy/grafana/dissem.json")).expect("dashboard JSON");
    let exprs: Vec<String> = dash["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(str::to_string))
        .collect();
    assert!(exprs.len() >= 10, "{exprs:?}");
    let dir = temp_dir("grafana");
    let metrics = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port");
    let metrics_arg = metrics.to_string();
    // the failing subscription pushes to a closed loopback port
    let mut up = start_up(
        &dir,
        &[
            "--metrics-listen",
            &metrics_arg,
            "--allow-private-targets",
            // the per-subscription panel needs the per-subscription series
            "--metrics-top-subscriptions",
            "10",
        ],
    );
    let url = format!("http://{}", up.addr);
    let served = runtime().block_on(async {
        let c = dissem_client::Client::connect(&url, None, None)
            .await
            .expect("connect");
        c.add_link(dissem_client::v1::AddLinkRequest {
            name: "peer".into(),
            peer: "http://127.0.0.1:1".into(),
            ..Default::default()
        })
        .await
        .expect("a link");
        let failing = dissem_client::v1::Subscription {
            filter: Some(dissem_client::v1::subscription::Filter::Text(
                "n >= 0".into(),
            )),
            target: Some(dissem_client::v1::Target {
                kind: Some(dissem_client::v1::target::Kind::Grpc(
                    "http://127.0.0.1:1".into(),
                )),
            }),
            ..Default::default()
        };
        c.subscribe(failing).await.expect("subscribe");
        c.subscribe(dissem_client::stream_subscription("n >= 0", "dash"))
            .await
            .expect("subscribe");
        let mut session = c.attach("dash").await.expect("attach");
        c.put(numbered_put("dash", 1)).await.expect("put");
        let d = tokio::time::timeout(std::time::Duration::from_secs(30), session.next())
            .await
            .expect("a delivery within 30 s")
            .expect("open")
            .expect("delivery");
        session.ack(&d.delivery_id).await.expect("ack");
        let scrape = || async {
            let (code, body) = tests::http(metrics, "GET", "/metrics", &[], "")
                .await
                .ok()?;
            let names: std::collections::HashSet<String> = body
                .lines()
                .filter(|l| !l.starts_with('#'))
                .flat_map(families_in)
                .collect();
            (code == 200).then_some(names)
        };
        // every family, once the failed push and the delivery are counted; else the last
        // scrape, for the message below
        let all = tests::try_wait_for(std::time::Duration::from_secs(30), || async {
            let names = scrape().await?;
            let all = exprs
                .iter()
                .flat_map(|e| families_in(e))
                .all(|f| names.contains(&f));
            all.then_some(names)
        })
        .await;
        match all {
            Some(names) => names,
            None => scrape().await.expect("/metrics"),
        }
    });
    up.kill();
    for e in &exprs {
        for f in families_in(e) {
            assert!(served.contains(&f), "{f} (in {e}) is not served");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
