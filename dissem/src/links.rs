//! The `--cluster-name`, `--link`, `--standby` and `--promote-after` flags of `up` and
//! `node`: this cluster's name, its links to peer clusters and its active-passive role
//! (`worker::federation`), parsed and checked at start, with errors that name the flag.

use anyhow::bail;

/// The federation settings, checked; `None` without links and without `--standby`.
pub(super) fn federation(
    cluster_name: &str,
    link_specs: &[String],
    standby: bool,
    promote_after: Option<std::time::Duration>,
) -> anyhow::Result<Option<worker::federation::FederationConfig>> {
    use worker::federation::{
        DEFAULT_STANDBY_TTL, FederationConfig, LinkConfig, LinkMode, valid_name,
    };
    if promote_after.is_some() && !standby {
        bail!("--promote-after is for a standby: give --standby too");
    }
    if link_specs.is_empty() && !standby {
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
            anyhow::anyhow!(
                "--link {spec:?}: expected \
                 NAME=URL[,mode=MODE][,ttl=DUR][,token-file=PATH][,filter=FILTER]"
            )
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
        let mut mode = "all-active";
        let mut ttl = None;
        for p in parts {
            match p.split_once('=') {
                Some(("token-file", path)) => {
                    let t = std::fs::read_to_string(path)
                        .map_err(|e| anyhow::anyhow!("--link {name}: reading {path}: {e}"))?;
                    token = Some(t.trim().to_string());
                }
                Some(("mode", m @ ("all-active" | "active-passive" | "spillover"))) => mode = m,
                Some(("mode", m)) => bail!(
                    "--link {spec:?}: mode {m:?} is not all-active, active-passive or spillover"
                ),
                Some(("ttl", d)) => {
                    let ms = crate::client::parse_duration_ms(d)
                        .map_err(|e| anyhow::anyhow!("--link {name} ttl: {e}"))?;
                    if ms > 7 * 86_400_000 {
                        bail!("--link {name} ttl: {d:?} is over 7d (a peer keeps no longer)");
                    }
                    ttl = Some(std::time::Duration::from_millis(ms));
                }
                _ => bail!("--link {spec:?}: {p:?} is not mode=, ttl=, token-file= or filter="),
            }
        }
        let mode = match (mode, ttl) {
            ("active-passive", ttl) => LinkMode::ActivePassive {
                ttl: ttl.unwrap_or(DEFAULT_STANDBY_TTL),
            },
            ("spillover", ttl) => LinkMode::Spillover { ttl },
            (_, None) => LinkMode::AllActive,
            (_, Some(_)) => {
                bail!("--link {spec:?}: ttl= is for mode=active-passive or mode=spillover")
            }
        };
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
            mode,
        });
    }
    Ok(Some(FederationConfig {
        cluster: cluster_name.to_string(),
        links,
        standby,
        promote_after,
    }))
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
                .is_none()
        );
        let f = federation(
            "eu",
            &specs(&["us=http://10.0.0.1:7700,filter=region = \"us\" && n in [1, 2]"]),
            false,
            None,
        )
        .expect("a link with a filter")
        .expect("links");
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
                .expect("links")
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
        assert!(err("eu", &["a=http://x,ttl=5s"]).contains("ttl= is for"));
        assert!(err("eu", &["a=http://x,mode=active-passive,ttl=5"]).contains("needs a unit"));
        assert!(err("eu", &["a=http://x,mode=active-passive,ttl=8d"]).contains("over 7d"));
        let ap = federation(
            "eu",
            &specs(&["b=http://x,mode=active-passive,ttl=2s"]),
            false,
            None,
        )
        .expect("active-passive")
        .expect("links");
        assert_eq!(
            ap.links[0].mode,
            worker::federation::LinkMode::ActivePassive {
                ttl: std::time::Duration::from_secs(2)
            }
        );
        let standby = federation("us", &[], true, Some(std::time::Duration::from_secs(1)))
            .expect("a standby without links")
            .expect("settings");
        assert!(standby.standby && standby.links.is_empty());
        assert!(
            federation("us", &[], false, Some(std::time::Duration::from_secs(1)))
                .expect_err("promote-after alone")
                .to_string()
                .contains("give --standby")
        );
        assert!(err("eu", &["a=http://x,token-file=/nonexistent/t"]).contains("reading"));
        assert!(err("eu", &["a=http://x,filter=n >"]).contains("--link a filter"));
    }
}
