//! The `--cluster-name`, `--link`, `--standby` and `--promote-after` flags of `up` and
//! `node`: this cluster's name, its links to peer clusters and its active-passive role
//! (`worker::federation`), parsed and checked at start, with errors that name the flag.

use anyhow::bail;

/// The federation settings, checked. Every node has them (links may be added at run time
/// with `dissem link add`), so the cluster name is checked even without links.
pub(super) fn federation(
    cluster_name: &str,
    link_specs: &[String],
    standby: bool,
    promote_after: Option<std::time::Duration>,
) -> anyhow::Result<worker::federation::FederationConfig> {
    use worker::federation::{FederationConfig, LinkConfig, link_from_request, valid_name};
    if promote_after.is_some() && !standby {
        bail!("--promote-after is for a standby: give --standby too");
    }
    if !valid_name(cluster_name) {
        bail!(
            "--cluster-name {:?}: 1 to 64 letters, digits, `_ . -`",
            cluster_name
        );
    }
    let mut links: Vec<LinkConfig> = Vec::new();
    for spec in link_specs {
        let r = link_request(spec)?;
        if links.iter().any(|l| l.name == r.name) {
            bail!("--link {spec:?}: a second link named {:?}", r.name);
        }
        let l = link_from_request(&r).map_err(|e| anyhow::anyhow!("--link {}: {e}", r.name))?;
        links.push(l);
    }
    Ok(FederationConfig {
        cluster: cluster_name.to_string(),
        links,
        standby,
        promote_after,
    })
}

/// One `--link NAME=URL[,mode=MODE][,ttl=DUR][,token-file=PATH][,filter=FILTER]` as the
/// request `dissem link add` sends (the token read from its file).
pub(super) fn link_request(spec: &str) -> anyhow::Result<proto::v1::AddLinkRequest> {
    let (name, rest) = spec.split_once('=').ok_or_else(|| {
        anyhow::anyhow!(
            "--link {spec:?}: expected \
             NAME=URL[,mode=MODE][,ttl=DUR][,token-file=PATH][,filter=FILTER]"
        )
    })?;
    // the filter takes the rest of the value, commas included
    let (head, filter) = match rest.split_once(",filter=") {
        Some((h, f)) => (h, f),
        None => (rest, ""),
    };
    let mut parts = head.split(',');
    let mut r = proto::v1::AddLinkRequest {
        name: name.to_string(),
        peer: parts.next().unwrap_or_default().to_string(),
        filter: filter.to_string(),
        ..Default::default()
    };
    for p in parts {
        match p.split_once('=') {
            Some(("token-file", path)) => r.token = read_token(path)?,
            Some(("mode", m)) => r.mode = m.to_string(),
            Some(("ttl", d)) => {
                r.ttl_ms = crate::client::parse_duration_ms(d)
                    .map_err(|e| anyhow::anyhow!("--link {name} ttl: {e}"))?;
            }
            _ => bail!("--link {spec:?}: {p:?} is not mode=, ttl=, token-file= or filter="),
        }
    }
    Ok(r)
}

/// A token from its file (trimmed).
pub(super) fn read_token(path: &str) -> anyhow::Result<String> {
    let t = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("reading the token file {path}: {e}"))?;
    Ok(t.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_flags_are_checked_and_name_the_flag() {
        let specs = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(
            federation("eu", &[], false, None)
                .expect("no links")
                .links
                .is_empty()
        );
        let f = federation(
            "eu",
            &specs(&["us=http://10.0.0.1:7700,filter=region = \"us\" && n in [1, 2]"]),
            false,
            None,
        )
        .expect("a link with a filter");
        assert_eq!(f.cluster, "eu");
        assert_eq!(f.links[0].url, "http://10.0.0.1:7700");
        assert!(f.links[0].filter.is_some() && f.links[0].token.is_none());
        let err = |cluster: &str, v: &[&str]| {
            federation(cluster, &specs(v), false, None)
                .expect_err("refused")
                .to_string()
        };
        assert!(err("e u", &["a=http://x"]).starts_with("--cluster-name"));
        assert!(err("eu", &["nourl"]).contains("expected NAME=URL"));
        assert!(err("eu", &["a=ftp://x"]).contains("is not an http://"));
        assert!(err("eu", &["a=http://x", "a=http://y"]).contains("a second link"));
        assert!(err("eu", &["a=http://x,bogus=1"]).contains("is not mode="));
        assert!(err("eu", &["a=http://x,mode=mirror"]).contains("is not all-active"));
        assert!(err("eu", &["a=http://x,mode=spillover,ttl=0s"]).contains("out of range"));
        let spill = |v: &str| {
            federation("eu", &specs(&[v]), false, None)
                .expect("spillover")
                .links[0]
                .mode
        };
        use worker::federation::LinkMode;
        assert_eq!(
            spill("b=http://x,mode=spillover"),
            LinkMode::Spillover { ttl: None }
        );
        assert_eq!(
            spill("b=http://x,mode=spillover,ttl=3s"),
            LinkMode::Spillover {
                ttl: Some(std::time::Duration::from_secs(3))
            }
        );
        assert!(err("eu", &["a=http://x,ttl=5s"]).contains("a ttl is for"));
        assert!(err("eu", &["a=http://x,mode=active-passive,ttl=5"]).contains("needs a unit"));
        assert!(err("eu", &["a=http://x,mode=active-passive,ttl=8d"]).contains("over 7 days"));
        let ap = federation(
            "eu",
            &specs(&["b=http://x,mode=active-passive,ttl=2s"]),
            false,
            None,
        )
        .expect("active-passive");
        assert_eq!(
            ap.links[0].mode,
            worker::federation::LinkMode::ActivePassive {
                ttl: std::time::Duration::from_secs(2)
            }
        );
        let standby = federation("us", &[], true, Some(std::time::Duration::from_secs(1)))
            .expect("a standby without links");
        assert!(standby.standby && standby.links.is_empty());
        assert!(
            federation("us", &[], false, Some(std::time::Duration::from_secs(1)))
                .expect_err("promote-after alone")
                .to_string()
                .contains("give --standby")
        );
        assert!(err("eu", &["a=http://x,token-file=/nonexistent/t"]).contains("reading"));
        assert!(err("eu", &["a=http://x,filter=n >"]).contains("--link a: filter"));
    }
}
