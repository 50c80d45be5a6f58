//! The configuration file: `--config FILE` (or `DISSEM_CONFIG`) names a TOML file with one
//! table per command, whose keys are that command's long flags:
//!
//! ```toml
//! [up]
//! listen = "127.0.0.1:7700"
//! data = "/var/lib/dissem"
//! allow-private-targets = true
//!
//! [node]
//! coordinator = "http://10.0.0.1:7600"
//! max-workers = 8
//! ```
//!
//! Links to peer clusters (`up` and `node`'s `--link`) have a table array of their own:
//!
//! ```toml
//! [[federation.link]]
//! name = "us"
//! peer = "http://us.example:7700"
//! mode = "all-active"            # the only mode built so far, and the default
//! token-file = "/etc/dissem/us.token"
//! filter = 'region = "us"'       # optional, either filter syntax
//! ```
//!
//! Precedence: a flag on the command line, then its environment variable, then the file, then
//! the default. The file's settings become flags before clap parses, so `--help` documents every
//! key and a bad key or value gets clap's error naming the flag.
//!
//! A flag has an environment variable only where `--help` shows one: every flag of the
//! server commands (`DISSEM_` + the flag in upper case with `_` for `-`, e.g.
//! `DISSEM_MAX_WORKERS`, given by [`with_env_names`]) and the client commands' connection
//! flags (`DISSEM_NODE_URL`, `DISSEM_TOKEN`, `DISSEM_TLS_CA`). A client command's own flags
//! have none, so `DISSEM_DATA` set for `dissem up` is not the bytes of a `dissem put`.

use std::ffi::OsString;

/// The environment variable of a flag.
pub fn env_var(flag: &str) -> String {
    format!("DISSEM_{}", flag.replace('-', "_").to_uppercase())
}

