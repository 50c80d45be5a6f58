//! The `--cluster-name` and `--link` flags of `up` and `node`: this cluster's name and its
//! links to peer clusters (all-active federation, `worker::federation`), parsed and checked
//! at start, with errors that name the flag.

use anyhow::bail;

/// The federation settings (`--cluster-name`, `--link`), checked; `None` without links.
pub(super) fn federation(
    cluster_name: &str,
    link_specs: &[String],
) -> anyhow::Result<Option<worker::federation::FederationConfig>> {
    use worker::federation::{FederationConfig, LinkConfig, valid_name};
    if link_specs.is_empty() {
        return Ok(None);
    }
    if !valid_name(cluster_name) {
        bail!(
            "--cluster-name {:?}: 1 to 64 letters, digits, `_ . -`",
            cluster_name
        );
    }
    let mut links: Vec<LinkConfig> = Vec::new();
    for spec in link_specs {
        let (name, rest) = spec.split_once('=').ok_or_else(|| {
            anyhow::anyhow!("--link {spec:?}: expected NAME=URL[,token-file=PATH][,filter=FILTER]")
        })?;
        if !valid_name(name) {
            bail!("--link {spec:?}: the name {name:?} must be 1 to 64 letters, digits, `_ . -`");
        }
        if links.iter().any(|l| l.name == name) {
            bail!("--link {spec:?}: a second link named {name:?}");
        }
        // the filter takes the rest of the value, commas included
        let (head, filter) = match rest.split_once(",filter=") {
            Some((h, f)) => (h, Some(f)),
            None => (rest, None),
        };
        let mut parts = head.split(',');
        let url = parts.next().unwrap_or_default().to_string();
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            bail!("--link {spec:?}: {url:?} is not an http:// or https:// URL");
        }
        let mut token = None;
        for p in parts {
            match p.split_once('=') {
                Some(("token-file", path)) => {
                    let t = std::fs::read_to_string(path)
                        .map_err(|e| anyhow::anyhow!("--link {name}: reading {path}: {e}"))?;
                    token = Some(t.trim().to_string());
                }
                _ => bail!("--link {spec:?}: {p:?} is not token-file=PATH or filter=FILTER"),
            }
        }
        let filter = match filter {
            None => None,
            Some(f) => {
                use proto::v1::subscription::Filter;
                let filter = if f.trim_start().starts_with('{') {
                    Filter::Eventbridge(f.to_string())
                } else {
                    Filter::Text(f.to_string())
                };
                let s = proto::v1::Subscription {
                    filter: Some(filter),
                    ..Default::default()
                };
                let dnf = runtime::validate::filter(&s, &runtime::Limits::default())
                    .map_err(|e| anyhow::anyhow!("--link {name} filter: {e}"))?;
                Some(dnf)
            }
        };
        links.push(LinkConfig {
            name: name.to_string(),
            url,
            token,
            filter,
        });
    }
    Ok(Some(FederationConfig {
        cluster: cluster_name.to_string(),
        links,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_flags_are_checked_and_name_the_flag() {
        let specs = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(federation("eu", &[]).expect("no links").is_none());
        let f = federation(
            "eu",
            &specs(&["us=http://10.0.0.1:7700,filter=region = \"us\" && n in [1, 2]"]),
        )
        .expect("a link with a filter")
        .expect("links");
        assert_eq!(f.cluster, "eu");
        assert_eq!(f.links[0].url, "http://10.0.0.1:7700");
        assert!(f.links[0].filter.is_some() && f.links[0].token.is_none());
        let err = |cluster: &str, v: &[&str]| {
            federation(cluster, &specs(v))
                .expect_err("refused")
                .to_string()
        };
        assert!(err("e u", &["a=http://x"]).starts_with("--cluster-name"));
        assert!(err("eu", &["nourl"]).contains("expected NAME=URL"));
        assert!(err("eu", &["a=ftp://x"]).contains("is not an http://"));
        assert!(err("eu", &["a=http://x", "a=http://y"]).contains("a second link"));
        assert!(err("eu", &["a=http://x,bogus=1"]).contains("is not token-file"));
        assert!(err("eu", &["a=http://x,token-file=/nonexistent/t"]).contains("reading"));
        assert!(err("eu", &["a=http://x,filter=n >"]).contains("--link a filter"));
    }
}
