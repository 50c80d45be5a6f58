//! The README and the guides in `docs/` stay true to the binary: every `$D COMMAND ...` line
//! of their shell blocks names a command that exists, and every `--flag` on it is a flag of
//! that command (`dissem COMMAND --help` lists it); every link between them leads to a file.
//! A renamed flag or command fails here instead of in a newcomer's terminal.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use tests::dissem_bin;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the repository")
        .to_path_buf()
}

/// The README and every guide: (name, text).
fn documents() -> Vec<(String, String)> {
    let mut out = vec![(
        "README.md".to_string(),
        std::fs::read_to_string(root().join("README.md")).expect("README"),
    )];
    let mut guides: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    guides.sort();
    for p in guides {
        let text = std::fs::read_to_string(&p).expect("a guide");
        out.push((
            format!(
                "docs/{}",
                p.file_name().unwrap_or_default().to_string_lossy()
            ),
            text,
        ));
    }
    out
}

/// The lines of the `sh` blocks of `text`, continuation lines joined.
fn shell_lines(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_sh = false;
    let mut pending = String::new();
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with("```") {
            in_sh = !in_sh && t == "```sh";
            continue;
        }
        if !in_sh {
            continue;
        }
        if let Some(head) = t.strip_suffix('\\') {
            pending.push_str(head);
            pending.push(' ');
            continue;
        }
        pending.push_str(t);
        out.push(std::mem::take(&mut pending));
    }
    out
}

/// `dissem WORDS --help`, when that command exists.
fn help(cache: &mut HashMap<Vec<String>, Option<String>>, words: &[String]) -> Option<String> {
    cache
        .entry(words.to_vec())
        .or_insert_with(|| {
            let out = Command::new(dissem_bin())
                .args(words)
                .arg("--help")
                .output()
                .ok()?;
            out.status
                .success()
                .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
        })
        .clone()
}

#[test]
fn every_command_and_flag_in_the_docs_is_the_binarys() {
    let mut cache = HashMap::new();
    let mut wrong = Vec::new();
    let mut checked = 0;
    for (doc, text) in documents() {
        for line in shell_lines(&text) {
            // what one dissem command takes: up to a comment, a pipe or the next command
            let Some(at) = line.find("$D ") else { continue };
            let rest = &line[at + 3..];
            let end = ["#", "|", "&&", ";", ">", "&"]
                .iter()
                .filter_map(|s| rest.find(s))
                .min()
                .unwrap_or(rest.len());
            let tokens: Vec<&str> = rest[..end].split_whitespace().collect();
            let words: Vec<String> = tokens
                .iter()
                .take(2)
                .take_while(|w| {
                    w.chars().next().is_some_and(|c| c.is_ascii_lowercase())
                        && w.chars().all(|c| c.is_ascii_lowercase() || c == '-')
                })
                .map(|w| w.to_string())
                .collect();
            if words.is_empty() {
                continue;
            }
            // the longest prefix of the words that is a command (`grid resize`, `put`)
            let found = (1..=words.len())
                .rev()
                .find_map(|n| help(&mut cache, &words[..n]).map(|h| (n, h)));
            let Some((n, text)) = found else {
                wrong.push(format!("{doc}: no command `dissem {}`: {line}", words[0]));
                continue;
            };
            checked += 1;
            for t in &tokens[n..] {
                let Some(flag) = t.strip_prefix("--") else {
                    continue;
                };
                let name: String = flag
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                    .collect();
                if name.is_empty() || name == "help" {
                    continue;
                }
                if !text.contains(&format!("--{name}")) {
                    wrong.push(format!(
                        "{doc}: `dissem {}` has no --{name}: {line}",
                        words[..n].join(" ")
                    ));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    assert!(
        checked >= 30,
        "only {checked} command lines found in the docs"
    );
}

#[test]
fn every_link_between_the_docs_leads_to_a_file() {
    let mut broken = Vec::new();
    for (doc, text) in documents() {
        let base = root().join(doc.rsplit_once('/').map_or("", |(d, _)| d));
        let mut rest = text.as_str();
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let target = rest.split(')').next().unwrap_or_default();
            let path = target.split('#').next().unwrap_or_default();
            if path.is_empty() || path.contains("://") {
                continue;
            }
            if !base.join(path).exists() {
                broken.push(format!("{doc}: {target}"));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "links to nothing:\n{}",
        broken.join("\n")
    );
}
