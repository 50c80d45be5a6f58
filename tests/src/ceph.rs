//! A real single-machine Ceph for the object-store write-path test (`tests/ceph.rs`): one
//! monitor, one OSD on a memstore (RAM, no disk), one radosgw (S3 and its SNS topic API),
//! from Debian's packages (`ceph-mon`, `ceph-osd`, `radosgw`; the writer uses
//! `python3-boto3`). Every daemon runs in the foreground as this process's child, on free
//! loopback ports, with its files in one folder; all of them are killed when the value is
//! dropped, also when a test fails. Authentication inside Ceph is off (a throwaway cluster on
//! loopback); the S3 user's keys are the ones [`Ceph::start`] creates.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The S3 user's keys.
pub const ACCESS_KEY: &str = "dissem-test";
pub const SECRET_KEY: &str = "dissem-test-secret";

/// Whether this machine has what the test needs: Ceph's daemons and boto3.
pub fn have_ceph() -> bool {
    let bins = [
        "ceph-mon",
        "ceph-osd",
        "radosgw",
        "radosgw-admin",
        "monmaptool",
        "ceph",
    ];
    let found = bins.iter().all(|b| {
        Command::new("sh")
            .args(["-c", &format!("command -v {b}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    let boto = Command::new("python3")
        .args(["-c", "import boto3"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    found && boto
}

/// A running Ceph: its daemons (killed on drop) and radosgw's URL.
#[derive(Debug)]
pub struct Ceph {
    children: Vec<Child>,
    dir: PathBuf,
    /// radosgw's S3 endpoint, `http://127.0.0.1:PORT` (`https://localhost:PORT` over TLS).
    pub rgw: String,
}

impl Drop for Ceph {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs the command line `words` to its end (at most a minute); panics with its output
/// when it fails.
fn run(words: &[&str]) {
    let mut cmd = Command::new(words[0]);
    cmd.args(&words[1..]);
    let (code, out, err) = crate::run_to_end(cmd, Duration::from_secs(60));
    assert_eq!(code, Some(0), "{} failed:\n{out}\n{err}", words.join(" "));
}

impl Ceph {
    /// Starts a monitor, an OSD and a radosgw with their files under `dir`, waits until
    /// radosgw answers (at most a minute), and creates the S3 user. With `tls` (a
    /// certificate for `localhost` and its key, PEM files) radosgw speaks only HTTPS: Ceph
    /// accepts a topic whose push endpoint carries a password (Basic auth) only over a
    /// secure transport.
    pub fn start(dir: &Path, tls: Option<(&Path, &Path)>) -> Ceph {
        let dir = dir.join("ceph");
        for d in ["mon", "osd", "run", "log"] {
            std::fs::create_dir_all(dir.join(d)).expect("ceph folders");
        }
        let mon = crate::free_port();
        let rgw = crate::free_port();
        let fsid = uuid_v4();
        let d = dir.display();
        let frontend = match tls {
            None => format!("beast endpoint={rgw}"),
            Some((cert, key)) => format!(
                "beast ssl_endpoint={rgw} ssl_certificate={} ssl_private_key={}",
                cert.display(),
                key.display()
            ),
        };
        let conf = dir.join("ceph.conf");
        std::fs::write(
            &conf,
            format!(
                "[global]
fsid = {fsid}
mon host = v1:{mon}
auth cluster required = none
auth service required = none
auth client required = none
auth allow insecure global id reclaim = true
osd objectstore = memstore
memstore device bytes = 536870912
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
mon allow pool size one = true
osd crush chooseleaf type = 0
run dir = {d}/run
log file = {d}/log/$name.log
admin socket = {d}/run/$name.asok
pid file = {d}/run/$name.pid
mon data avail warn = 1
mon data avail crit = 0
ms bind ipv6 = false
[mon.a]
mon data = {d}/mon
[osd.0]
osd data = {d}/osd
[client.rgw.a]
rgw frontends = {frontend}
"
            ),
        )
        .expect("ceph.conf");
        let c = conf.display().to_string();
        let monmap = dir.join("monmap").display().to_string();
        run(&[
            "monmaptool",
            "--create",
            "--add",
            "a",
            &format!("v1:{mon}"),
            "--fsid",
            &fsid,
            &monmap,
        ]);
        run(&[
            "ceph-mon", "-c", &c, "--mkfs", "-i", "a", "--monmap", &monmap,
        ]);
        let mut ceph = Ceph {
            children: Vec::new(),
            dir: dir.clone(),
            rgw: match tls {
                None => format!("http://{rgw}"),
                Some(_) => format!("https://localhost:{}", rgw.port()),
            },
        };
        ceph.daemon("ceph-mon", &["-f", "-c", &c, "-i", "a"]);
        // the OSD's own uuid, the same in the monitor's map and on the OSD (an OSD made
        // without one was once refused by the monitor: 'wrong fsid')
        let osd_uuid = uuid_v4();
        run(&[
            "ceph",
            "-c",
            &c,
            "--connect-timeout",
            "30",
            "osd",
            "create",
            &osd_uuid,
        ]);
        run(&[
            "ceph-osd",
            "-c",
            &c,
            "-i",
            "0",
            "--mkfs",
            "--osd-uuid",
            &osd_uuid,
        ]);
        ceph.start_osd(&c);
        ceph.daemon("radosgw", &["-f", "-c", &c, "-n", "client.rgw.a"]);
        // radosgw answers once it has made its pools (about ten seconds)
        let deadline = Instant::now() + Duration::from_secs(90);
        while std::net::TcpStream::connect(rgw).is_err() {
            assert!(
                Instant::now() < deadline,
                "radosgw did not listen on {rgw} within 90 s (logs in {})",
                dir.join("log").display()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        run(&[
            "radosgw-admin",
            "-c",
            &c,
            "user",
            "create",
            "--uid",
            "tester",
            "--display-name",
            "tester",
            "--access-key",
            ACCESS_KEY,
            "--secret",
            SECRET_KEY,
        ]);
        ceph
    }

    /// Starts the OSD and waits until the monitor has it up. An OSD that started within
    /// milliseconds of its monitor has been seen to ask it with no cluster id yet ('wrong
    /// fsid') and give up: it is started again, up to three times.
    fn start_osd(&mut self, conf: &str) {
        for _ in 0..3 {
            self.daemon("ceph-osd", &["-f", "-c", conf, "-i", "0"]);
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                let out = Command::new("ceph")
                    .args(["-c", conf, "--connect-timeout", "5", "osd", "stat"])
                    .output();
                if out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("1 up")) {
                    return;
                }
                let osd = self.children.last_mut().expect("the OSD");
                if osd.try_wait().ok().flatten().is_some() {
                    break; // it gave up: again
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            if let Some(mut osd) = self.children.pop() {
                let _ = osd.kill();
                let _ = osd.wait();
            }
        }
        panic!(
            "the OSD did not come up in three tries (logs in {})",
            self.logs().display()
        );
    }

    /// Starts one daemon in the foreground, its output in the log folder.
    fn daemon(&mut self, bin: &str, args: &[&str]) {
        let log = std::fs::File::create(self.dir.join("log").join(format!("{bin}.out")))
            .expect("daemon log");
        let err = log.try_clone().expect("daemon log");
        let child = Command::new(bin)
            .args(args)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {bin}: {e}"));
        self.children.push(child);
    }

    /// The folder of the daemons' logs.
    pub fn logs(&self) -> PathBuf {
        self.dir.join("log")
    }
}

/// A random UUID (version 4) for the cluster's fsid.
fn uuid_v4() -> String {
    let a = runtime::random_u64();
    let b = runtime::random_u64();
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        ((b >> 48) & 0x3fff) | 0x8000,
        b & 0xffff_ffff_ffff
    )
}