fn value_args(
    flag: &str,
    value: &toml::Value,
    path: &str,
    cmd: &str,
) -> Result<Vec<OsString>, String> {
    if let (true, toml::Value::Array(items)) = (REPEATED.contains(&flag), value) {
        // a repeatable flag: once per item
        let mut out = Vec::new();
        for v in items {
            out.extend(value_args(flag, v, path, cmd)?);
        }
        return Ok(out);
    }
    let s = match value {
        toml::Value::Boolean(true) => return Ok(vec![flag.into()]),
        toml::Value::Boolean(false) => return Ok(Vec::new()),
        toml::Value::String(s) => s.clone(),
        toml::Value::Integer(i) => i.to_string(),
        toml::Value::Float(f) => f.to_string(),
        toml::Value::Array(items) => items
            .iter()
            .map(|v| match v {
                toml::Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect::<Vec<_>>()
            .join(","),
        other => {
            return Err(format!(
                "config file {path}: [{cmd}] {flag} = {other}: use a string, number, boolean \
                 or list"
            ));
        }
    };
    Ok(vec![flag.into(), s.into()])
}

/// Flags given once per value (a list in the file repeats them).
const REPEATED: &[&str] = &["--link"];

/// The table of the links to peer clusters.
const FEDERATION: &str = "federation";
/// The commands that take `--link`.
const LINKED_COMMANDS: &[&str] = &["up", "node"];

/// The `[[federation.link]]` entries of the file as `--link` values.
fn federation_links(doc: &toml::Table, path: &str) -> Result<Vec<String>, String> {
    let Some(fed) = doc.get(FEDERATION) else {
        return Ok(Vec::new());
    };
    let err = |what: String| Err(format!("config file {path}: [federation] {what}"));
    let Some(fed) = fed.as_table() else {
        return err("must be a table holding [[federation.link]] entries".into());
    };
    let mut out = Vec::new();
    for (key, v) in fed {
        let Some(items) = v.as_array().filter(|_| key == "link") else {
            return err(format!(
                "has no setting `{key}`; links go in [[federation.link]]"
            ));
        };
        for (i, item) in items.iter().enumerate() {
            let Some(t) = item.as_table() else {
                return err(format!("link {i} is not a table"));
            };
            let text = |k: &str| t.get(k).and_then(|v| v.as_str());
            for k in t.keys() {
                if !["name", "peer", "mode", "ttl", "token-file", "filter"].contains(&k.as_str()) {
                    return err(format!(
                        "link {i} has no setting `{k}` (name, peer, mode, ttl, token-file, \
                         filter)"
                    ));
                }
            }
            let (Some(name), Some(peer)) = (text("name"), text("peer")) else {
                return err(format!("link {i} needs `name` and `peer` (strings)"));
            };
            let mut spec = format!("{name}={peer}");
            match text("mode") {
                None => {}
                Some(m @ ("all-active" | "active-passive" | "spillover")) => {
                    spec.push_str(&format!(",mode={m}"))
                }
                Some(m) => {
                    return err(format!(
                        "link {name}: mode {m:?} is not \"all-active\", \"active-passive\" or \
                         \"spillover\""
                    ));
                }
            }
            if let Some(d) = text("ttl") {
                spec.push_str(&format!(",ttl={d}"));
            }
            if let Some(f) = text("token-file") {
                spec.push_str(&format!(",token-file={f}"));
            }
            if let Some(f) = text("filter") {
                spec.push_str(&format!(",filter={f}"));
            }
            out.push(spec);
        }
    }
    Ok(out)
}

/// The commands whose every flag has an environment variable.
pub const SERVER_COMMANDS: &[&str] = &["up", "coordinator", "node"];

/// `root` with an environment variable named for every flag of the server commands that
/// has none yet (clap reads it and `--help` shows it).
pub fn with_env_names(mut root: clap::Command) -> clap::Command {
    for cmd in SERVER_COMMANDS {
        if root.find_subcommand(cmd).is_none() {
            continue;
        }
        root = root.mut_subcommand(cmd, |sub| {
            sub.mut_args(|a| match a.get_long() {
                Some(l) if a.get_env().is_none() && !a.is_global_set() && l != "help" => {
                    let var = env_var(l);
                    a.env(var)
                }
                _ => a,
            })
        });
    }
    root
}

/// `args` with the settings of the environment (`DISSEM_<FLAG>`) and of the config file (if
/// any) added as flags after the command, for the flags `root`'s subcommand has.
pub fn apply(args: Vec<OsString>, root: &clap::Command) -> Result<Vec<OsString>, String> {
    let mut path: Option<String> = std::env::var("DISSEM_CONFIG").ok();
    let mut rest = Vec::with_capacity(args.len());
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        let s = a.to_string_lossy().to_string();
        if s == "--config" {
            path = Some(
                it.next()
                    .ok_or("--config needs a file name")?
                    .to_string_lossy()
                    .to_string(),
            );
        } else if let Some(p) = s.strip_prefix("--config=") {
            path = Some(p.to_string());
        } else {
            rest.push(a);
        }
    }
    let doc: toml::Table = match &path {
        None => toml::Table::new(),
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("reading the config file {path}: {e}"))?;
            text.parse()
                .map_err(|e| format!("config file {path} is not valid TOML: {e}"))?
        }
    };
    let path = path.unwrap_or_default();
    let links = federation_links(&doc, &path)?;
    for (key, v) in &doc {
        if key == FEDERATION {
            continue;
        }
        if !v.is_table() {
            return Err(format!(
                "config file {path}: `{key}` is not a [command] table; put settings under \
                 [up], [node], [coordinator], ..."
            ));
        }
        if root.find_subcommand(key).is_none() {
            return Err(format!(
                "config file {path}: [{key}] is no dissem command; `dissem --help` lists them"
            ));
        }
    }
    // the command is the first argument that is not a flag
    let Some(cmd_at) = rest
        .iter()
        .skip(1)
        .position(|a| !a.to_string_lossy().starts_with('-'))
        .map(|i| i + 1)
    else {
        return Ok(rest);
    };
    let cmd = rest[cmd_at].to_string_lossy().to_string();
    let Some(sub) = root.find_subcommand(&cmd) else {
        return Ok(rest); // clap explains
    };
    // `dissem node drain`: a subcommand acts on a running process and takes none of the
    // table's settings (clap would refuse them beside it)
    if rest
        .get(cmd_at + 1)
        .is_some_and(|a| sub.find_subcommand(a.to_string_lossy().as_ref()).is_some())
    {
        return Ok(rest);
    }
    let flags: Vec<(String, Option<String>)> = sub
        .get_arguments()
        .filter(|a| !a.is_global_set())
        .filter_map(|a| {
            a.get_long().map(|l| {
                (
                    l.to_string(),
                    a.get_env().map(|e| e.to_string_lossy().to_string()),
                )
            })
        })
        .filter(|(l, _)| l != "config" && l != "log-json" && l != "help")
        .collect();
    let empty = toml::Table::new();
    let table = doc.get(&cmd).and_then(|t| t.as_table()).unwrap_or(&empty);
    for key in table.keys() {
        if !flags.iter().any(|(f, _)| f == key) {
            return Err(format!(
                "config file {path}: [{cmd}] has no setting `{key}`; `dissem {cmd} --help` \
                 lists them"
            ));
        }
    }
    let given: Vec<String> = rest
        .iter()
        .map(|a| a.to_string_lossy().to_string())
        .collect();
    let mut extra: Vec<OsString> = Vec::new();
    for (key, env) in &flags {
        let flag = format!("--{key}");
        if given
            .iter()
            .any(|g| *g == flag || g.starts_with(&format!("{flag}=")))
        {
            continue; // the command line wins
        }
        if env.as_ref().is_some_and(|e| std::env::var_os(e).is_some()) {
            continue; // clap reads the variable: it wins over the file
        }
        if let Some(v) = table.get(key) {
            extra.extend(value_args(&flag, v, &path, &cmd)?);
        } else if key == "link" && !links.is_empty() && LINKED_COMMANDS.contains(&cmd.as_str()) {
            for l in &links {
                extra.push(flag.clone().into());
                extra.push(l.into());
            }
        }
    }
    let mut out = rest;
    let tail = out.split_off(cmd_at + 1);
    out.extend(extra);
    out.extend(tail);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    fn root() -> clap::Command {
        clap::Command::new("dissem")
            .subcommand(
                clap::Command::new("up")
                    .arg(clap::Arg::new("listen").long("listen"))
                    .arg(
                        clap::Arg::new("link")
                            .long("link")
                            .action(clap::ArgAction::Append),
                    )
                    .arg(clap::Arg::new("max-workers").long("max-workers"))
                    .arg(clap::Arg::new("gpu").long("gpu"))
                    .arg(
                        clap::Arg::new("allow-private-targets")
                            .long("allow-private-targets")
                            .action(clap::ArgAction::SetTrue),
                    ),
            )
            .subcommand(
                clap::Command::new("node")
                    .arg(clap::Arg::new("node").long("node"))
                    .subcommand(clap::Command::new("drain")),
            )
    }

    #[test]
    fn a_subcommand_of_a_server_command_takes_none_of_its_settings() {
        let dir = std::env::temp_dir().join(format!("dissem-config-sub-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let f = dir.join("c.toml");
        std::fs::write(&f, "[node]\nnode = 9\n").expect("write");
        let config = f.to_string_lossy().to_string();
        let out = apply(
            args(&["dissem", "--config", &config, "node", "drain"]),
            &root(),
        )
        .expect("apply");
        assert_eq!(out, args(&["dissem", "node", "drain"]));
        // the server command itself still takes them
        let out = apply(args(&["dissem", "--config", &config, "node"]), &root()).expect("apply");
        assert!(out.contains(&OsString::from("--node")), "{out:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn file_settings_become_flags_and_the_command_line_wins() {
        let dir = std::env::temp_dir().join(format!("dissem-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let f = dir.join("c.toml");
        std::fs::write(
            &f,
            "[up]\nlisten = \"127.0.0.1:1\"\nmax-workers = 3\nallow-private-targets = true\n\
             gpu = \"off\"\n[node]\nnode = 9\n",
        )
        .expect("write");
        let out = apply(
            args(&[
                "dissem",
                "--config",
                f.to_str().expect("utf-8"),
                "up",
                "--listen",
                "127.0.0.1:2",
            ]),
            &root(),
        )
        .expect("applied");
        let out: Vec<String> = out.iter().map(|a| a.to_string_lossy().into()).collect();
        assert_eq!(out[0..2], ["dissem", "up"]);
        assert!(
            out.windows(2).any(|w| w == ["--max-workers", "3"]),
            "{out:?}"
        );
        assert!(out.contains(&"--allow-private-targets".to_string()));
        assert!(
            !out.contains(&"127.0.0.1:1".to_string()),
            "the command line wins"
        );
        assert!(
            !out.contains(&"--node".to_string()),
            "other commands' tables stay out"
        );
        let path = f.to_str().expect("utf-8");
        std::fs::write(&f, "listen = 1\n").expect("write");
        let e = apply(args(&["dissem", "--config", path, "up"]), &root()).expect_err("table");
        assert!(e.contains("[command] table"), "{e}");
        std::fs::write(&f, "[up]\nlisten_addr = 1\n").expect("write");
        let e = apply(args(&["dissem", "--config", path, "up"]), &root()).expect_err("key");
        assert!(
            e.contains("no setting `listen_addr`") && e.contains("up --help"),
            "{e}"
        );
        let e = apply(
            args(&["dissem", "--config", "/nonexistent/x.toml", "up"]),
            &root(),
        )
        .expect_err("missing file");
        assert!(e.contains("/nonexistent/x.toml"), "{e}");
    }

    #[test]
    fn federation_links_become_link_flags() {
        let dir = std::env::temp_dir().join(format!("dissem-config-fed-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let f = dir.join("c.toml");
        let run = |text: &str| {
            std::fs::write(&f, text).expect("write");
            apply(
                args(&["dissem", "--config", f.to_str().expect("utf-8"), "up"]),
                &root(),
            )
            .map(|v| {
                v.iter()
                    .map(|a| a.to_string_lossy().to_string())
                    .collect::<Vec<_>>()
            })
        };
        let out = run(
            "[[federation.link]]\nname = \"us\"\npeer = \"http://us:7700\"\n\
             token-file = \"/t\"\nfilter = 'region = \"us\"'\n\
             [[federation.link]]\nname = \"ap\"\npeer = \"http://ap:7700\"\n\
             mode = \"all-active\"\n",
        )
        .expect("links");
        let links: Vec<&String> = out
            .windows(2)
            .filter(|w| w[0] == "--link")
            .map(|w| &w[1])
            .collect();
        assert_eq!(
            links,
            [
                "us=http://us:7700,token-file=/t,filter=region = \"us\"",
                "ap=http://ap:7700,mode=all-active"
            ],
            "{out:?}"
        );
        let out = run("[up]\nlink = [\"a=http://a\", \"b=http://b\"]\n").expect("a list");
        assert_eq!(out.iter().filter(|a| *a == "--link").count(), 2, "{out:?}");
        let e = run("[[federation.link]]\nname = \"x\"\npeer = \"http://x\"\nmode = \"mirror\"\n")
            .expect_err("no such mode");
        assert!(e.contains("\"mirror\" is not"), "{e}");
        let out = run(
            "[[federation.link]]\nname = \"b\"\npeer = \"http://b:7700\"\nmode = \"spillover\"\n",
        )
        .expect("spillover");
        assert!(
            out.contains(&"b=http://b:7700,mode=spillover".to_string()),
            "{out:?}"
        );
        let out = run(
            "[[federation.link]]\nname = \"dr\"\npeer = \"http://dr:7700\"\n\
             mode = \"active-passive\"\nttl = \"2s\"\n",
        )
        .expect("active-passive");
        assert!(
            out.contains(&"dr=http://dr:7700,mode=active-passive,ttl=2s".to_string()),
            "{out:?}"
        );
        let e = run("[[federation.link]]\nname = \"x\"\n").expect_err("no peer");
        assert!(e.contains("needs `name` and `peer`"), "{e}");
        let e = run("[[federation.link]]\nname = \"x\"\npeer = \"http://x\"\nport = 1\n")
            .expect_err("unknown key");
        assert!(e.contains("has no setting `port`"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
