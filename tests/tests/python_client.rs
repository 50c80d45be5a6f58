//! The Python client (`clients/python`, issue 33): its check script drives every verb, sync
//! and asyncio, against a real `dissem up` with tokens; and its committed stubs must be what
//! `generate.sh` makes from `proto/` today (a stale stub would miss fields the node sends).
//!
//! Without python3, grpcio and grpcio-tools the tests say so and pass, unless
//! `DISSEM_REQUIRE_PYTHON` is set (CI installs them and sets it).

use std::path::{Path, PathBuf};
use std::time::Duration;

use tests::{run_to_end, start_up, temp_dir, token_create};

/// The grpcio-tools release the committed stubs were generated with.
const STUBS_GRPC_TOOLS: &str = "1.85.1";

fn python_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("repository root")
        .join("clients/python")
}

/// Runs `python3 args` with the package's source on its path; fails the test past `limit`.
fn python(args: &[&str], cwd: &Path, limit: Duration) -> (bool, String) {
    let mut cmd = std::process::Command::new("python3");
    cmd.args(args)
        .env("PYTHONPATH", python_dir())
        .current_dir(cwd);
    let (code, out, err) = run_to_end(cmd, limit);
    let text = format!("{out}{err}");
    assert!(
        code.is_some(),
        "python3 {args:?} did not finish within {limit:?}:\n{text}"
    );
    (code == Some(0), text)
}

#[test]
fn the_python_client_works_against_dissem_up() {
    if !tests::have_python_grpc() {
        return;
    }
    let dir = temp_dir("python-client");
    let auth = dir.join("auth.toml");
    let token = token_create(&auth, "ops", "ops", "admin");
    let auth = auth.display().to_string();
    // the dead-letter check pushes to a closed loopback port
    let mut up = start_up(&dir, &["--auth-file", &auth, "--allow-private-targets"]);
    let url = format!("http://{}", up.addr);
    let script = python_dir().join("tests/check_client.py");
    let script = script.display().to_string();
    let (ok, text) = python(&[&script, &url, &token], &dir, Duration::from_secs(120));
    up.kill();
    assert!(ok && text.trim_end().ends_with("ok"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_python_stubs_match_the_protos() {
    if !tests::have_python_grpc() {
        return;
    }
    let dir = temp_dir("python-stubs");
    let (ok, version) = python(
        &[
            "-c",
            "import grpc_tools, importlib.metadata as m; print(m.version('grpcio-tools'))",
        ],
        &dir,
        Duration::from_secs(60),
    );
    assert!(ok, "{version}");
    if version.trim() != STUBS_GRPC_TOOLS {
        // another release writes other version checks into the same stubs
        assert!(
            std::env::var_os("DISSEM_REQUIRE_PYTHON").is_none(),
            "DISSEM_REQUIRE_PYTHON is set but grpcio-tools is {} (the stubs are {STUBS_GRPC_TOOLS}'s)",
            version.trim()
        );
        eprintln!(
            "skipped: grpcio-tools {} is not {STUBS_GRPC_TOOLS}",
            version.trim()
        );
        return;
    }
    let generate = python_dir().join("generate.sh");
    let out = std::process::Command::new("bash")
        .arg(&generate)
        .arg(&dir)
        .output()
        .expect("generate.sh");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let committed = python_dir().join("dissem/v1");
    let fresh = dir.join("dissem/v1");
    let names = |d: &Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .expect("stub dir")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".py") || n.ends_with(".pyi"))
            .filter(|n| n != "__init__.py")
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        names(&committed),
        names(&fresh),
        "stub files (run clients/python/generate.sh)"
    );
    for n in names(&fresh) {
        let a = std::fs::read(committed.join(&n)).expect("committed stub");
        let b = std::fs::read(fresh.join(&n)).expect("fresh stub");
        assert!(a == b, "{n} is stale: run clients/python/generate.sh");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
